"""Restart request files: atomic writes, taking them, staleness."""

from __future__ import annotations

import json
import re
from dataclasses import asdict
from pathlib import Path

import pytest

from slm_server.contracts.restart_requests import (
    RestartRequest,
    is_stale,
    take_requests,
    write_request,
)

NAME = re.compile(r"^(?P<port>\d+)-(?P<role>[A-Za-z0-9_-]+)-(?P<ns>\d+)\.json$")


def request(
    role: str = "standard",
    *,
    port: int = 8501,
    requested_at: float = 1_700_000_000.5,
    reason: str = "5xx",
    detail: str | None = None,
) -> RestartRequest:
    return RestartRequest(
        role=role,
        model_id=f"{role}-model",
        port=port,
        reason=reason,
        requested_at=requested_at,
        detail=detail,
    )


def test_round_trip(tmp_path: Path) -> None:
    sent = request(detail="two 502s in a row")
    path = write_request(tmp_path, sent)
    assert path.parent == tmp_path
    assert path.is_file()
    assert json.loads(path.read_text(encoding="utf-8")) == asdict(sent)
    assert take_requests(tmp_path) == [sent]
    assert list(tmp_path.iterdir()) == []


def test_round_trip_without_detail(tmp_path: Path) -> None:
    sent = request()
    write_request(tmp_path, sent)
    assert take_requests(tmp_path) == [sent]


def test_file_name(tmp_path: Path) -> None:
    path = write_request(tmp_path, request("standard", port=8501))
    match = NAME.match(path.name)
    assert match is not None, path.name
    assert match["port"] == "8501"
    assert match["role"] == "standard"


@pytest.mark.parametrize(
    ("role", "safe"),
    [
        ("a/b c", "a_b_c"),
        ("../escape", "___escape"),
        ("snake_and-dash", "snake_and-dash"),
        ("dotted.role", "dotted_role"),
    ],
)
def test_file_name_sanitises_the_role(tmp_path: Path, role: str, safe: str) -> None:
    sent = request(role)
    path = write_request(tmp_path, sent)
    assert path.parent == tmp_path
    assert path.name.startswith(f"8501-{safe}-")
    assert take_requests(tmp_path) == [sent]  # the role itself is kept verbatim


def test_write_leaves_no_temp_files(tmp_path: Path) -> None:
    for i in range(5):
        write_request(tmp_path, request(port=8500 + i))
    names = sorted(p.name for p in tmp_path.iterdir())
    assert len(names) == 5
    assert all(NAME.match(n) for n in names), names
    assert not [n for n in names if n.startswith(".") or n.endswith(".tmp")]


def test_write_creates_the_directory(tmp_path: Path) -> None:
    directory = tmp_path / "a" / "b" / "requests"
    path = write_request(directory, request())
    assert path.parent == directory
    assert take_requests(directory) == [request()]


def test_failed_write_removes_its_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(src: str, dst: Path) -> None:
        raise OSError("rename refused")

    monkeypatch.setattr("slm_server.contracts.restart_requests.os.replace", refuse)
    with pytest.raises(OSError, match="rename refused"):
        write_request(tmp_path, request())
    assert list(tmp_path.iterdir()) == []


def test_write_into_a_file_raises_oserror(tmp_path: Path) -> None:
    blocker = tmp_path / "blocker"
    blocker.write_text("not a directory")
    with pytest.raises(NotADirectoryError):
        write_request(blocker / "requests", request())


def test_missing_directory_is_empty(tmp_path: Path) -> None:
    assert take_requests(tmp_path / "nope") == []


def test_empty_directory(tmp_path: Path) -> None:
    assert take_requests(tmp_path) == []


def test_oldest_first(tmp_path: Path) -> None:
    late = request("late", port=8503, requested_at=300.0)
    early = request("early", port=8502, requested_at=100.0)
    middle = request("middle", port=8501, requested_at=200.0)
    for sent in (late, early, middle):
        write_request(tmp_path, sent)
    assert take_requests(tmp_path) == [early, middle, late]
    assert list(tmp_path.iterdir()) == []


