"""``GET /v1/ui/history`` under attack, in-process through the production app: a forged
``logs/watchdog.jsonl`` (lines of a megabyte, invalid UTF-8, JSON that is not an object
or nested past the parser's depth, times that are not finite, too large, negative or far
ahead, huge and marked-up fields, a flood of lines, the file replaced, truncated,
deleted or made a FIFO while followed), hostile ``since`` values, the key rule, and many
pages polling while traffic flows. Whatever the log holds, the history keeps sampling,
the endpoint answers strict JSON in which every column has one value per time, and the
events kept stay bounded. Two checks on the pure core follow: an event noted after a
sample still reaches a page that has that sample, and a wall clock stepped back does not
stall a page that asks with ``since``."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from starlette.routing import Route

from benchmarks.history_memory import reachable_bytes
from slm_server.router.dashboard.history import (
    MAX_EVENTS,
    SERIES,
    Buckets,
    History,
    Snapshot,
)
from slm_server.router.dashboard.history_api import HistoryApi
from slm_server.router.dashboard.timeline import (
    LANES,
    MAX_NAME_CHARS,
    MAX_REASON_CHARS,
    Event,
    event_of,
)
from tests.unit.router.dashboard.history_router import (
    CHAT,
    HISTORY,
    KEY,
    MODEL,
    router_at,
)
from tests.unit.router.inprocess import (
    Answer,
    Router,
    call,
    serving,
)

EVENT_FIELDS = {"ts", "event", "role", "model", "lane", "mark", "reason"}
MARKUP_MODEL = '<img src=x onerror="window.slmInjected=1">'
MARKUP_REASON = "</title><script>window.slmInjected=2</script><svg onload=alert(1)>"


def run(scenario: Awaitable[None], seconds: float = 60) -> None:
    asyncio.run(asyncio.wait_for(scenario, seconds))


def log_of(router: Router) -> Path:
    path = router.settings.watchdog.log_path
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def append(path: Path, data: bytes) -> None:
    with path.open("ab") as handle:
        handle.write(data)


def record(**fields: Any) -> bytes:
    """One log line of ``fields`` (NaN and infinities written as Python writes them)."""
    return (json.dumps(fields) + "\n").encode()


def strict_json(body: bytes) -> Any:
    """``body`` as JSON, refusing what JSON has not (NaN, Infinity) and invalid UTF-8."""

    def refuse(constant: str) -> Any:
        raise AssertionError(f"{constant} in the answer: not JSON")

    return json.loads(body.decode("utf-8"), parse_constant=refuse)


async def ask(router: Router, query: str = "", headers: dict[str, str] | None = None) -> Answer:
    """``GET /v1/ui/history<query>``; an exception out of the app fails the test saying
    so (it would be a 500 to a real client)."""
    try:
        return await call(
            router.app,
            HISTORY + query,
            b"",
            method="GET",
            headers=KEY if headers is None else headers,
        )
    except Exception as error:  # the app let an exception out: a 500 for a real client
        pytest.fail(f"GET {HISTORY}{query[:60]} raised {error!r}")


def consistent(answer: dict[str, Any], since: float | None = None) -> None:
    """Every invariant one answer must hold: ``times`` strictly increasing and finite,
    every column one value per time (all newer than ``since`` when it was given), lanes
    named, events bounded and well-formed."""
    assert answer["object"] == "ui.history"
    times = answer["times"]
    count = len(times)
    assert all(isinstance(t, int | float) and math.isfinite(t) for t in times), times
    assert all(a < b for a, b in itertools.pairwise(times)), times
    assert set(answer["machine"]) == {"free_mb", "floor_mb", "budget_mb", "held_mb"}
    for name, values in answer["machine"].items():
        assert len(values) == count, (name, len(values), count)
    for model in answer["models"]:
        assert set(model["series"]) == set(SERIES), model["model"]
        for name, values in model["series"].items():
            assert len(values) == count, (model["model"], name, len(values), count)
    for backend in answer["backends"]:
        assert len(backend["states"]) == count, (backend["role"], len(backend["states"]), count)
        assert all(s is None or s in LANES for s in backend["states"]), backend["states"]
    events = answer["events"]
    assert len(events) <= MAX_EVENTS
    for event in events:
        assert set(event) == EVENT_FIELDS, event
        assert isinstance(event["ts"], int | float) and math.isfinite(event["ts"]), event
        assert event["reason"] is None or len(event["reason"]) <= MAX_REASON_CHARS
        for name in ("role", "model"):
            assert event[name] is None or len(event[name]) <= MAX_NAME_CHARS
    if since is not None:  # (events go with the sample they were read with, not by ts)
        assert all(t > since for t in times), (since, times[:3])


async def history(router: Router, query: str = "", since: float | None = None) -> dict[str, Any]:
    """The history, which must be a 200 of strict JSON holding every invariant."""
    got = await ask(router, query)
    assert got.status == 200, got.body[:500]
    assert got.headers.get("content-type", "").startswith("application/json")
    answer: dict[str, Any] = strict_json(got.body)
    consistent(answer, since)
    return answer


async def history_until(
    router: Router,
    condition: Callable[[dict[str, Any]], bool],
    what: str,
    seconds: float = 10.0,
) -> dict[str, Any]:
    """The history once ``condition`` holds of it (asked every 20 ms until ``seconds``)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while True:
        answer = await history(router)
        if condition(answer):
            return answer
        assert loop.time() < deadline, f"never: {what} (times: {len(answer['times'])})"
        await asyncio.sleep(0.02)


