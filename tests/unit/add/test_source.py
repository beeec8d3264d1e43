"""The file ``add`` is given: a path, or a name as ``models`` lists it."""

from __future__ import annotations

from pathlib import Path

import pytest

from slm_server.add.source import NotFound, Source, find_source
from slm_server.discover.places import OLLAMA
from tests.unit.discover.stores import ollama_model, tiny_gguf


def test_a_path_is_taken_as_it_is_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = tiny_gguf(tmp_path / "m.gguf")
    monkeypatch.chdir(tmp_path)
    assert find_source("m.gguf", {}, tmp_path / "none") == Source(model, "m.gguf", None)


def test_a_listed_name_is_found_in_its_store(tmp_path: Path) -> None:
    blob = ollama_model(tmp_path / ".ollama" / "models", "qwen3", "0.6b")
    found = find_source("ollama:qwen3:0.6b", {"HOME": str(tmp_path)}, tmp_path / "none")
    assert found == Source(blob, "ollama:qwen3:0.6b", OLLAMA)


def test_a_folder_or_an_unknown_name_is_refused(tmp_path: Path) -> None:
    with pytest.raises(NotFound, match="is not a file"):
        find_source(str(tmp_path), {"HOME": str(tmp_path)}, tmp_path / "none")
    with pytest.raises(NotFound, match="`python -m slm_server models` lists the names"):
        find_source("ollama:absent:1b", {"HOME": str(tmp_path)}, tmp_path / "none")
