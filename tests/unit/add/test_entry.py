"""The values of the entry ``add`` writes: id, role, port, context and fields."""

from __future__ import annotations

from pathlib import Path

import pytest

from slm_server.add.entry import (
    MIN_CONTEXT,
    Fit,
    NoPort,
    contexts_to_try,
    entry_fields,
    fit_context,
    model_id,
    model_path_text,
    next_port,
    role_for,
    taken,
    used_ports,
)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2-135m-instruct.q4_1"),
        ("unsloth/Qwen3-0.6B-GGUF/Qwen3-0.6B-Q8_0.gguf", "qwen3-0.6b-q8_0"),
        ("o/r/r-Q4_K_M.gguf@abc12345", "r-q4_k_m"),
        ("ollama:qwen3:0.6b", "qwen3-0.6b"),
        ("ollama:someone/coder:7b", "coder-7b"),
        ("lmstudio:pub/repo/big-Q8_0-00001-of-00002.gguf", "big-q8_0"),
        ("llama.cpp:My Model (v2).GGUF", "my-model-v2"),
        ("---.gguf", "model"),
    ],
)
def test_the_id_is_the_name_lower_cased_in_safe_characters(name: str, expected: str) -> None:
    assert model_id(name) == expected


def test_the_role_has_no_dot_which_would_name_a_replica() -> None:
    assert role_for("qwen3-0.6b-q8_0") == "qwen3-0-6b-q8_0"
    assert role_for("My Id") == "my-id"


def test_a_taken_role_or_id_is_named() -> None:
    entries = {"chat": {"id": "smol"}, "odd": "not a mapping"}
    assert taken("new", "new", entries) is None
    assert taken("new", "chat", entries) == "the role 'chat' is already in the registry"
    assert taken("smol", "smol", entries) == "the id 'smol' is already taken by 'chat'"


def test_the_ports_in_use_count_replicas_and_disabled_entries_but_not_remotes() -> None:
    entries = {
        "a": {"port": 8501},
        "pool": {"port": 8531, "replicas": 3},
        "off": {"port": 8600, "enabled": False},
        "far": {"backend": "remote", "port": 9999},
        "broken": {"port": "x"},
    }
    assert used_ports(entries) == {8501, 8531, 8532, 8533, 8600}


def test_the_port_is_the_first_free_one_above_the_highest_in_use() -> None:
    assert next_port(set(), lambda _p: True) == 8501
    assert next_port({8501, 8533}, lambda _p: True) == 8534
    assert next_port({8501, 8533}, lambda p: p > 8535) == 8536
    with pytest.raises(NoPort, match="--port"):
        next_port({65535}, lambda _p: True)


def test_contexts_halve_from_the_trained_one_down_to_the_minimum() -> None:
    assert contexts_to_try(32768) == [32768, 16384, 8192, 4096, 2048]
    assert contexts_to_try(40960) == [40960, 20480, 10240, 5120, 2560, 2048]
    assert contexts_to_try(2048) == [2048]
    assert contexts_to_try(512) == [512]


def test_the_largest_context_that_fits_is_taken() -> None:
    def needs(context: int) -> int:
        return 100 + context // 100

    assert fit_context(32768, needs, 1000) == Fit(32768, 427, True)
    assert fit_context(32768, needs, 200) == Fit(8192, 181, True)
    assert fit_context(32768, needs, 50) == Fit(MIN_CONTEXT, 120, False)


def test_the_model_path_is_relative_inside_the_project_only(tmp_path: Path) -> None:
    assert model_path_text(tmp_path / "models" / "m.gguf", tmp_path) == "models/m.gguf"
    assert model_path_text(Path("/elsewhere/m.gguf"), tmp_path) == "/elsewhere/m.gguf"


def fields(kind: str, pooling: int | None, quantization: str | None = "Q4_0") -> dict[str, object]:
    return entry_fields(
        model_id="e",
        port=1,
        model_path="/e.gguf",
        quantization=quantization,
        kind=kind,
        pooling=pooling,
        context=512,
        load="always",
    )


def test_an_embeddings_file_gets_its_pooling_or_mean_and_a_reranker_none() -> None:
    chat = fields("chat", None)
    assert "model_type" not in chat and "pooling" not in chat
    assert chat["default_timeout"] == 120 and chat["load"] == "always"
    cls = fields("embeddings", 2, quantization=None)
    assert (cls["model_type"], cls["pooling"], cls["quantization"]) == (
        "embeddings",
        "cls",
        "unknown",
    )
    assert fields("embeddings", None)["pooling"] == "mean"
    assert fields("embeddings", None)["default_timeout"] == 60
    rerank = fields("rerank", 4)
    assert rerank["model_type"] == "rerank" and "pooling" not in rerank