async def more_samples(router: Router, count: int, what: str, seconds: float = 10.0) -> None:
    """Wait until ``count`` more samples than now have been taken."""
    before = len((await history(router))["times"])
    await history_until(router, lambda a: len(a["times"]) >= before + count, what, seconds)


def roles(answer: dict[str, Any]) -> list[str | None]:
    return [e["role"] for e in answer["events"]]


def has_role(role: str) -> Callable[[dict[str, Any]], bool]:
    return lambda answer: role in roles(answer)


def the_history(router: Router) -> History:
    """The history the production app answers from (its endpoint's own)."""
    for route in router.app.routes:
        if isinstance(route, Route) and route.path == HISTORY:
            api = getattr(route.endpoint, "__self__", None)
            assert isinstance(api, HistoryApi)
            return api.history
    raise AssertionError(f"no route {HISTORY}")


# -- a forged log -----------------------------------------------------------------------


@dataclass
class Forged:
    """Hostile log lines, and what the history must answer of them: ``kept`` by role
    (the event as answered), ``dropped`` the roles that must not be answered, and
    ``either`` those answered or not (when answered, at the time given, or at the time of
    their sample when the time given is later)."""

    data: bytes = b""
    kept: dict[str, dict[str, Any]] = field(default_factory=dict)
    dropped: set[str] = field(default_factory=set)
    either: dict[str, float] = field(default_factory=dict)


