"""The registry in force as both processes see it: the snapshot is read back only when
it holds the stamped version, and the state file carries the stamp and the retiring
backends (malformed ones are dropped, never trusted)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from slm_server.contracts import applied_registry as applied
from slm_server.contracts.applied_registry import RegistryStamp, Retiring
from slm_server.contracts.commands import Command, CommandError, Reply, parse_command, parse_reply
from slm_server.contracts.records import read_state_file, write_state

TEXT = "models:\n  a:\n    id: a\n"


def test_the_snapshot_is_read_back_only_for_its_own_version(tmp_path: Path) -> None:
    applied.write_snapshot(tmp_path, TEXT)
    version = applied.version_of(TEXT)
    assert len(version) == 16
    assert applied.read_snapshot(tmp_path, version) == TEXT
    assert applied.read_snapshot(tmp_path, applied.version_of("other")) is None
    mode = stat.S_IMODE(os.stat(applied.snapshot_path(tmp_path)).st_mode)
    assert mode == 0o600
    # A forged snapshot (another text under the stamped version) is not taken.
    applied.snapshot_path(tmp_path).write_text(TEXT + "# forged\n")
    assert applied.read_snapshot(tmp_path, version) is None


def test_an_oversized_or_missing_snapshot_is_none(tmp_path: Path) -> None:
    assert applied.read_snapshot(tmp_path, "0" * 16) is None
    big = "#" * (applied.MAX_SNAPSHOT_BYTES + 1)
    applied.snapshot_path(tmp_path).write_text(big)
    assert applied.read_snapshot(tmp_path, applied.version_of(big)) is None


def test_the_state_file_carries_the_stamp_and_the_retiring(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    stamp = RegistryStamp(applied.version_of(TEXT), 3, 1700000000.5, "/c/models.yaml")
    retiring = [Retiring("a", "m", 8501, 4242, "replaced", 1.0, 31.0)]
    write_state(path, 7, [], None, stamp, retiring)
    state = read_state_file(path)
    assert state.registry == stamp
    assert state.retiring == retiring
    write_state(path, 7, [])
    assert read_state_file(path).registry is None and read_state_file(path).retiring == []


@pytest.mark.parametrize(
    "raw",
    [
        None,
        "x",
        {"version": "short", "generation": 1, "loaded_at": 1.0, "path": "p"},
        {"version": "0" * 16, "generation": 0, "loaded_at": 1.0, "path": "p"},
        {"version": "0" * 16, "generation": True, "loaded_at": 1.0, "path": "p"},
        {"version": "0" * 16, "generation": 1, "loaded_at": "now", "path": "p"},
    ],
)
def test_a_malformed_stamp_is_none(raw: object) -> None:
    assert RegistryStamp.from_json(raw) is None


@pytest.mark.parametrize(
    "raw",
    [
        {
            "role": "a",
            "model_id": "m",
            "port": 1,
            "pid": 0,
            "reason": "removed",
            "since": 1,
            "deadline": 2,
        },
        {
            "role": "a",
            "model_id": "m",
            "port": 1,
            "pid": 5,
            "reason": "gone",
            "since": 1,
            "deadline": 2,
        },
        {
            "role": 1,
            "model_id": "m",
            "port": 1,
            "pid": 5,
            "reason": "removed",
            "since": 1,
            "deadline": 2,
        },
        {"role": "a", "model_id": "m", "port": 1, "pid": 5, "reason": "removed"},
    ],
)
def test_a_malformed_retiring_record_is_dropped(raw: object) -> None:
    assert Retiring.from_json(raw) is None


def test_the_reload_and_retired_commands_parse() -> None:
    assert parse_command(b'{"op":"reload"}\n') == Command("reload")
    assert parse_command(b'{"op":"retired","role":"a","pid":42}') == Command("retired", "a", pid=42)
    for bad in (b'{"op":"retired","role":"a"}', b'{"op":"retired","role":"a","pid":true}'):
        with pytest.raises(CommandError, match="pid"):
            parse_command(bad)
    with pytest.raises(CommandError, match="reload"):
        parse_command(b'{"op":"explode"}')


def test_a_reload_reply_round_trips() -> None:
    reply = Reply(
        True,
        version="0" * 16,
        generation=2,
        added=("b",),
        removed=(),
        replaced=("a",),
        unchanged=(),
    )
    assert parse_reply(reply.encode()) == reply
    refused = Reply(False, error="bad", problems=("one", "two"), refused="invalid")
    assert parse_reply(refused.encode()) == refused
    assert refused.to_json()["problems"] == ["one", "two"]
