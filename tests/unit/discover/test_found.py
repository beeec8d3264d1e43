"""A found model's facts, read from its GGUF header or, failing that, its name."""

from __future__ import annotations

from pathlib import Path

import pytest

from slm_server.discover.found import Found, quantization_from_name, read_found
from slm_server.discover.places import PROJECT, Candidate
from tests.unit.discover.stores import tiny_gguf


def found(*paths: Path, name: str | None = None) -> Found:
    return read_found(Candidate(name or f"models/{paths[0].name}", PROJECT, paths))


def test_the_header_gives_architecture_context_and_quantization(tmp_path: Path) -> None:
    path = tiny_gguf(tmp_path / "model.gguf", "qwen3", context=40960, file_type=15)
    assert found(path) == Found(
        "models/model.gguf",
        PROJECT,
        str(path),
        path.stat().st_size,
        "qwen3",
        40960,
        "Q4_K_M",
        "chat",
    )


def test_without_a_file_type_the_name_gives_the_quantization(tmp_path: Path) -> None:
    path = tiny_gguf(tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf")
    assert found(path).quantization == "Q4_1"
    unnamed = tiny_gguf(tmp_path / "model.gguf")
    assert found(unnamed).quantization is None


@pytest.mark.parametrize(
    ("name", "quant"),
    [
        ("gemma-3-270m-q4_k_m.gguf", "Q4_K_M"),
        ("Qwen3-8B-IQ4_XS-00001-of-00002.gguf", "IQ4_XS"),
        ("model-bf16.gguf", "BF16"),
        ("model.Q8_0.gguf", "Q8_0"),
        ("ollama:qwen3:8b-q4_K_M", "Q4_K_M"),
        ("gpt-oss-20b-MXFP4.gguf", "MXFP4"),
        ("model.gguf", None),
    ],
)
def test_quantization_from_name(name: str, quant: str | None) -> None:
    assert quantization_from_name(name) == quant


def test_pooling_or_an_encoder_architecture_means_embeddings(tmp_path: Path) -> None:
    pooled = tiny_gguf(tmp_path / "qwen3-embedding.gguf", "qwen3", pooling=3)
    encoder = tiny_gguf(tmp_path / "nomic.gguf", "nomic-bert")
    assert found(pooled).type == "embeddings"
    assert found(encoder).type == "embeddings"


def test_rank_pooling_or_a_rerank_name_means_rerank(tmp_path: Path) -> None:
    ranked = tiny_gguf(tmp_path / "scorer.gguf", "bert", pooling=4)
    named = tiny_gguf(tmp_path / "bge-reranker-v2-m3.gguf", "bert")
    assert found(ranked).type == "rerank"
    assert found(named).type == "rerank"


def test_an_unreadable_header_keeps_the_size_and_leaves_the_rest_unknown(
    tmp_path: Path,
) -> None:
    path = tmp_path / "broken-Q4_0.gguf"
    path.write_bytes(b"GGUF" + b"\xff" * 100)
    assert found(path) == Found(
        "models/broken-Q4_0.gguf", PROJECT, str(path), 104, None, None, "Q4_0", None
    )


def test_a_split_model_is_the_size_of_all_its_parts(tmp_path: Path) -> None:
    first = tiny_gguf(tmp_path / "m-00001-of-00002.gguf", context=1024)
    second = tmp_path / "m-00002-of-00002.gguf"
    second.write_bytes(b"\0" * 1000)
    facts = found(first, second)
    assert facts.size == first.stat().st_size + 1000
    assert facts.context_length == 1024