def forged_log(now: float) -> Forged:
    forged = Forged()
    lines: list[bytes] = []

    def dropped(role: str, line: bytes) -> None:
        forged.dropped.add(role)
        lines.append(line)

    # A line of a megabyte (a valid event but for its length): cut, so never answered.
    big = b"x" * (1 << 20)
    dropped(
        "mega",
        b'{"event":"backend_failure","ts":%d,"role":"mega","reason":"%s"}\n' % (int(now), big),
    )
    lines.append(b"\xff\xfe\xfd\xc0\xaf not UTF-8 at all\n")
    # Invalid UTF-8 inside a string of an otherwise good event: replaced, the event kept.
    lines.append(
        b'{"event":"backend_failure","ts":%.3f,"role":"utf8","model_id":"m",'
        b'"reason":"bad \xff\xfe bytes"}\n' % now
    )
    forged.kept["utf8"] = {
        "ts": round(now, 3),
        "event": "backend_failure",
        "model": "m",
        "lane": "suspected",
        "mark": None,
        "reason": "bad \ufffd\ufffd bytes",
    }
    for text in (
        b'[{"event":"backend_loaded","ts":1,"role":"list"}]',
        b'"backend_loaded"',
        b"42",
        b"null",
        b"true",
        b"{}",
        b'{"event":"backend_loaded","ts":1,"role":"unfinished"',
    ):
        lines.append(text + b"\n")
    forged.dropped |= {"list", "unfinished"}
    # Nested past the parser's depth (just under the 8 KiB a line may have).
    depth = 4000
    dropped(
        "deep",
        b'{"event":"backend_loaded","ts":1,"role":"deep","x":'
        + b"[" * depth
        + b"]" * depth
        + b"}\n",
    )
    # Nested within it, as a model id: kept as text, cut to a name's length.
    nested = "[" * 300 + "]" * 300
    lines.append(
        b'{"event":"backend_loaded","ts":%.3f,"role":"nested","model_id":%s}\n'
        % (now, nested.encode())
    )
    forged.kept["nested"] = {
        "ts": round(now, 3),
        "event": "backend_loaded",
        "model": nested[:MAX_NAME_CHARS],
        "lane": "ready",
        "mark": "load",
        "reason": None,
    }
    # Times that are no time: never answered.
    for role, ts in (
        ("nan", b"NaN"),
        ("inf", b"Infinity"),
        ("minus-inf", b"-Infinity"),
        ("1e400", b"1e400"),
        ("words", b'"yesterday"'),
        ("bool", b"true"),
        ("null", b"null"),
        ("list", b"[1]"),
        ("object", b'{"s":1}'),
        ("iso-garbage", b'"2026-13-45T99:99:99Z"'),
    ):
        dropped(role, b'{"event":"backend_failure","ts":%s,"role":"%s"}\n' % (ts, role.encode()))
    dropped("no-ts", b'{"event":"backend_failure","role":"no-ts"}\n')
    # Times that are times, if odd ones: answered as given, or not at all.
    for role, value, stamp in (
        ("negative", -5.0, b"-5"),
        ("most-negative", -1e308, b"-1e308"),
        ("far-ahead", 1e308, b"1e308"),
        ("year-9999", 253402300799.999, b'"9999-12-31T23:59:59.999Z"'),
        ("year-1", -62135596800.0, b'"0001-01-01T00:00:00Z"'),
    ):
        forged.either[role] = value
        lines.append(b'{"event":"backend_failure","ts":%s,"role":"%s"}\n' % (stamp, role.encode()))
    # Names that are not lifecycle events.
    for name in (b'"rm_rf"', b"7", b'"__proto__"', b'"toString"', b"null"):
        lines.append(b'{"event":%s,"ts":%.3f,"role":"not-event"}\n' % (name, now))
    forged.dropped.add("not-event")
    # Huge fields within a line: cut to what is kept.
    lines.append(record(event="backend_failure", ts=now, role="huge-reason", reason="r" * 7000))
    forged.kept["huge-reason"] = {
        "ts": now,
        "event": "backend_failure",
        "model": None,
        "lane": "suspected",
        "mark": None,
        "reason": "r" * MAX_REASON_CHARS,
    }
    lines.append(record(event="backend_unloaded", ts=now, role="R" * 3000, model_id="M" * 3000))
    forged.kept["R" * MAX_NAME_CHARS] = {
        "ts": now,
        "event": "backend_unloaded",
        "model": "M" * MAX_NAME_CHARS,
        "lane": "unloaded",
        "mark": "unload",
        "reason": None,
    }
    # Markup and control characters: kept verbatim, as text.
    lines.append(
        record(
            event="backend_failure",
            ts=now,
            role="markup",
            model_id=MARKUP_MODEL,
            reason=MARKUP_REASON,
        )
    )
    forged.kept["markup"] = {
        "ts": now,
        "event": "backend_failure",
        "model": MARKUP_MODEL,
        "lane": "suspected",
        "mark": None,
        "reason": MARKUP_REASON,
    }
    lines.append(record(event="backend_failure", ts=now, role="nul", reason="a\u0000b\u2028c\r"))
    forged.kept["nul"] = {
        "ts": now,
        "event": "backend_failure",
        "model": None,
        "lane": "suspected",
        "mark": None,
        "reason": "a\u0000b\u2028c\r",
    }
    lines.append(record(event="backend_loaded", ts=now, role="crlf").rstrip(b"\n") + b"\r\n")
    forged.kept["crlf"] = {
        "ts": now,
        "event": "backend_loaded",
        "model": None,
        "lane": "ready",
        "mark": "load",
        "reason": None,
    }
    lines.append(b"\n\n   \n")
    lines.append(record(event="backend_loaded", ts=now, role="last", reason="the last line"))
    forged.kept["last"] = {
        "ts": now,
        "event": "backend_loaded",
        "model": None,
        "lane": "ready",
        "mark": "load",
        "reason": "the last line",
    }
    forged.data = b"".join(lines)
    return forged


def answered_as_forged(answer: dict[str, Any], forged: Forged) -> None:
    """The forged log's events as the history must answer them, in the log's order."""
    by_role = {e["role"]: e for e in answer["events"]}
    for role, expected in forged.kept.items():
        assert role in by_role, (role[:40], [r and r[:40] for r in roles(answer)])
        assert {**by_role[role], "role": None} == {**expected, "role": None}, role[:40]
    for role in forged.dropped:
        assert role not in by_role, (role, by_role[role])
    for role, ts in forged.either.items():
        if role in by_role:
            got = by_role[role]["ts"]
            assert got == ts or (ts > got and got in answer["times"]), (role, by_role[role])
    kept_order = [r for r in roles(answer) if r in forged.kept]
    assert kept_order == [r for r in forged.kept if r in kept_order]


