"""Finding a model's fill-in-the-middle tokens in its GGUF header as llama.cpp finds them:
by id under the token keys (an id past the vocabulary ignored), else by text in the
vocabulary, which is streamed past and never kept; and what the default models have."""

from __future__ import annotations

import time
import tracemalloc
from pathlib import Path

import gguf
import pytest

from slm_server.memory.fill_in import ALL_TEXTS, TEXTS, gguf_infill, tokens_found
from slm_server.memory.gguf_header import GgufArray, read_header
from tests.unit.memory.gguf_files import GEMMA3, SMOLLM2, write_gguf

FILLER = [f"tok{i}" for i in range(200)]


def model(path: Path, tokens: list[str], **ids: int) -> Path:
    def fill(writer: gguf.GGUFWriter) -> None:
        writer.add_token_list(tokens)
        for key, value in ids.items():
            writer.add_uint32(f"tokenizer.ggml.{key}", value)

    return write_gguf(path, "llama", fill)


@pytest.mark.parametrize(
    "family",
    [
        ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),  # Qwen2.5-Coder
        ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),  # StarCoder, Granite
        ("<fim-prefix>", "<fim-suffix>", "<fim-middle>"),
        ("\u2581<PRE>", "\u2581<SUF>", "\u2581<MID>"),  # CodeLlama
        (
            "<\uff5cfim\u2581begin\uff5c>",
            "<\uff5cfim\u2581hole\uff5c>",
            "<\uff5cfim\u2581end\uff5c>",
        ),
    ],
)
def test_the_tokens_are_found_by_their_text(tmp_path: Path, family: tuple[str, ...]) -> None:
    path = model(tmp_path / "m.gguf", [*FILLER, *family])
    found = gguf_infill(path)
    assert found.takes is True


def test_one_token_missing_is_no_and_names_it(tmp_path: Path) -> None:
    path = model(tmp_path / "m.gguf", [*FILLER, "<fim_prefix>", "<fim_middle>"])
    found = gguf_infill(path)
    assert found.takes is False
    assert "no fill-in-the-middle suffix token" in found.why


def test_ids_under_the_keys_count_unless_past_the_vocabulary(tmp_path: Path) -> None:
    good = model(
        tmp_path / "a.gguf", FILLER, fim_pre_token_id=1, fim_suf_token_id=2, fim_mid_token_id=3
    )
    assert gguf_infill(good).takes is True
    older = model(
        tmp_path / "b.gguf", FILLER, prefix_token_id=1, suffix_token_id=2, middle_token_id=3
    )
    assert gguf_infill(older).takes is True
    past = model(
        tmp_path / "c.gguf", FILLER, fim_pre_token_id=1, fim_suf_token_id=2, fim_mid_token_id=999
    )
    assert gguf_infill(past).takes is False
    # An id past the vocabulary gives way to the text, as in llama.cpp.
    text = model(
        tmp_path / "d.gguf",
        [*FILLER, "<MID>"],
        fim_pre_token_id=1,
        fim_suf_token_id=2,
        fim_mid_token_id=999,
    )
    assert gguf_infill(text).takes is True


def test_a_text_that_is_only_like_a_token_is_not_one(tmp_path: Path) -> None:
    lookalikes = ["<fim_prefix", "fim_prefix>", "<FIM_PREFIX>", "<fim_suffix> ", "<|fim_middle|>x"]
    path = model(tmp_path / "m.gguf", [*FILLER, *lookalikes])
    assert gguf_infill(path).takes is False


def test_an_unreadable_file_cannot_tell(tmp_path: Path) -> None:
    broken = tmp_path / "x.gguf"
    broken.write_bytes(b"not a gguf")
    assert gguf_infill(broken).takes is None
    assert gguf_infill(tmp_path / "missing.gguf").takes is None


def test_the_vocabulary_is_streamed_in_bounded_memory(tmp_path: Path) -> None:
    """100,000 tokens, crossing the reader's buffer many times, the three FIM tokens at
    its very end: found, and nothing of the vocabulary kept (Gemma 3's 262,144 are
    read below)."""
    tokens = [f"w{i:06d}" for i in range(100_000)] + [
        "<fim_prefix>",
        "<fim_suffix>",
        "<fim_middle>",
    ]
    path = model(tmp_path / "big.gguf", tokens)
    tracemalloc.start()
    try:
        started = time.perf_counter()
        header = read_header(path, ALL_TEXTS)
        elapsed = time.perf_counter() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert header.found_tokens == {"<fim_prefix>", "<fim_suffix>", "<fim_middle>"}
    assert header.metadata["tokenizer.ggml.tokens"] == GgufArray("string", len(tokens))
    assert tokens_found(header.metadata, header.found_tokens) == ("prefix", "suffix", "middle")
    assert peak < 256 << 10  # the file's vocabulary is ~1.5 MB
    assert elapsed < 5.0


def test_every_text_llama_cpp_looks_for_is_listed_once() -> None:
    assert len(ALL_TEXTS) == sum(len(texts) for texts in TEXTS.values()) == 24


@pytest.mark.skipif(not SMOLLM2.exists(), reason="the default models are not fetched")
def test_smollm2_has_no_fill_in_the_middle_tokens() -> None:
    found = gguf_infill(SMOLLM2)
    assert found.takes is False
    assert "prefix or suffix or middle" in found.why


@pytest.mark.skipif(not GEMMA3.exists(), reason="the default models are not fetched")
def test_gemma3_has_none_either_and_its_262k_vocabulary_is_read_quickly() -> None:
    started = time.perf_counter()
    found = gguf_infill(GEMMA3)
    assert time.perf_counter() - started < 3.0
    assert found.takes is False
