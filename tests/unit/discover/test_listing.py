"""Found models matched to the registry, and the table and JSON they are shown as."""

from __future__ import annotations

import json
from pathlib import Path

from slm_server.discover.found import Found
from slm_server.discover.listing import (
    Listed,
    discover,
    render_json,
    render_table,
    served_files,
)
from slm_server.discover.places import HF, PROJECT, Place
from slm_server.registry.schema import inspect_registry
from tests.registry_entries import registry_entry, registry_yaml
from tests.unit.discover.stores import hf_file, tiny_gguf


def registry(tmp_path: Path, **entries: dict[str, object]) -> Path:
    path = tmp_path / "models.yaml"
    text = "models:\n" + "".join(registry_yaml(role, e) for role, e in entries.items())
    path.write_text(text)
    return path


def test_an_entry_serves_the_file_its_path_resolves_to(tmp_path: Path) -> None:
    hub = tmp_path / "hub"
    link = hf_file(hub, "o/r", "m-Q4_K_M.gguf")
    blob = link.resolve()
    other = tiny_gguf(tmp_path / "models" / "other.gguf")
    config = registry(
        tmp_path,
        by_link=registry_entry("via-link", 8501, model_path=str(link)),
        by_blob=registry_entry("via-blob", 8502, model_path=str(blob)),
        missing=registry_entry("missing", 8503, model_path=str(tmp_path / "gone.gguf")),
    )
    served = served_files(inspect_registry(config.read_text(), config), tmp_path)
    assert served == {blob: ["via-link", "via-blob"]}
    listed = discover([Place(HF, hub), Place(PROJECT, other.parent)], served)
    assert [(i.found.name, i.served_as) for i in listed] == [
        ("o/r/m-Q4_K_M.gguf", ("via-link", "via-blob")),
        ("models/other.gguf", ()),
    ]


def test_no_registry_serves_nothing() -> None:
    assert served_files(None) == {}


def listed_pair() -> list[Listed]:
    known = Found("o/r/m.gguf", HF, "/h/m.gguf", 3 << 30, "qwen3", 40960, "Q4_K_M", "chat")
    unread = Found("models/x.gguf", PROJECT, "/p/x.gguf", 1000, None, None, None, None)
    return [Listed(known, ("a", "b")), Listed(unread, ())]


def test_the_table_is_aligned_and_shows_unknowns_as_question_marks() -> None:
    lines = render_table(listed_pair(), []).splitlines()
    assert lines[0].split() == ["NAME", "SIZE", "QUANT", "CONTEXT", "TYPE", "SERVED", "AS", "PATH"]
    assert lines[1].split() == ["o/r/m.gguf", "3.0G", "Q4_K_M", "40960", "chat", "a,b", "/h/m.gguf"]
    assert lines[2].split() == ["models/x.gguf", "0.0M", "?", "?", "?", "-", "/p/x.gguf"]
    starts = {line.index(word) for line, word in zip(lines, ("PATH", "/h/", "/p/"), strict=True)}
    assert len(starts) == 1


def test_nothing_found_is_said_with_where_we_looked(tmp_path: Path) -> None:
    assert render_table([], []) == (
        "no GGUF models found (looked in: none of the usual folders exists)"
    )
    text = render_table([], [Place(PROJECT, tmp_path)])
    assert text == f"no GGUF models found (looked in: {tmp_path})"


def test_json_is_one_object_per_model() -> None:
    data = json.loads(render_json(listed_pair()))
    assert data[0] == {
        "name": "o/r/m.gguf",
        "store": HF,
        "path": "/h/m.gguf",
        "size": 3 << 30,
        "architecture": "qwen3",
        "context_length": 40960,
        "quantization": "Q4_K_M",
        "type": "chat",
        "served_as": ["a", "b"],
    }
    assert data[1]["type"] is None
    assert json.loads(render_json([])) == []