def test_a_hostile_log_already_there_is_read_as_far_as_it_makes_sense(tmp_path: Path) -> None:
    router = router_at(tmp_path)
    forged = forged_log(time.time())
    append(log_of(router), forged.data)

    async def scenario() -> None:
        async with serving(router):
            answer = await history_until(
                router, lambda a: len(a["times"]) >= 3 and "last" in roles(a), "samples and events"
            )
            answered_as_forged(answer, forged)
            await more_samples(router, 2, "sampling to go on")

    run(scenario())


def test_a_hostile_log_appended_in_pieces_while_followed_is_read_as_far_as_it_makes_sense(
    tmp_path: Path,
) -> None:
    """The same lines written in pieces that cut lines (and a UTF-8 sequence) in two,
    one piece per sample: the follower's partial lines are put together or skipped."""
    router = router_at(tmp_path)
    log = log_of(router)
    log.write_bytes(b"")
    forged = forged_log(time.time())

    async def scenario() -> None:
        async with serving(router):
            await more_samples(router, 2, "the first samples")
            piece = 65_537 + 11
            for start in range(0, len(forged.data), piece):
                append(log, forged.data[start : start + piece])
                await more_samples(router, 1, "a sample after each piece")
            answer = await history_until(router, has_role("last"), "the last forged event")
            answered_as_forged(answer, forged)

    run(scenario())


HUGE_INTEGER = "1" + "0" * 400  # a JSON number Python reads as an int, too large for a float


def test_a_time_too_large_for_a_float_in_the_log_at_start_does_not_stop_the_history(
    tmp_path: Path,
) -> None:
    """``"ts": 1000…0`` (401 digits) is an integer to ``json``; ``float()`` of it raises
    OverflowError. Already in the log when the router starts, it must be skipped like
    any other time that is no time, and sampling must go on."""
    router = router_at(tmp_path)
    log = log_of(router)
    append(log, record(event="backend_loaded", ts=time.time(), role="before"))
    append(log, b'{"event":"backend_loaded","ts":%s,"role":"huge"}\n' % HUGE_INTEGER.encode())
    append(log, record(event="backend_loaded", ts=time.time(), role="after"))

    async def scenario() -> None:
        async with serving(router):
            answer = await history_until(
                router, lambda a: len(a["times"]) >= 3, "three samples", seconds=5
            )
            assert roles(answer) == ["before", "after"]

    run(scenario())


def test_a_time_too_large_for_a_float_appended_loses_nothing_beside_it(tmp_path: Path) -> None:
    """The same line appended while the log is followed, between two good events written
    with it: both good events are answered."""
    router = router_at(tmp_path)
    log = log_of(router)
    log.write_bytes(b"")

    async def scenario() -> None:
        async with serving(router):
            await more_samples(router, 2, "the first samples")
            append(
                log,
                record(event="backend_failure", ts=time.time(), role="before")
                + b'{"event":"backend_loaded","ts":%s,"role":"huge"}\n' % HUGE_INTEGER.encode()
                + record(event="backend_loaded", ts=time.time(), role="after"),
            )
            answer = await history_until(
                router, has_role("after"), "the event after the huge time", seconds=5
            )
            assert roles(answer) == ["before", "after"]

    run(scenario())


def test_a_lone_surrogate_in_a_forged_event_does_not_break_the_answer(tmp_path: Path) -> None:
    r"""JSON may escape a lone UTF-16 surrogate (``"\ud800"``); ``json`` reads it into a
    str that cannot be encoded as UTF-8. The history must still answer (strict JSON),
    with the event's text or without it."""
    router = router_at(tmp_path)
    log = log_of(router)
    append(log, record(event="backend_loaded", ts=time.time(), role="before"))
    append(
        log,
        b'{"event":"backend_failure","ts":%.3f,"role":"surrogate","model_id":"\\ud800<b>",'
        b'"reason":"\\udfff"}\n' % time.time(),
    )
    append(log, record(event="backend_loaded", ts=time.time(), role="after"))

    async def scenario() -> None:
        async with serving(router):
            await history_until(router, lambda a: len(a["times"]) >= 2, "two samples")
            answer = await history(router)
            assert "after" in roles(answer)
            before = answer["times"][0] - 1
            later = await history(router, f"?since={before!r}", before)
            assert "after" in roles(later)

    run(scenario())


