"""Appending an entry to the registry's text: everything before it kept byte for byte,
the file's own indent followed, and a file that cannot take one refused."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from slm_server.add.append import NEW_FILE, Unappendable, appended, entries_of, write_atomically

FIELDS = {"id": "new", "backend": "llamacpp", "port": 8502, "model_path": "/a b/m.gguf"}


def test_the_old_text_is_kept_and_the_entry_reads_back() -> None:
    text = "# mine\nmodels:\n  # first\n  a:\n    id: a   # note\n    port: 8501\n  # trailing\n"
    result = appended(text, "new", FIELDS, "m.gguf: added")
    assert result.startswith(text)
    assert result[len(text) :] == (
        "\n  # m.gguf: added\n  new:\n    id: new\n    backend: llamacpp\n"
        "    port: 8502\n    model_path: /a b/m.gguf\n"
    )
    assert list(entries_of(result)) == ["a", "new"]


def test_the_files_own_indent_is_followed_and_a_missing_newline_added() -> None:
    text = "models:\n    a:\n        id: a"
    result = appended(text, "new", FIELDS, "c")
    assert result.startswith(text + "\n")
    assert "\n    new:\n        id: new\n" in result
    assert entries_of(result)["new"] == FIELDS


def test_an_empty_file_becomes_a_registry() -> None:
    assert appended("", "new", FIELDS, "c").startswith(NEW_FILE + "  # c\n  new:\n")
    assert list(entries_of(appended("models:\n# none yet\n", "new", FIELDS, "c"))) == ["new"]


@pytest.mark.parametrize(
    "text", ["models: {a: {id: a}}\n", "models:\n  - id: a\n", "models: ~\nother: 1\n"]
)
def test_a_registry_that_cannot_take_an_appended_entry_is_refused(text: str) -> None:
    with pytest.raises(Unappendable):
        appended(text, "new", FIELDS, "c")


def test_the_write_replaces_the_file_and_keeps_its_mode(tmp_path: Path) -> None:
    path = tmp_path / "models.yaml"
    path.write_text("old\n")
    path.chmod(0o600)
    write_atomically(path, "new\n")
    assert path.read_text() == "new\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert os.listdir(tmp_path) == ["models.yaml"]  # no temporary file left


def test_a_symlinked_registry_stays_a_link_to_the_written_file(tmp_path: Path) -> None:
    real = tmp_path / "real.yaml"
    real.write_text("old\n")
    link = tmp_path / "models.yaml"
    link.symlink_to(real)
    write_atomically(link, "new\n")
    assert link.is_symlink() and real.read_text() == "new\n"


def test_a_new_file_is_created_with_its_folder(tmp_path: Path) -> None:
    path = tmp_path / "config" / "models.yaml"
    write_atomically(path, NEW_FILE)
    assert path.read_text() == NEW_FILE
