"""Whether an entry's model fills in the middle: its ``infill`` field, else its GGUF file;
the router's cache (one read per file, again when it changes); ``check``'s line; and the
registry's ``infill_default`` (one at most, a text model)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import gguf
import pytest
import yaml

from slm_server.memory.fill_in import Infill, gguf_infill
from slm_server.registry.infill import InfillCache, entry_infill, infill_summary
from slm_server.registry.schema import ConfigError, parse_registry
from tests.registry_entries import model_entry, registry_entry
from tests.unit.memory.gguf_files import write_gguf

SOURCE = Path("/registry/models.yaml")


def fim(path: Path, *, tokens: bool) -> Path:
    def fill(writer: gguf.GGUFWriter) -> None:
        extra = ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"] if tokens else []
        writer.add_token_list(["a", "b", *extra])

    return write_gguf(path, "qwen2", fill)


def test_the_field_says_it_whatever_the_file() -> None:
    assert entry_infill(model_entry(infill=True)).takes is True
    assert entry_infill(model_entry(infill=False)).takes is False
    remote = model_entry(backend="mlx", model_path="org/model")
    assert entry_infill(remote).takes is None
    assert "set infill: true" in entry_infill(remote).why


def test_else_the_gguf_says_it(tmp_path: Path) -> None:
    yes = model_entry(model_path=str(fim(tmp_path / "yes.gguf", tokens=True)))
    no = model_entry(model_path=str(fim(tmp_path / "no.gguf", tokens=False)))
    assert entry_infill(yes).takes is True
    assert entry_infill(no).takes is False
    missing = model_entry(model_path=str(tmp_path / "gone.gguf"))
    assert entry_infill(missing).takes is None
    assert infill_summary(yes).startswith("infill (/infill, suffix): yes")
    assert infill_summary(no).startswith("infill (/infill, suffix): no")
    assert infill_summary(missing).startswith("infill (/infill, suffix): unknown (refused)")


def test_the_cache_reads_a_file_once_and_again_once_it_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = fim(tmp_path / "m.gguf", tokens=False)
    entry = model_entry(model_path=str(path))
    reads: list[Path] = []

    def counted(file: Path) -> Infill:
        reads.append(file)
        return gguf_infill(file)

    monkeypatch.setattr("slm_server.registry.infill.gguf_infill", counted)
    cache = InfillCache()

    async def scenario() -> None:
        assert cache.known(entry) is None
        answers = await asyncio.gather(*(cache.of(entry) for _ in range(5)))
        assert {a.takes for a in answers} == {False}
        assert len(reads) == 1  # five callers, one read
        known = cache.known(entry)
        assert known is not None and known.takes is False
        fim(path, tokens=True)
        stat = path.stat()
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
        assert cache.known(entry) is None  # a changed file is read again
        cache.start(entry)
        assert (await cache.of(entry)).takes is True
        assert len(reads) == 2

    asyncio.run(scenario())


def registry(**entries: dict[str, Any]) -> str:
    return yaml.safe_dump({"models": entries}, sort_keys=False)


def entry(model_id: str, port: int, **fields: Any) -> dict[str, Any]:
    return registry_entry(model_id, port, model_path="models/m.gguf", quantization="Q4_1", **fields)


def test_one_enabled_entry_at_most_is_the_default_for_infill() -> None:
    text = registry(a=entry("a", 8501, infill_default=True), b=entry("b", 8502))
    assert parse_registry(text, SOURCE).models[0].entry.infill_default is True
    two = registry(
        a=entry("a", 8501, infill_default=True),
        b=entry("b", 8502, infill_default=True),
        c=entry("c", 8503, infill_default=True, enabled=False),  # a disabled one is no default
    )
    with pytest.raises(ConfigError) as caught:
        parse_registry(two, SOURCE)
    [line] = [str(p) for p in caught.value.problems]
    assert line == (
        f"{SOURCE}: model 'b' (id 'b'): field 'infill_default': model 'a' (id 'a') is the "
        "default for /infill already; only one may be"
    )


def test_the_default_for_infill_generates_text() -> None:
    text = registry(e=entry("e", 8501, infill_default=True, model_type="embeddings"))
    with pytest.raises(ConfigError) as caught:
        parse_registry(text, SOURCE)
    assert "field 'infill_default': applies to model_type lm only" in str(caught.value)