# -- the file itself --------------------------------------------------------------------


def test_the_log_replaced_truncated_and_deleted_while_followed(tmp_path: Path) -> None:
    """Rotated (renamed away and made again), truncated in place, deleted, made again,
    replaced by a rename over it: each new file's events are answered once, and samples
    go on while the file is missing."""
    router = router_at(tmp_path)
    log = log_of(router)
    append(log, record(event="backend_loaded", ts=time.time(), role="a", reason="x" * 200))

    async def scenario() -> None:
        async with serving(router):
            await history_until(router, has_role("a"), "the first file's event")
            log.rename(log.with_name(log.name + ".prev"))
            append(log, record(event="backend_loaded", ts=time.time(), role="b", reason="x" * 200))
            await history_until(router, has_role("b"), "the rotated file's event")
            with log.open("r+b") as handle:  # the trimmer: truncated in place
                handle.truncate(0)
            append(log, record(event="backend_loaded", ts=time.time(), role="c"))  # shorter
            await history_until(router, has_role("c"), "the truncated file's event")
            # Made before the log is deleted, so that it cannot take the log's inode.
            replacement = log.with_name("replacement.jsonl")
            replacement.write_bytes(b"")
            log.unlink()
            await more_samples(router, 3, "samples while the log is missing")
            append(
                replacement,
                record(event="backend_loaded", ts=time.time(), role="d")
                + record(event="backend_loaded", ts=time.time(), role="e"),
            )
            os.replace(replacement, log)
            answer = await history_until(router, has_role("e"), "the replacement's events")
            assert roles(answer) == ["a", "b", "c", "d", "e"]

    run(scenario())


def test_the_log_deleted_and_written_again_longer_is_read_from_its_start(tmp_path: Path) -> None:
    """Deleted and made again at once, longer than the old file, ten times over: each new
    file's first event is answered. A file system that gives the new file the old one's
    inode number (ext4 often does) makes it look like the old file grown, so the first
    rounds to reuse one show it."""
    router = router_at(tmp_path)
    log = log_of(router)
    append(log, record(event="backend_loaded", ts=time.time(), role="old"))

    async def scenario() -> None:
        async with serving(router):
            await history_until(router, has_role("old"), "the old file's event")
            reused = 0
            for n in range(10):
                inode = log.stat().st_ino
                log.unlink()
                append(
                    log,
                    record(
                        event="backend_failure",
                        ts=time.time(),
                        role=f"first-{n}",
                        reason="y" * (300 + n),
                    )
                    + record(event="backend_loaded", ts=time.time(), role=f"second-{n}"),
                )
                reused += log.stat().st_ino == inode
                answer = await history_until(
                    router, has_role(f"second-{n}"), "the new file's last event"
                )
                assert f"first-{n}" in roles(answer), (n, reused, roles(answer)[-3:])

    run(scenario())


def test_the_log_truncated_and_written_again_longer_between_two_samples(tmp_path: Path) -> None:
    """Truncated in place and, before the next sample, written with more than it held:
    reading starts again from its start, as the docs say of a truncated file."""
    router = router_at(tmp_path)
    log = log_of(router)
    append(log, record(event="backend_loaded", ts=time.time(), role="old"))

    async def scenario() -> None:
        async with serving(router):
            await history_until(router, has_role("old"), "the old file's event")
            with log.open("wb") as handle:  # truncated and written in one go
                handle.write(
                    record(event="backend_failure", ts=time.time(), role="new-1", reason="y" * 300)
                    + record(event="backend_loaded", ts=time.time(), role="new-2")
                )
            answer = await history_until(router, has_role("new-2"), "the rewritten file's event")
            assert roles(answer) == ["old", "new-1", "new-2"]

    run(scenario())


def test_a_fifo_in_place_of_the_log_does_not_stop_the_history(tmp_path: Path) -> None:
    """A named pipe where the log should be (opening one to read blocks until someone
    writes to it): sampling must go on all the same."""
    router = router_at(tmp_path)
    fifo = log_of(router)
    os.mkfifo(fifo)
    writer: list[int] = []

    async def scenario() -> None:
        async with serving(router):
            try:
                await history_until(
                    router, lambda a: len(a["times"]) >= 3, "three samples", seconds=5
                )
            finally:
                # A writer, so that any read blocked in open() returns (at end of file)
                # and the router can stop.
                writer.append(os.open(fifo, os.O_RDWR | os.O_NONBLOCK))

    try:
        run(scenario())
    finally:
        for fd in writer:
            os.close(fd)


