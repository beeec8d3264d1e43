"""The tiny BERT reranker builder (``tests/models/tiny_rerank_gguf.py``): reproducible to
the byte, quick, laid out the way llama.cpp loads a ``bert`` rank-pooling model, and a
reference tokenizer and GELU that behave like llama.cpp's."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

from tests.models.tiny_rerank_gguf import (
    CLS_ID,
    N_CTX_TRAIN,
    N_EMBD,
    N_FF,
    N_LAYER,
    PAD_ID,
    SEP_ID,
    UNK_ID,
    Reference,
    build,
    ggml_gelu,
    gguf_tokens,
    vocab,
)


def test_build_is_byte_reproducible_and_quick(tmp_path: Path) -> None:
    timings = []
    for name in ("first.gguf", "second.gguf"):
        started = time.perf_counter()
        build(tmp_path / name)
        timings.append(time.perf_counter() - started)
    first = (tmp_path / "first.gguf").read_bytes()
    assert first == (tmp_path / "second.gguf").read_bytes()
    assert 120_000 < len(first) < 200_000
    assert max(timings) < 1.0, timings


def field(reader: gguf.GGUFReader, key: str) -> Any:
    return reader.fields[key].contents()


def test_the_file_has_what_llama_cpp_loads_for_a_bert_reranker(tmp_path: Path) -> None:
    reader = gguf.GGUFReader(build(tmp_path / "model.gguf"))
    assert field(reader, "general.architecture") == "bert"
    assert field(reader, "bert.pooling_type") == gguf.PoolingType.RANK
    assert field(reader, "bert.attention.causal") is False
    assert field(reader, "bert.embedding_length") == N_EMBD
    assert field(reader, "bert.block_count") == N_LAYER
    assert field(reader, "tokenizer.ggml.model") == "bert"
    assert field(reader, "tokenizer.ggml.tokens") == gguf_tokens()
    assert field(reader, "tokenizer.ggml.token_type_count") == 2
    assert field(reader, "tokenizer.ggml.bos_token_id") == CLS_ID
    assert field(reader, "tokenizer.ggml.eos_token_id") == SEP_ID
    assert field(reader, "tokenizer.ggml.seperator_token_id") == SEP_ID
    assert field(reader, "tokenizer.ggml.padding_token_id") == PAD_ID
    assert field(reader, "tokenizer.ggml.unknown_token_id") == UNK_ID
    assert field(reader, "tokenizer.ggml.add_eos_token") is True
    assert field(reader, "tokenizer.ggml.add_sep_token") is False

    names = {t.name: t for t in reader.tensors}
    bert_names = {
        gguf.TENSOR_NAMES[kind].format(bid=bid)
        for kind in gguf.MODEL_TENSORS[gguf.MODEL_ARCH.BERT]
        for bid in range(N_LAYER)
    }
    assert {name.rsplit(".", 1)[0] for name in names} <= bert_names
    assert all(t.tensor_type == gguf.GGMLQuantizationType.F32 for t in reader.tensors)
    # ggml shapes ({ne0, ne1}) as llama_model_bert::load_arch_tensors asks for them.
    expected = {
        "token_embd.weight": [N_EMBD, len(vocab())],
        "token_types.weight": [N_EMBD, 2],
        "position_embd.weight": [N_EMBD, N_CTX_TRAIN],
        "blk.1.attn_q.weight": [N_EMBD, N_EMBD],
        "blk.1.ffn_up.weight": [N_EMBD, N_FF],
        "blk.1.ffn_down.weight": [N_FF, N_EMBD],
        "cls.output.weight": [N_EMBD, 1],
        "cls.output.bias": [1],
    }
    for name, shape in expected.items():
        assert names[name].shape.tolist() == shape, name
    assert "cls.weight" not in names


def test_the_vocab_is_wordpiece_with_phantom_spaces() -> None:
    tokens = vocab()
    assert len(tokens) == len(set(tokens)) == 151
    assert tokens[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    stored = gguf_tokens()
    assert stored[tokens.index("paris")] == "\u2581paris"
    assert stored[tokens.index("##ing")] == "ing"
    assert stored[CLS_ID] == "[CLS]"


@pytest.mark.parametrize(
    ("text", "pieces"),
    [
        ("Paris", ["\u2581paris"]),
        ("cats", ["\u2581cat", "s"]),
        ("Baking!", ["\u2581b", "a", "k", "ing", "\u2581!"]),
        ("naïve  42", ["\u2581n", "a", "i", "v", "e", "[UNK]"]),
        ("x-ray", ["\u2581x", "\u2581-", "\u2581r", "a", "y"]),
        ("", []),
    ],
)
def test_the_reference_tokenizer(text: str, pieces: list[str]) -> None:
    stored = gguf_tokens()
    assert [stored[i] for i in Reference().tokenize(text)] == pieces


def test_a_rerank_prompt_is_cls_query_sep_document_sep() -> None:
    reference = Reference()
    query, document = reference.tokenize("paris"), reference.tokenize("the cat")
    assert reference.rerank_tokens("paris", "the cat") == [
        CLS_ID, *query, SEP_ID, *document, SEP_ID
    ]  # fmt: skip


def test_the_reference_gelu_is_ggml_s_float16_table() -> None:
    x = np.linspace(-12.0, 12.0, 2001)
    y = ggml_gelu(x)
    exact = 0.5 * x * (1 + np.tanh(0.7978845608 * (x + 0.044715 * x**3)))
    inside = np.abs(x) < 10
    assert np.allclose(y[inside], exact[inside], rtol=2e-3, atol=2e-3)
    assert np.all(y[inside] == y[inside].astype(np.float16))
    assert np.all(y[x <= -10] == 0.0)
    assert np.all(y[x >= 10] == x[x >= 10].astype(np.float32))


def test_the_reference_scores_are_spread_out() -> None:
    reference = Reference()
    scores = [reference.score("the capital of france", doc) for doc in ("paris", "cat", "rain")]
    assert len({round(s, 2) for s in scores}) == 3
    assert max(scores) - min(scores) > 0.1
