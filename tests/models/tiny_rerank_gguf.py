"""A tiny random-weight BERT cross-encoder as a GGUF file, and a numpy forward pass of it.

``build(path)`` writes the model: llama.cpp's ``bert`` architecture with rank pooling,
non-causal attention and a one-label classification head (``cls.output``), the same
layout ``convert_hf_to_gguf.py`` gives a ``BertForSequenceClassification`` reranker
(which drops the pooler's dense+tanh, so there is no ``cls`` tensor). Its WordPiece vocab
is stored the way that converter stores one: word-initial pieces carry the phantom space
``▁``, ``##`` continuations lose their ``##``, and the five special tokens stay as they are.
Every weight is float32 and drawn from a fixed seed, so the file is byte-for-byte the
same on every run.

``Reference`` scores a (query, document) pair with the same weights the way llama-server
does at the pinned commit: ``[CLS] query [SEP] document [SEP]`` (``add_bos``/``add_eos``
with the separator as EOS, no extra separator), every token type 0 (llama.cpp hard-codes
"sentence A"), the hidden state of the first token through ``cls.output``, and the raw
logit as the score (no sigmoid). ggml computes GELU (tanh form) through a float16 lookup
table on the CPU; the reference does the same, so the scores usually agree to float32
rounding (~1e-6). Not always: when llama-server's float32 sum and the reference's float64
put a GELU input on opposite sides of a float16 rounding boundary, the two read
neighbouring table entries, and a score moves by up to a few 1e-4. The tokenizer follows
llama.cpp's WPM tokenizer; it is checked against llama-server on ASCII text with accents.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
from numpy.typing import NDArray

Array = NDArray[np.float32]

SEED = 20250611
STD = 0.2
N_EMBD = 32
N_HEAD = 4
N_LAYER = 2
N_FF = 4 * N_EMBD
N_CTX_TRAIN = 256
N_TOKEN_TYPES = 2
NORM_EPS = 1e-12

PHANTOM_SPACE = "\u2581"
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID = range(len(SPECIAL_TOKENS))
LETTERS = tuple("abcdefghijklmnopqrstuvwxyz")
PUNCTUATION = (".", ",", "?", "!", "'", "-")
WORDS = (
    "the", "an", "of", "and", "to", "in", "on", "is", "are", "was", "it", "for",
    "with", "what", "which", "who", "where", "how", "why", "capital", "city", "country",
    "france", "paris", "germany", "berlin", "river", "seine", "cat", "dog", "mat", "sat",
    "fish", "sea", "boat", "sail", "weather", "rain", "sun", "sky", "blue", "green", "tree",
    "forest", "bread", "bake", "oven", "music", "piano", "play", "book", "read", "python",
    "snake", "code", "language", "train", "car", "fast", "slow", "moon", "night", "house",
    "water", "fire", "food", "eat", "run", "walk", "song", "sing", "school", "learn", "apple",
    "orange", "milk", "coffee", "tea", "star", "word", "light",
)  # fmt: skip
SUFFIXES = ("es", "ed", "ing", "er", "ly", "ion", "al")


def vocab() -> list[str]:
    """The WordPiece vocab as Hugging Face spells it (``##`` marks a continuation)."""
    return [
        *SPECIAL_TOKENS,
        *LETTERS,
        *(f"##{letter}" for letter in LETTERS),
        *PUNCTUATION,
        *WORDS,
        *(f"##{suffix}" for suffix in SUFFIXES),
    ]


def gguf_tokens() -> list[str]:
    """The vocab as llama.cpp stores a BERT vocab (``convert_hf_to_gguf.py``'s ``phantom``)."""
    stored = []
    for token in vocab():
        if token in SPECIAL_TOKENS:
            stored.append(token)
        elif token.startswith("##"):
            stored.append(token[2:])
        else:
            stored.append(PHANTOM_SPACE + token)
    return stored


@dataclass(frozen=True)
class Layer:
    wq: Array
    bq: Array
    wk: Array
    bk: Array
    wv: Array
    bv: Array
    wo: Array
    bo: Array
    attn_norm: Array
    attn_norm_b: Array
    up: Array
    up_b: Array
    down: Array
    down_b: Array
    out_norm: Array
    out_norm_b: Array


@dataclass(frozen=True)
class Weights:
    """All tensors, matrices in PyTorch ``Linear`` layout ``(out, in)``."""

    tok_embd: Array
    type_embd: Array
    pos_embd: Array
    embd_norm: Array
    embd_norm_b: Array
    layers: tuple[Layer, ...]
    cls_out: Array
    cls_out_b: Array


def weights() -> Weights:
    """The model's weights, drawn from ``SEED`` in a fixed order."""
    rng = np.random.default_rng(SEED)

    def normal(*shape: int) -> Array:
        return (rng.standard_normal(shape) * STD).astype(np.float32)

    def linear(n_out: int, n_in: int) -> tuple[Array, Array]:
        return normal(n_out, n_in), normal(n_out)

    def norm() -> tuple[Array, Array]:
        return (1.0 + rng.standard_normal(N_EMBD) * STD).astype(np.float32), normal(N_EMBD)

    n_vocab = len(vocab())
    tok_embd = normal(n_vocab, N_EMBD)
    type_embd = normal(N_TOKEN_TYPES, N_EMBD)
    pos_embd = normal(N_CTX_TRAIN, N_EMBD)
    embd_norm, embd_norm_b = norm()
    layers = [
        Layer(
            *linear(N_EMBD, N_EMBD),  # wq, bq
            *linear(N_EMBD, N_EMBD),  # wk, bk
            *linear(N_EMBD, N_EMBD),  # wv, bv
            *linear(N_EMBD, N_EMBD),  # wo, bo
            *norm(),  # attn_norm, attn_norm_b
            *linear(N_FF, N_EMBD),  # up, up_b
            *linear(N_EMBD, N_FF),  # down, down_b
            *norm(),  # out_norm, out_norm_b
        )
        for _ in range(N_LAYER)
    ]
    cls_out, cls_out_b = normal(1, N_EMBD), normal(1)
    return Weights(
        tok_embd, type_embd, pos_embd, embd_norm, embd_norm_b, tuple(layers), cls_out, cls_out_b
    )


def tensors(w: Weights) -> list[tuple[str, Array]]:
    """GGUF tensor names (gguf-py's ``MODEL_TENSORS[MODEL_ARCH.BERT]``) and data. A numpy
    ``(out, in)`` matrix is ggml's ``{in, out}``, which is what llama.cpp asks for."""
    named = [
        ("token_embd.weight", w.tok_embd),
        ("token_types.weight", w.type_embd),
        ("position_embd.weight", w.pos_embd),
        ("token_embd_norm.weight", w.embd_norm),
        ("token_embd_norm.bias", w.embd_norm_b),
    ]
    for i, layer in enumerate(w.layers):
        named += [
            (f"blk.{i}.attn_q.weight", layer.wq),
            (f"blk.{i}.attn_q.bias", layer.bq),
            (f"blk.{i}.attn_k.weight", layer.wk),
            (f"blk.{i}.attn_k.bias", layer.bk),
            (f"blk.{i}.attn_v.weight", layer.wv),
            (f"blk.{i}.attn_v.bias", layer.bv),
            (f"blk.{i}.attn_output.weight", layer.wo),
            (f"blk.{i}.attn_output.bias", layer.bo),
            (f"blk.{i}.attn_output_norm.weight", layer.attn_norm),
            (f"blk.{i}.attn_output_norm.bias", layer.attn_norm_b),
            (f"blk.{i}.ffn_up.weight", layer.up),
            (f"blk.{i}.ffn_up.bias", layer.up_b),
            (f"blk.{i}.ffn_down.weight", layer.down),
            (f"blk.{i}.ffn_down.bias", layer.down_b),
            (f"blk.{i}.layer_output_norm.weight", layer.out_norm),
            (f"blk.{i}.layer_output_norm.bias", layer.out_norm_b),
        ]
    named += [("cls.output.weight", w.cls_out), ("cls.output.bias", w.cls_out_b)]
    return named


def build(path: Path) -> Path:
    """Write the model to ``path`` (about 150 KB) and return ``path``."""
    arch = gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.BERT]
    writer = gguf.GGUFWriter(path, arch)
    writer.add_name("tiny-rerank-bert")
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_context_length(N_CTX_TRAIN)
    writer.add_embedding_length(N_EMBD)
    writer.add_feed_forward_length(N_FF)
    writer.add_block_count(N_LAYER)
    writer.add_head_count(N_HEAD)
    writer.add_layer_norm_eps(NORM_EPS)
    writer.add_causal_attention(False)
    writer.add_pooling_type(gguf.PoolingType.RANK)

    writer.add_tokenizer_model("bert")
    writer.add_token_list(gguf_tokens())
    writer.add_token_types(
        [
            gguf.TokenType.CONTROL if token in SPECIAL_TOKENS else gguf.TokenType.NORMAL
            for token in vocab()
        ]
    )
    writer.add_token_type_count(N_TOKEN_TYPES)
    # What gguf.SpecialVocab reads from a BERT tokenizer.json ("[CLS] $A [SEP]" and
    # "[CLS] $A [SEP] $B [SEP]"): CLS is BOS, SEP is EOS and the separator, and the pair
    # is joined by the EOS alone, so add_sep is off.
    writer.add_bos_token_id(CLS_ID)
    writer.add_eos_token_id(SEP_ID)
    writer.add_sep_token_id(SEP_ID)
    writer.add_pad_token_id(PAD_ID)
    writer.add_unk_token_id(UNK_ID)
    writer.add_mask_token_id(MASK_ID)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(True)
    writer.add_add_sep_token(False)

    for name, data in tensors(weights()):
        writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# --- the reference forward pass -------------------------------------------------------