def test_a_flood_of_lines_keeps_the_events_bounded_and_the_endpoint_answering(
    tmp_path: Path,
) -> None:
    """A million junk lines and six thousand events with every field at its largest,
    appended in a burst: the endpoint answers (every invariant held) while the router
    reads its way through, at most MAX_EVENTS events are kept, the last is the last
    written, and what they hold stays within its bound."""
    router = router_at(tmp_path)
    log = log_of(router)
    log.write_bytes(b"")
    events = 6_000

    def flood() -> None:
        junk = b"junk\n" * 100_000
        now = time.time()
        with log.open("ab") as handle:
            for n in range(events):
                if n % 600 == 0:  # ten times a hundred thousand lines
                    handle.write(junk)
                handle.write(
                    record(
                        event="backend_failure",
                        ts=now + n * 1e-4,
                        role=f"{n:06d}" + "r" * 300,
                        model_id=f"{n:06d}" + "m" * 300,
                        reason=f"{n:06d}" + "why" * 200,
                    )
                )
            handle.write(record(event="backend_loaded", ts=now + events * 1e-4, role="last"))

    async def scenario() -> None:
        async with serving(router):
            await more_samples(router, 2, "the first samples")
            writing = asyncio.ensure_future(asyncio.to_thread(flood))
            answers = 0
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 60
            while True:
                answer = await history(router)
                answers += 1
                if writing.done() and "last" in roles(answer):
                    break
                assert loop.time() < deadline, "never: the flood read to its end"
                await asyncio.sleep(0.2)
            await writing
            assert len(answer["events"]) == MAX_EVENTS
            assert answer["events"][-1]["role"] == "last"
            first = f"{events - MAX_EVENTS + 1:06d}"
            assert answer["events"][0]["role"] == first + "r" * (MAX_NAME_CHARS - len(first))
            kept = the_history(router).events
            assert len(kept) == MAX_EVENTS
            # Each event at most: its tuple, a float, two names and a reason of the
            # largest sizes kept, with a generous allowance for object headers.
            bound = MAX_EVENTS * (2 * MAX_NAME_CHARS + MAX_REASON_CHARS + 600)
            assert reachable_bytes(kept) <= bound
            assert answers > 3  # the endpoint answered while the flood was read

    run(scenario(), seconds=120)


# -- since and the key ------------------------------------------------------------------

REFUSED_SINCE = (
    "nan",
    "NaN",
    "-nan",
    "inf",
    "+inf",
    "-inf",
    "Infinity",
    "-Infinity",
    "1e400",
    "-1e400",
    "9" * 400,
    "",
    "abc",
    "0x10",
    "1e",
    "%00",
    "5%00",
    "1,5",
    "[1]",
    "true",
    "a" * 6000,
)


def refused_as_openai(got: Answer, since: str) -> None:
    assert got.status == 400, (since[:40], got.status, got.body[:300])
    error = strict_json(got.body)["error"]
    assert (error["param"], error["code"]) == ("since", "invalid_request"), since[:40]
    assert error["type"] == "invalid_request_error"
    assert isinstance(error["message"], str) and "since" in error["message"]


@pytest.mark.usefixtures("via")
def test_every_since_that_is_no_finite_number_is_a_400_in_openais_shape(tmp_path: Path) -> None:
    router = router_at(tmp_path)

    async def scenario() -> None:
        async with serving(router):
            await history_until(router, lambda a: len(a["times"]) >= 2, "two samples")
            for since in REFUSED_SINCE:
                got = await ask(router, f"?since={since}")
                refused_as_openai(got, since)
            got = await ask(router, "?since")  # no '=': an empty value
            refused_as_openai(got, "")
            # Given twice: one of the two is used, never a failure.
            for first, second in (("abc", "5"), ("5", "abc"), ("nan", "nan")):
                got = await ask(router, f"?since={first}&since={second}")
                assert got.status in (200, 400), got.body[:300]
                if got.status == 400:
                    refused_as_openai(got, second)
                else:
                    consistent(strict_json(got.body), 5.0)

    run(scenario())


