"""A tiny random-weight Qwen3 causal language model in Hugging Face format.

``build(path)`` writes, in a few milliseconds and without downloading anything:

    config.json              Qwen3ForCausalLM, hidden 64, 2 layers, 4 heads (2 KV), head 16
    model.safetensors        float32 weights under the exact Qwen3 names (q_norm/k_norm
                             included; no lm_head: the embeddings are tied)
    tokenizer.json           a byte-level BPE trained here on CORPUS, a few hundred tokens
    tokenizer_config.json    ChatML chat template, <|im_end|> as EOS
    generation_config.json

Everything is a pure function of the constants below and a fixed seed, so two builds
are byte for byte the same. The model is random: it speaks nonsense, but mlx-lm,
mlx-openai-server and mlx-embeddings load and run it, and its yes/no logits differ
from document to document, which is what the reranker tests need.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save_file
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

SEED = 20260605
VOCAB_SIZE = 400  # the trained vocabulary, before the two added <think> tokens
HIDDEN = 64
LAYERS = 2
HEADS = 4
KV_HEADS = 2
HEAD_DIM = 16
INTERMEDIATE = 128
MAX_POSITIONS = 2048
ROPE_THETA = 1_000_000.0
RMS_NORM_EPS = 1e-6

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)  # ids 0, 1, 2
THINK_TOKENS = ("<think>", "</think>")  # added, not special: they show in decoded text
# Words the tests look up as single tokens.
SINGLE_TOKENS = ("yes", "no")

# Qwen-style ChatML; ``enable_thinking=false`` pre-fills an empty think block.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['content'] is string -%}"
    "{%- set content = message['content'] -%}"
    "{%- else -%}"
    "{%- set content = message['content'] | selectattr('type', 'equalto', 'text') "
    "| map(attribute='text') | join('') -%}"
    "{%- endif -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{- '<think>\\n\\n</think>\\n\\n' -}}"
    "{%- endif -%}"
    "{%- endif -%}"
)

# The training text: chat turns, reranker-style prompts and plain prose, with plenty
# of bare "yes" and "no" so that both become single tokens early in training.
_CORPUS_LINES = (
    "<|im_start|>system",
    "You are a helpful assistant. Answer the question in a short sentence.",
    "<|im_end|>",
    "<|im_start|>user",
    "Hello! What is the capital of France?",
    "<|im_start|>assistant",
    "The capital of France is Paris.",
    "Judge whether the Document meets the requirements based on the Query and the "
    'Instruct provided. Note that the answer can only be "yes" or "no".',
    "<Instruct>: Given a web search query, retrieve relevant passages that answer the query",
    "<Query>: what is the tallest mountain on earth",
    "<Document>: Mount Everest is the highest mountain above sea level.",
    "<Document>: The river flows through the valley towards the sea.",
    "<Query>: how do plants make their food",
    "<Document>: Plants use sunlight, water and carbon dioxide to make sugar.",
    "yes",
    "no",
    '"yes" "no" "yes" "no"',
    "yes, no, yes, no, yes. no. yes! no?",
    "Is the sky blue? yes. Is the sea dry? no.",
    "The quick brown fox jumps over the lazy dog.",
    "A small model can still answer yes or no to a simple question.",
    "Search engines rank documents by how well they match the query.",
    "The weather today is sunny with a light breeze and warm air.",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 2048.",
    "def add(a, b):\n    return a + b",
    "Thinking step by step helps to find the right answer.",
)
CORPUS = tuple(line for line in _CORPUS_LINES for _ in range(3)) + ("yes\nno\n",) * 40

FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
)


def _tokenizer() -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        show_progress=False,
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(CORPUS, trainer=trainer)
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in THINK_TOKENS])
    vocab = tokenizer.get_vocab()
    missing = [word for word in (*SINGLE_TOKENS, *THINK_TOKENS) if word not in vocab]
    if missing:
        raise AssertionError(f"tiny tokenizer: {missing} did not become single tokens")
    return tokenizer


def _config(vocab_size: int, token_ids: dict[str, int]) -> dict[str, Any]:
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": vocab_size,
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_POSITIONS,
        "max_window_layers": LAYERS,
        "use_sliding_window": False,
        "sliding_window": None,
        "rms_norm_eps": RMS_NORM_EPS,
        "rope_theta": ROPE_THETA,
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "tie_word_embeddings": True,
        "use_cache": True,
        "bos_token_id": token_ids[ENDOFTEXT],
        "eos_token_id": token_ids[IM_END],
        "pad_token_id": token_ids[ENDOFTEXT],
        "torch_dtype": "float32",
    }


def _weights(vocab_size: int) -> dict[str, np.ndarray[Any, np.dtype[np.float32]]]:
    """Qwen3's parameter names. Projections are scaled by 1/sqrt(fan_in), so that
    attention really mixes the context, and the embeddings are small enough that the
    last token does not simply predict itself: the logits of the last position depend
    on the whole prompt (yes/no scores spread over roughly 0.05-0.55) and generation
    does not get stuck repeating one token."""
    rng = np.random.default_rng(SEED)

    def normal(shape: tuple[int, ...], std: float) -> np.ndarray[Any, np.dtype[np.float32]]:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    def linear(out_features: int, in_features: int) -> np.ndarray[Any, np.dtype[np.float32]]:
        return normal((out_features, in_features), in_features**-0.5)

    def norm(size: int) -> np.ndarray[Any, np.dtype[np.float32]]:
        return (1.0 + normal((size,), 0.1)).astype(np.float32)

    weights = {"model.embed_tokens.weight": normal((vocab_size, HIDDEN), 0.1)}
    for i in range(LAYERS):
        prefix = f"model.layers.{i}"
        weights |= {
            f"{prefix}.input_layernorm.weight": norm(HIDDEN),
            f"{prefix}.self_attn.q_proj.weight": linear(HEADS * HEAD_DIM, HIDDEN),
            f"{prefix}.self_attn.k_proj.weight": linear(KV_HEADS * HEAD_DIM, HIDDEN),
            f"{prefix}.self_attn.v_proj.weight": linear(KV_HEADS * HEAD_DIM, HIDDEN),
            f"{prefix}.self_attn.o_proj.weight": linear(HIDDEN, HEADS * HEAD_DIM),
            f"{prefix}.self_attn.q_norm.weight": norm(HEAD_DIM),
            f"{prefix}.self_attn.k_norm.weight": norm(HEAD_DIM),
            f"{prefix}.post_attention_layernorm.weight": norm(HIDDEN),
            f"{prefix}.mlp.gate_proj.weight": linear(INTERMEDIATE, HIDDEN),
            f"{prefix}.mlp.up_proj.weight": linear(INTERMEDIATE, HIDDEN),
            f"{prefix}.mlp.down_proj.weight": linear(HIDDEN, INTERMEDIATE),
        }
    weights["model.norm.weight"] = norm(HIDDEN)
    return weights


def _tokenizer_config(tokenizer: Tokenizer) -> dict[str, Any]:
    decoder = {
        str(token_id): {
            "content": token.content,
            "lstrip": token.lstrip,
            "normalized": token.normalized,
            "rstrip": token.rstrip,
            "single_word": token.single_word,
            "special": token.special,
        }
        for token_id, token in sorted(tokenizer.get_added_tokens_decoder().items())
    }
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": decoder,
        "additional_special_tokens": [IM_START, IM_END],
        "bos_token": None,
        "eos_token": IM_END,
        "pad_token": ENDOFTEXT,
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "model_max_length": MAX_POSITIONS,
        "split_special_tokens": False,
        "chat_template": CHAT_TEMPLATE,
    }


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def build(path: Path) -> Path:
    """Write the tiny model into directory ``path`` (created if needed); returns it."""
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = _tokenizer()
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    ids: dict[str, int] = {}
    for token in SPECIAL_TOKENS:
        token_id = tokenizer.token_to_id(token)
        assert token_id is not None, token
        ids[token] = token_id
    tokenizer.save(str(path / "tokenizer.json"))
    _write_json(path / "tokenizer_config.json", _tokenizer_config(tokenizer))
    _write_json(path / "config.json", _config(vocab_size, ids))
    _write_json(
        path / "generation_config.json",
        {
            "bos_token_id": ids[ENDOFTEXT],
            "eos_token_id": [ids[IM_END], ids[ENDOFTEXT]],
            "pad_token_id": ids[ENDOFTEXT],
            "do_sample": False,
        },
    )
    save_file(_weights(vocab_size), str(path / "model.safetensors"), metadata={"format": "pt"})
    return path