def _split_words(text: str) -> list[str]:
    """llama.cpp's WPM pre-tokenizer (``llm_tokenizer_wpm_session::preprocess``):
    NFD, drop accents and control characters, lowercase, split on whitespace, and make
    each punctuation mark (and each ASCII symbol) a word of its own."""
    words = [""]
    for char in unicodedata.normalize("NFD", text):
        category = unicodedata.category(char)
        if char.isspace():
            if words[-1]:
                words.append("")
            continue
        if char in ("\0", "\ufffd") or category == "Cc" or category == "Mn":
            continue
        lowered = char.lower()
        if category.startswith("P") or (ord(char) < 0x7F and category.startswith("S")):
            if words[-1]:
                words.append("")
            words[-1] = lowered
            words.append("")
        else:
            words[-1] += lowered
    return [word for word in words if word]


class Reference:
    """The numpy twin of llama-server's rerank on the file ``build`` writes."""

    def __init__(self) -> None:
        self.weights = weights()
        self.token_ids = {token: i for i, token in enumerate(gguf_tokens())}
        self.max_token_len = max(len(token) for token in self.token_ids)

    def tokenize(self, text: str) -> list[int]:
        """Greedy longest-match WordPiece over ``▁word``; a word that cannot be covered
        entirely becomes ``[UNK]`` (``llm_tokenizer_wpm_session::tokenize``)."""
        ids: list[int] = []
        for word in _split_words(text):
            marked = PHANTOM_SPACE + word
            pieces: list[int] = []
            start = 0
            while start < len(marked):
                for end in range(min(len(marked), start + self.max_token_len), start, -1):
                    found = self.token_ids.get(marked[start:end])
                    if found is not None:
                        pieces.append(found)
                        start = end
                        break
                else:
                    pieces = [UNK_ID]
                    break
            ids += pieces
        return ids

    def rerank_tokens(self, query: str, document: str) -> list[int]:
        """``format_prompt_rerank`` with no rerank template in the model."""
        return [CLS_ID, *self.tokenize(query), SEP_ID, *self.tokenize(document), SEP_ID]

    def score(self, query: str, document: str) -> float:
        """The relevance score llama-server reports for (query, document)."""
        return self.score_tokens(self.rerank_tokens(query, document))

    def score_tokens(self, ids: list[int]) -> float:
        w = self.weights
        n = len(ids)
        if n > N_CTX_TRAIN:
            raise ValueError(f"{n} tokens is more than the model's {N_CTX_TRAIN} positions")
        x = w.tok_embd[ids].astype(np.float64) + w.type_embd[0] + w.pos_embd[:n]
        x = _layer_norm(x, w.embd_norm, w.embd_norm_b)
        head_dim = N_EMBD // N_HEAD
        for layer in w.layers:
            q = (x @ layer.wq.T + layer.bq).reshape(n, N_HEAD, head_dim).transpose(1, 0, 2)
            k = (x @ layer.wk.T + layer.bk).reshape(n, N_HEAD, head_dim).transpose(1, 0, 2)
            v = (x @ layer.wv.T + layer.bv).reshape(n, N_HEAD, head_dim).transpose(1, 0, 2)
            logits = q @ k.transpose(0, 2, 1) / np.sqrt(head_dim)
            logits -= logits.max(axis=-1, keepdims=True)
            attention = np.exp(logits)
            attention /= attention.sum(axis=-1, keepdims=True)
            mixed = (attention @ v).transpose(1, 0, 2).reshape(n, N_EMBD)
            x = _layer_norm(mixed @ layer.wo.T + layer.bo + x, layer.attn_norm, layer.attn_norm_b)
            hidden = ggml_gelu(x @ layer.up.T + layer.up_b)
            x = _layer_norm(
                hidden @ layer.down.T + layer.down_b + x, layer.out_norm, layer.out_norm_b
            )
        logit = x[0] @ w.cls_out[0].astype(np.float64) + w.cls_out_b[0]
        return float(logit)