@pytest.mark.usefixtures("via")
def test_a_finite_since_however_odd_is_answered(tmp_path: Path) -> None:
    router = router_at(tmp_path)

    async def scenario() -> None:
        async with serving(router):
            full = await history_until(router, lambda a: len(a["times"]) >= 3, "three samples")
            middle = full["times"][1]
            for since, value in (
                ("-1e308", -1e308),
                ("1e308", 1e308),
                ("0", 0.0),
                ("-0", 0.0),
                ("%20%20" + repr(middle) + "%20", middle),
                (repr(middle), middle),
                ("1" + "0" * 300, 1e300),
                ("4.9e-324", 5e-324),
            ):
                answer = await history(router, f"?since={since}", value)
                newer = [t for t in full["times"] if t > value]
                assert answer["times"][: len(newer)] == newer, since
                if value >= 1e300:
                    assert answer["times"] == [] and answer["events"] == []

    run(scenario())


@pytest.mark.usefixtures("via")
def test_a_10_kb_since_is_answered_or_refused_and_never_a_server_error(tmp_path: Path) -> None:
    """A ``since`` of 10 KB: 400 when it is no finite number, answered when it is one
    (``1.111…``), or, through the door, its refusal of a URL over its limit (414);
    never a 5xx."""
    router = router_at(tmp_path)

    async def scenario() -> None:
        async with serving(router):
            await history_until(router, lambda a: len(a["times"]) >= 1, "a sample")
            for since in ("a" * 10_240, "9" * 10_240, "-" + "9" * 10_240):
                got = await ask(router, f"?since={since}")
                assert got.status in (400, 414), (got.status, got.body[:300])
                if got.status == 400:
                    refused_as_openai(got, since)
            got = await ask(router, "?since=1." + "1" * 10_240)
            assert got.status in (200, 414), (got.status, got.body[:300])
            if got.status == 200:
                consistent(strict_json(got.body), 1.1111)

    run(scenario())


@pytest.mark.usefixtures("via")
def test_the_history_needs_the_key_before_anything_else(tmp_path: Path) -> None:
    router = router_at(tmp_path)
    log = log_of(router)
    append(log, record(event="backend_failure", ts=time.time(), role="secret-role"))

    async def scenario() -> None:
        async with serving(router):
            await history_until(router, has_role("secret-role"), "the event")
            for headers in (
                {},
                {"authorization": "Bearer wrong"},
                {"authorization": "Bearer "},
                {"authorization": "Basic c2VjcmV0"},
                {"authorization": "secret"},
                {"x-api-key": "wrong"},
                {"authorization": "Bearer secretx"},
            ):
                for query in ("", "?since=nan", "?since=0"):
                    got = await ask(router, query, headers)
                    assert got.status == 401, (headers, query, got.status)
                    assert b"secret-role" not in got.body
                    error = strict_json(got.body)["error"]
                    assert error["code"] == "invalid_api_key"
                    assert error["type"] == "invalid_request_error"
            for headers in ({"x-api-key": "secret"}, {"authorization": "bearer  secret "}):
                got = await ask(router, "", headers)
                assert got.status == 200, (headers, got.body[:200])

    run(scenario())


# -- many pages while traffic flows -----------------------------------------------------


@dataclass
class Page:
    """What one page holds, asking as the page does: everything at first, then
    ``?since=`` the last sample's time it holds."""

    times: list[float] = field(default_factory=list)
    events: list[str | None] = field(default_factory=list)

    async def poll(self, router: Router) -> None:
        since = self.times[-1] if self.times else None
        answer = await history(router, "" if since is None else f"?since={since!r}", since)
        self.times += answer["times"]
        self.events += roles(answer)


