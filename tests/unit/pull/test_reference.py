"""What ``pull`` accepts as a reference, and what it refuses before any network."""

from __future__ import annotations

import pytest

from slm_server.pull.errors import PullError
from slm_server.pull.reference import (
    HfReference,
    OllamaReference,
    parse_reference,
    safe_relative,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("ggml-org/gemma-3-270m-GGUF", HfReference("ggml-org/gemma-3-270m-GGUF")),
        (
            "ggml-org/gemma-3-270m-GGUF:Q8_0",
            HfReference("ggml-org/gemma-3-270m-GGUF", quant="Q8_0"),
        ),
        ("hf:owner/repo:q4_k_m", HfReference("owner/repo", quant="q4_k_m")),
        ("https://huggingface.co/owner/repo", HfReference("owner/repo")),
        ("hf.co/owner/repo/sub/m-Q4_0.gguf", HfReference("owner/repo", file="sub/m-Q4_0.gguf")),
        ("owner/repo@v1.0:Q4_0", HfReference("owner/repo", revision="v1.0", quant="Q4_0")),
        ("owner/repo@abc123/m.gguf", HfReference("owner/repo", revision="abc123", file="m.gguf")),
        ("ollama:gemma3", OllamaReference("library", "gemma3", "latest")),
        ("ollama:gemma3:270m", OllamaReference("library", "gemma3", "270m")),
        ("ollama:someone/tiny:q4_K_M", OllamaReference("someone", "tiny", "q4_K_M")),
    ],
)
def test_a_reference_is_parsed(text: str, expected: object) -> None:
    assert parse_reference(text) == expected


def test_a_reference_prints_as_it_would_be_written() -> None:
    assert str(parse_reference("owner/repo@r1:Q4_0")) == "owner/repo@r1:Q4_0"
    assert str(parse_reference("owner/repo/a/b.gguf")) == "owner/repo/a/b.gguf"
    assert str(parse_reference("ollama:gemma3:270m")) == "ollama:gemma3:270m"
    assert str(parse_reference("ollama:me/m")) == "ollama:me/m:latest"


@pytest.mark.parametrize(
    "text",
    [
        "",
        "justone",
        "a/../b",
        "../a/b",
        "owner/re po",
        "owner/repo:Q4 K",
        "owner/repo@..:Q4_0",
        "owner/repo/readme.md",
        "owner--x/repo",
        "ftp://example.com/a/b",
        "ollama:",
        "ollama:../etc:x",
        "ollama:Gemma3",
        "ollama:gemma3:../x",
        "ollama:a/b/c:d",
        "x" * 600,
    ],
)
def test_a_malformed_reference_is_refused(text: str) -> None:
    with pytest.raises(PullError) as raised:
        parse_reference(text)
    assert raised.value.kind in ("bad_reference", "unsafe_name")


@pytest.mark.parametrize(
    "text",
    [
        "owner/repo/../x.gguf",
        "owner/repo/a/../../x.gguf",
        "owner/repo/./x.gguf",
        "owner/repo//x.gguf",
    ],
)
def test_a_file_path_that_climbs_is_refused_as_unsafe(text: str) -> None:
    with pytest.raises(PullError) as raised:
        parse_reference(text)
    assert raised.value.kind == "unsafe_name"


@pytest.mark.parametrize(
    "path",
    ["../x.gguf", "/etc/x.gguf", "a\\b.gguf", "C:x.gguf", "a/./b", "a//b", "a/\x00.gguf", ""],
)
def test_safe_relative_refuses_every_way_out(path: str) -> None:
    with pytest.raises(PullError):
        safe_relative(path)


def test_safe_relative_keeps_a_plain_path() -> None:
    assert safe_relative("sub/dir/model-Q4_K_M.gguf") == "sub/dir/model-Q4_K_M.gguf"