def _layer_norm(x: NDArray[np.float64], gain: Array, bias: Array) -> NDArray[np.float64]:
    centred = x - x.mean(axis=-1, keepdims=True)
    variance = (centred * centred).mean(axis=-1, keepdims=True)
    normed: NDArray[np.float64] = centred / np.sqrt(variance + NORM_EPS) * gain + bias
    return normed


def ggml_gelu(x: NDArray[np.float64]) -> NDArray[np.float64]:
    """ggml's CPU GELU (``ggml_vec_gelu_f32`` with ``GGML_GELU_FP16``): the input rounded
    to float16, the tanh-form GELU of that in float32, rounded to float16; 0 at or below
    -10 and the identity at or above 10."""
    x32 = x.astype(np.float32)
    h = np.clip(x32, -10.0, 10.0).astype(np.float16).astype(np.float32)
    c = np.float32(0.79788456080286535587989211986876)
    a = np.float32(0.044715)
    half, one = np.float32(0.5), np.float32(1.0)
    table = (half * h * (one + np.tanh(c * h * (one + a * h * h)))).astype(np.float16)
    gelu = np.where(x32 <= -10.0, np.float32(0.0), table.astype(np.float32))
    out: NDArray[np.float64] = np.where(x32 >= 10.0, x32, gelu).astype(np.float64)
    return out


def main() -> None:
    """``python -m tests.models.tiny_rerank_gguf OUT.gguf``: write the model."""
    import sys

    print(build(Path(sys.argv[1])))


if __name__ == "__main__":
    main()
