"""The disk side of a pull: checked files, free space, names that stay inside."""

from __future__ import annotations

import errno
import hashlib
import os
from pathlib import Path

import pytest

from slm_server.pull import files as disk
from slm_server.pull.errors import PullError


def test_a_file_with_another_checksum_is_removed_and_refused(tmp_path: Path) -> None:
    staged = tmp_path / "staged"
    staged.write_bytes(b"abcd")
    with pytest.raises(PullError) as raised:
        disk.verify(staged, 4, hashlib.sha256(b"abce").hexdigest(), "m.gguf")
    assert raised.value.kind == "checksum"
    assert not staged.exists()


def test_a_file_of_another_size_is_removed_and_refused(tmp_path: Path) -> None:
    staged = tmp_path / "staged"
    staged.write_bytes(b"abc")
    with pytest.raises(PullError, match="3 bytes arrived, the hub says 4"):
        disk.verify(staged, 4, None, "m.gguf")
    assert not staged.exists()


def test_a_checked_file_is_kept(tmp_path: Path) -> None:
    staged = tmp_path / "staged"
    staged.write_bytes(b"abcd")
    disk.verify(staged, 4, hashlib.sha256(b"abcd").hexdigest(), "m.gguf")
    final = tmp_path / "o" / "r" / "m.gguf"
    disk.move_into_place(staged, final)
    assert final.read_bytes() == b"abcd" and not staged.exists()


def test_already_there_needs_size_and_checksum(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    assert not disk.already_there(path, 4, None)
    path.write_bytes(b"abcd")
    assert disk.already_there(path, 4, hashlib.sha256(b"abcd").hexdigest())
    assert not disk.already_there(path, 4, hashlib.sha256(b"abce").hexdigest())
    assert not disk.already_there(path, 5, None)


def test_space_is_refused_before_anything_is_fetched(tmp_path: Path) -> None:
    free = disk.free_bytes(tmp_path)
    assert disk.check_space(tmp_path, 10) == free
    with pytest.raises(PullError) as raised:
        disk.check_space(tmp_path, free + 1)
    assert raised.value.kind == "no_space"


def test_free_space_is_read_where_the_folder_will_be(tmp_path: Path) -> None:
    assert disk.free_bytes(tmp_path / "not" / "yet") == disk.free_bytes(tmp_path)


def test_a_full_disk_error_is_named() -> None:
    assert disk.no_space(OSError(errno.ENOSPC, "full"), Path("/m")) is not None
    assert disk.no_space(OSError(errno.EACCES, "denied"), Path("/m")) is None


def test_a_symlink_planted_in_the_models_folder_cannot_lead_out(tmp_path: Path) -> None:
    root = tmp_path / "models"
    (root / "o").mkdir(parents=True)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    os.symlink(outside, root / "o" / "r")
    with pytest.raises(PullError) as raised:
        disk.within(root, "o/r/m.gguf")
    assert raised.value.kind == "unsafe_name"
    assert disk.within(root, "o/x/m.gguf") == root / "o" / "x" / "m.gguf"


def test_two_pulls_of_one_partial_file_are_not_interleaved(tmp_path: Path) -> None:
    partial = tmp_path / ".pull" / "ollama" / "sha256-ab.partial"
    with disk.exclusive(partial, "m.gguf"):
        with pytest.raises(PullError) as raised, disk.exclusive(partial, "m.gguf"):
            pass
        assert raised.value.kind == "in_progress"
    with disk.exclusive(partial, "m.gguf"):
        pass  # free again once the first is done
