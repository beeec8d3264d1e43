"""Which backends keep their slots (slotcache/eligible.py): every reason to skip, in
the order the plan reports them, and the sliding-window check read from the GGUF
header itself (tiny files written here, a gemma3-like one with a window and a
llama-like one without)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import pytest

from slm_server.registry.schema import ModelEntry
from slm_server.slotcache.eligible import SLIDING_WINDOW, why_not
from tests.registry_entries import model_entry
from tests.unit.memory.gguf_files import llama_like, write_gguf


def gemma3_like(writer: gguf.GGUFWriter) -> None:
    llama_like(layers=12, heads=4, kv_heads=1, key_length=256, value_length=256)(writer)
    writer.add_sliding_window(512)


@pytest.fixture
def plain(tmp_path: Path) -> Path:
    return write_gguf(tmp_path / "llama.gguf", "llama", llama_like())


@pytest.fixture
def sliding(tmp_path: Path) -> Path:
    return write_gguf(tmp_path / "gemma3.gguf", "gemma3", gemma3_like)


def entry(model: Path, **fields: Any) -> ModelEntry:
    return model_entry(model_path=str(model), **fields)


def test_a_native_text_model_without_a_window_is_kept(plain: Path) -> None:
    assert why_not(entry(plain), native=True, enabled=True) is None
    assert why_not(entry(plain, slot_cache=True, cache_prompt=True), True, True) is None


def test_turned_off_globally_wins_over_everything(plain: Path) -> None:
    assert why_not(entry(plain, slot_cache=True), True, False) == (
        "turned off (SLM_SLOT_CACHE=false)"
    )


def test_turned_off_for_the_model(plain: Path) -> None:
    assert why_not(entry(plain, slot_cache=False), True, True) == "turned off (slot_cache: false)"


def test_the_python_fallback_has_no_slot_api(plain: Path) -> None:
    reason = why_not(entry(plain), native=False, enabled=True)
    assert reason is not None and "llama-cpp-python" in reason


def test_an_mlx_model_is_not_kept(tmp_path: Path) -> None:
    model = tmp_path / "mlx-model"
    model.mkdir()
    mlx = entry(model, backend="mlx", quantization="4bit")
    reason = why_not(mlx, native=True, enabled=True)
    assert reason is not None and "not a llama.cpp model" in reason


@pytest.mark.parametrize("model_type", ["embeddings", "rerank"])
def test_embedding_and_rerank_models_are_not_kept(plain: Path, model_type: str) -> None:
    reason = why_not(entry(plain, model_type=model_type), True, True)
    assert reason == f"{model_type} model: no conversation to continue"


def test_a_server_that_reuses_no_prompt_is_not_kept(plain: Path) -> None:
    reason = why_not(entry(plain, cache_prompt=False), True, True)
    assert reason is not None and reason.startswith("cache_prompt: false")


def test_a_sliding_window_model_is_not_kept(sliding: Path) -> None:
    assert why_not(entry(sliding), True, True) == SLIDING_WINDOW


def test_a_sliding_window_model_in_a_directory_is_found(tmp_path: Path) -> None:
    """model_path naming a directory resolves to its GGUF file, as at launch."""
    folder = tmp_path / "gemma"
    folder.mkdir()
    write_gguf(folder / "gemma3.gguf", "gemma3", gemma3_like)
    assert why_not(entry(folder), True, True) == SLIDING_WINDOW


def test_a_window_on_an_architecture_without_sliding_layers_is_kept(tmp_path: Path) -> None:
    """A window in the header but no sliding layer (an unknown architecture counts
    full layers): its cache is reused, so it is kept."""
    path = write_gguf(tmp_path / "mystery.gguf", "mystery", gemma3_like)
    assert why_not(entry(path), True, True) is None


def test_an_explicit_pattern_of_sliding_layers_is_not_kept(tmp_path: Path) -> None:
    def fill(writer: gguf.GGUFWriter) -> None:
        gemma3_like(writer)
        writer.add_sliding_window_pattern([True, False] * 6)

    path = write_gguf(tmp_path / "mystery.gguf", "mystery", fill)
    assert why_not(entry(path), True, True) == SLIDING_WINDOW


@pytest.mark.parametrize("content", [b"", b"GGUF", b"not a gguf file at all" * 10])
def test_an_unreadable_model_is_not_skipped_for_a_window(tmp_path: Path, content: bytes) -> None:
    """A header that cannot be read is no reason to skip (the plan fails elsewhere,
    or the server refuses it): a restore not reused costs time, never correctness."""
    path = tmp_path / "broken.gguf"
    path.write_bytes(content)
    assert why_not(entry(path), True, True) is None


def test_a_missing_model_is_not_skipped_for_a_window(tmp_path: Path) -> None:
    assert why_not(entry(tmp_path / "missing.gguf"), True, True) is None


def test_the_earlier_reasons_win_over_the_window(sliding: Path) -> None:
    """The cheap checks come first: a model turned off is never opened, and says so."""
    assert why_not(entry(sliding, slot_cache=False), True, True) == (
        "turned off (slot_cache: false)"
    )
    assert why_not(entry(sliding, model_type="embeddings"), True, True) == (
        "embeddings model: no conversation to continue"
    )
