"""The launcher's pidfile and state file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slm_server.contracts.records import (
    BackendState,
    PidRecord,
    read_json,
    read_pidfile,
    read_state,
    write_json_atomic,
    write_pidfile,
    write_state,
)

RECORDS = [
    PidRecord(
        pid=4242,
        create_time=1700000000.25,
        port=8501,
        role="standard",
        model_id="smollm2",
        argv=["llama-server", "--model", "/m/a b.gguf"],
    ),
    PidRecord(pid=4343, create_time=1700000001.5, port=8502, role="g", model_id="g", argv=[]),
]
STATES = [
    BackendState(
        role="standard",
        model_id="smollm2",
        backend="llamacpp",
        port=8501,
        state="ready",
        pid=4242,
        since=1700000002.0,
        started_at=1700000000.5,
        exit_status=None,
        restarts=0,
        reason=None,
        log_path="/logs/llama-smollm2-8501.log",
    ),
    BackendState(
        role="gemma",
        model_id="gemma-3",
        backend="llamacpp",
        port=8502,
        state="failed",
        pid=None,
        since=1700000003.0,
        started_at=None,
        exit_status=1,
        restarts=3,
        reason="exited with status 1",
        log_path="/logs/llama-gemma-3-8502.log",
    ),
]


def test_pidfile_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "backends.pids.json"
    write_pidfile(path, 999, RECORDS)
    assert read_pidfile(path) == RECORDS
    raw = json.loads(path.read_text(encoding="utf-8"))
    assert raw["launcher_pid"] == 999
    assert [p["pid"] for p in raw["processes"]] == [4242, 4343]


def test_pidfile_empty_list(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    write_pidfile(path, 1, [])
    assert read_pidfile(path) == []


def test_state_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "backends.state.json"
    write_state(path, 777, STATES)
    assert read_state(path) == (777, STATES)


def test_write_creates_parent_directories(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "state.json"
    write_state(path, 1, STATES[:1])
    assert read_state(path) == (1, STATES[:1])


def test_atomic_write_leaves_no_temp_files(tmp_path: Path) -> None:
    path = tmp_path / "data.json"
    for i in range(3):
        write_json_atomic(path, {"n": i})
    assert [p.name for p in tmp_path.iterdir()] == ["data.json"]
    assert read_json(path) == {"n": 2}
    assert path.read_text(encoding="utf-8").endswith("\n")


def test_failed_write_keeps_the_old_file_and_no_temp(tmp_path: Path) -> None:
    path = tmp_path / "data.json"
    write_json_atomic(path, {"ok": True})
    with pytest.raises(TypeError):
        write_json_atomic(path, {"bad": object()})
    assert [p.name for p in tmp_path.iterdir()] == ["data.json"]
    assert read_json(path) == {"ok": True}


def test_read_json_missing(tmp_path: Path) -> None:
    assert read_json(tmp_path / "absent.json") is None


@pytest.mark.parametrize("content", [b"", b"{not json", b"\xff\xfe\x00garbage", b'{"a": 1'])
def test_read_json_garbage(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "x.json"
    path.write_bytes(content)
    assert read_json(path) is None


def test_read_json_directory(tmp_path: Path) -> None:
    assert read_json(tmp_path) is None


@pytest.mark.parametrize(
    "content",
    [
        "",
        "garbage",
        "[]",
        "null",
        "42",
        "{}",
        '{"processes": 5}',
        '{"processes": null}',
        '{"processes": {"pid": 1}}',
    ],
)
def test_garbage_pidfile_reads_as_empty(tmp_path: Path, content: str) -> None:
    path = tmp_path / "p.json"
    path.write_text(content, encoding="utf-8")
    assert read_pidfile(path) == []


def test_missing_pidfile_reads_as_empty(tmp_path: Path) -> None:
    assert read_pidfile(tmp_path / "absent.json") == []


def test_pidfile_skips_malformed_records(tmp_path: Path) -> None:
    good = {
        "pid": 1,
        "create_time": 2.5,
        "port": 8501,
        "role": "r",
        "model_id": "m",
        "argv": ["a", "b"],
    }
    processes = [
        "a string",
        None,
        {k: v for k, v in good.items() if k != "pid"},
        {**good, "pid": "not a number"},
        {**good, "argv": None},
        good,
        {**good, "pid": "7", "port": 8502.0},
    ]
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"launcher_pid": 1, "processes": processes}), encoding="utf-8")
    assert read_pidfile(path) == [
        PidRecord(pid=1, create_time=2.5, port=8501, role="r", model_id="m", argv=["a", "b"]),
        PidRecord(pid=7, create_time=2.5, port=8502, role="r", model_id="m", argv=["a", "b"]),
    ]


@pytest.mark.parametrize("content", ["", "garbage", "[]", "null", '"text"', "{}"])
def test_garbage_state_reads_as_empty(tmp_path: Path, content: str) -> None:
    path = tmp_path / "s.json"
    path.write_text(content, encoding="utf-8")
    assert read_state(path) == (None, [])


def test_missing_state_reads_as_empty(tmp_path: Path) -> None:
    assert read_state(tmp_path / "absent.json") == (None, [])


def test_state_skips_records_of_the_wrong_shape(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    write_state(path, 5, STATES)
    data = json.loads(path.read_text(encoding="utf-8"))
    data["backends"].insert(0, {"role": "only"})
    data["backends"].append({**data["backends"][1], "unexpected": 1})
    data["backends"].append("text")
    path.write_text(json.dumps(data), encoding="utf-8")
    assert read_state(path) == (5, STATES)


@pytest.mark.parametrize("pid", ['"5"', "null", "5.5", "[5]"])
def test_state_with_a_bad_launcher_pid(tmp_path: Path, pid: str) -> None:
    path = tmp_path / "s.json"
    path.write_text(f'{{"launcher_pid": {pid}, "backends": []}}', encoding="utf-8")
    assert read_state(path) == (None, [])


@pytest.mark.parametrize("backends", ["null", "5"])
def test_state_with_non_list_backends_reads_as_empty(tmp_path: Path, backends: str) -> None:
    path = tmp_path / "s.json"
    path.write_text(f'{{"launcher_pid": 3, "backends": {backends}}}', encoding="utf-8")
    assert read_state(path) == (3, [])