def test_take_removes_everything_it_returns(tmp_path: Path) -> None:
    write_request(tmp_path, request())
    assert len(take_requests(tmp_path)) == 1
    assert take_requests(tmp_path) == []


def test_two_requests_for_one_backend_are_both_kept(tmp_path: Path) -> None:
    first = request(requested_at=1.0, reason="5xx")
    second = request(requested_at=2.0, reason="stall")
    write_request(tmp_path, first)
    write_request(tmp_path, second)
    assert take_requests(tmp_path) == [first, second]


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"{not json",
        b"[1, 2, 3]",
        b'"a string"',
        b"null",
        b"42",
        b"{}",
        b'{"role": "r", "model_id": "m", "port": 1, "reason": "5xx"}',
        b'{"role": "r", "model_id": "m", "port": "eighty", "reason": "5xx", "requested_at": 1}',
        b'{"role": "r", "model_id": "m", "port": 1, "reason": "5xx", "requested_at": "soon"}',
        b'{"role": "r", "model_id": "m", "port": null, "reason": "5xx", "requested_at": 1}',
        b"\xff\xfe\x00garbage",
    ],
    ids=lambda c: c[:24].decode("latin-1"),
)
def test_garbage_is_returned_as_a_name_and_removed(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "8501-standard-1.json").write_bytes(content)
    assert take_requests(tmp_path) == ["8501-standard-1.json"]
    assert list(tmp_path.iterdir()) == []


def test_garbage_among_good_requests(tmp_path: Path) -> None:
    good = request(requested_at=50.0)
    write_request(tmp_path, good)
    (tmp_path / "zz-garbage.json").write_text("{")
    (tmp_path / "00-garbage.json").write_text("[]")
    taken = take_requests(tmp_path)
    assert sorted(t for t in taken if isinstance(t, str)) == ["00-garbage.json", "zz-garbage.json"]
    assert [t for t in taken if isinstance(t, RestartRequest)] == [good]
    assert list(tmp_path.iterdir()) == []


def test_only_json_files_are_taken(tmp_path: Path) -> None:
    in_flight = tmp_path / ".req-abc.tmp"
    in_flight.write_text(json.dumps(asdict(request())))
    other = tmp_path / "notes.txt"
    other.write_text("hello")
    assert take_requests(tmp_path) == []
    assert in_flight.exists()
    assert other.exists()


def test_extra_keys_are_ignored_and_values_coerced(tmp_path: Path) -> None:
    raw = {
        "role": "standard",
        "model_id": "m",
        "port": "8501",
        "reason": "5xx",
        "requested_at": 12,
        "extra": True,
    }
    (tmp_path / "x.json").write_text(json.dumps(raw))
    assert take_requests(tmp_path) == [
        RestartRequest("standard", "m", 8501, "5xx", 12.0, detail=None)
    ]


def test_request_is_frozen() -> None:
    sent = request()
    with pytest.raises(AttributeError):
        sent.port = 1  # type: ignore[misc]


STARTED = 1_700_000_000.0
GRACE = 180.0


@pytest.mark.parametrize(
    ("requested_at", "stale"),
    [
        (STARTED - 3600.0, True),
        (STARTED - 0.001, True),
        (STARTED, True),
        (STARTED + GRACE - 0.001, True),
        (STARTED + GRACE, False),
        (STARTED + GRACE + 0.001, False),
        (STARTED + 10 * GRACE, False),
    ],
)
def test_is_stale_boundaries(requested_at: float, stale: bool) -> None:
    assert is_stale(request(requested_at=requested_at), STARTED, GRACE) is stale


def test_is_stale_without_grace() -> None:
    assert is_stale(request(requested_at=STARTED - 0.001), STARTED, 0.0)
    assert not is_stale(request(requested_at=STARTED), STARTED, 0.0)
