"""Following a log file as ``tail -F`` does: appended lines read once, and reading
started again from the top when the file is truncated, rewritten or made again, even
when a look never saw it shorter (a file that no longer begins as it did)."""

from __future__ import annotations

import os
from pathlib import Path

from slm_server.router.dashboard.log_tail import HEAD_BYTES, Follower


def texts(follower: Follower) -> list[str]:
    """The lines a look finds: nothing when the file looks unchanged (as the callers
    skip the poll), else those the poll reads."""
    return [] if follower.unchanged() else [line.text for line in follower.poll()]


def test_appended_lines_are_read_once_and_an_unchanged_file_is_not_read(tmp_path: Path) -> None:
    log = tmp_path / "watchdog.jsonl"
    log.write_bytes(b"one\ntwo\n")
    follower = Follower(log)
    assert [line.text for line in follower.start(10)] == ["one", "two"]
    assert follower.unchanged()
    with log.open("ab") as handle:
        handle.write(b"three\n")
    assert texts(follower) == ["three"]
    assert follower.unchanged()
    assert texts(follower) == []


def test_a_file_truncated_and_written_again_longer_is_read_from_its_start(
    tmp_path: Path,
) -> None:
    """Between two looks the file was truncated in place and written with more than it
    held: its inode is the same and it is no shorter, but it begins otherwise."""
    log = tmp_path / "watchdog.jsonl"
    log.write_bytes(b"old line\n")
    follower = Follower(log)
    follower.start(10)
    with log.open("r+b") as handle:
        handle.truncate(0)
        handle.write(b"new line, longer\nand another\n")
    assert texts(follower) == ["new line, longer", "and another"]
    with log.open("ab") as handle:
        handle.write(b"appended\n")
    assert texts(follower) == ["appended"]


def test_a_file_rewritten_at_the_same_size_is_read_again(tmp_path: Path) -> None:
    """The same inode and the same size: only its modification time says it changed."""
    log = tmp_path / "watchdog.jsonl"
    log.write_bytes(b"first\n")
    follower = Follower(log)
    follower.start(10)
    before = log.stat().st_mtime_ns
    with log.open("r+b") as handle:
        handle.write(b"again\n")
    os.utime(log, ns=(before + 1_000_000, before + 1_000_000))  # a coarse clock's tick
    assert texts(follower) == ["again"]


def test_a_file_that_begins_as_it_did_is_followed_on(tmp_path: Path) -> None:
    """A file longer than the bytes it is known by, written to in place past them and
    appended to: not started again (only its first bytes are compared)."""
    log = tmp_path / "watchdog.jsonl"
    first = b"x" * (HEAD_BYTES + 10) + b"\n"
    log.write_bytes(first)
    follower = Follower(log)
    follower.start(10)
    with log.open("ab") as handle:
        handle.write(b"more\n")
    assert texts(follower) == ["more"]


def test_a_file_deleted_and_made_again_is_read_from_its_start(tmp_path: Path) -> None:
    """Made again with more than the old one held: read from its start whether or not the
    file system gave it the old one's inode number."""
    log = tmp_path / "watchdog.jsonl"
    follower = Follower(log)
    log.write_bytes(b"old\n")
    follower.start(10)
    for n in range(5):
        log.unlink()
        log.write_bytes(b"new %d, longer than before\nsecond %d\n" % (n, n))
        assert texts(follower) == [f"new {n}, longer than before", f"second {n}"]