@pytest.mark.usefixtures("via")
def test_many_pages_polling_while_traffic_flows_see_consistent_answers(tmp_path: Path) -> None:
    """Twenty pages poll as the page does while streamed requests flow and events are
    appended: every answer holds every invariant, and each page ends up holding every
    sample and every event exactly once, in order."""
    router = router_at(tmp_path)
    log = log_of(router)
    log.write_bytes(b"")
    pages = [Page() for _ in range(20)]

    async def traffic(stop: asyncio.Event) -> int:
        sent = 0
        while not stop.is_set():
            got = await call(
                router.app, CHAT, {"model": MODEL, "messages": [], "stream": True}, headers=KEY
            )
            assert got.status == 200, got.body[:200]
            sent += 1
        return sent

    async def writer(stop: asyncio.Event) -> int:
        written = 0
        while not stop.is_set():
            append(log, record(event="backend_failure", ts=time.time(), role=f"w{written}"))
            written += 1
            await asyncio.sleep(0.03)
        return written

    async def polling(page: Page, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await page.poll(router)
            await asyncio.sleep(0.01)

    async def scenario() -> None:
        async with serving(router):
            await history_until(router, lambda a: len(a["times"]) >= 1, "a sample")
            stop = asyncio.Event()
            flows = [asyncio.ensure_future(traffic(stop)) for _ in range(3)]
            writing = asyncio.ensure_future(writer(stop))
            polls = [asyncio.ensure_future(polling(page, stop)) for page in pages]
            await more_samples(router, 15, "fifteen samples under load", seconds=30)
            stop.set()
            sent = sum(await asyncio.gather(*flows))
            written = await writing
            await asyncio.gather(*polls)
            every = [f"w{n}" for n in range(written)]
            full = await history_until(
                router, lambda a: set(every) <= set(roles(a)), "every event written answered"
            )
            assert sent > 0 and written > 0
            assert roles(full) == every
            [model] = full["models"]
            assert any(v for v in model["series"]["requests_ok"] if v)
            for page in pages:
                await page.poll(router)  # once more, now that every event is read
            final = (await history(router))["times"]
            for page in pages:
                assert page.times == sorted(set(page.times)), "a sample twice or out of order"
                first = final.index(page.times[0])
                assert page.times == final[first : first + len(page.times)], "a sample missed"
                assert len(page.times) >= 15
                assert page.events == every, "an event missed or answered twice"

    run(scenario(), seconds=90)


# -- the pure core ----------------------------------------------------------------------

BUCKETS = Buckets((0.1, 1.0), (10.0, 100.0), (0.01, 0.1))


def test_an_event_noted_after_a_sample_reaches_a_page_that_has_the_sample() -> None:
    """A sample is taken at 1000.0006 s (answered as 1000.001); the log is read before
    it is recorded, and an event logged a moment later, at 1000.0008 s (written as
    ``...:40.000Z``: the log keeps milliseconds, cut), is noted at the next turn. A page
    that got the sample asks ``since=1000.001`` next: the event is newer than everything
    it was answered, and must reach it."""
    history = History(100, BUCKETS)
    history.record(Snapshot(wall=1000.0006, clock=1.0))
    first = history.answer()
    assert first["times"] == [1000.001] and first["events"] == []
    logged = event_of(json.dumps({"event": "backend_exited", "ts": "1970-01-01T00:16:40.000Z"}))
    assert logged is not None
    history.note([logged])
    history.record(Snapshot(wall=1005.0, clock=6.0))
    later = history.answer(since=first["times"][-1])
    assert [e["event"] for e in later["events"]] == ["backend_exited"], later["events"]


def test_a_wall_clock_stepped_back_does_not_stall_a_page_asking_with_since() -> None:
    """The machine's clock is stepped back an hour (NTP, a resumed virtual machine)
    between two samples. The answer's ``times`` stay strictly increasing, and a page
    asking ``since=`` the last time it holds still gets the samples taken after."""
    history = History(100, BUCKETS)
    for n in range(3):
        history.record(Snapshot(wall=10_000.0 + n * 5, clock=float(n * 5)))
    page = history.answer()["times"]
    for n in range(3, 6):
        history.record(Snapshot(wall=10_000.0 - 3600 + n * 5, clock=float(n * 5)))
    full = history.answer()
    times = full["times"]
    assert all(a < b for a, b in itertools.pairwise(times)), times
    newer = history.answer(since=page[-1])
    assert len(newer["times"]) == 3, newer["times"]


def test_an_event_of_any_hostile_line_is_well_formed_or_none() -> None:
    """The reading of one line never raises, whatever JSON it holds."""
    lines = [
        f'{{"event":"backend_loaded","ts":{ts}}}'
        for ts in ("1" + "0" * 400, "-1" + "0" * 400, "1" + "0" * 4000, "1e308", "-0")
    ]
    lines += [
        f'{{"event":"backend_exited","ts":1,"signal":{"[" * 900 + "]" * 900}}}',
        f'{{"event":"backend_exited","ts":1,"exit_code":{"9" * 4000}}}',
        f'{{"event":"backend_loaded","ts":1,"reason":{"9" * 4000}}}',
        '{"event":"backend_loaded","ts":"+275760-09-13T00:00:00Z"}',
        '{"event":"backend_loaded","ts":"-0001-01-01"}',
    ]
    raised = []
    for line in lines:
        try:
            found = event_of(line)
        except Exception as error:  # the finding: a line that raises
            raised.append(f"{line[:50]}... raised {error!r}")
            continue
        assert found is None or (isinstance(found, Event) and math.isfinite(found.ts))
    assert raised == []
