"""Attacks on the door's timers and limits (router/edge/http_protocol.py), on a real router in front
of a real fake backend, from raw sockets: pipelined requests, bodies after an early
refusal, trailers, heads in one-byte reads, streams longer than every door timer.

An active request must never be cut by the door's timers, the body of a request must
never be taken for the head of the next, and no part of a request the router reads
(pipelined heads and trailers included) may grow without bound."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.fakes.control import FakeBackend
from tests.integration.attack_wire import Wire, request
from tests.processes import poll, registry_env, running_router
from tests.registry_entries import registry_entry

# Its module-scoped stack starts once: one worker runs the whole module.
pytestmark = pytest.mark.xdist_group("test_attack_door")

HEADER_TIMEOUT = 1.0
IDLE_TIMEOUT = 1.5
MODEL = "door-attack"
CHAT = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}).encode()
STREAM = json.dumps(
    {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
).encode()
JSON = {"content_type": "application/json"}
HEALTH = request("GET", "/health")


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeBackend]:
    with FakeBackend.start(model_id=MODEL) as backend:
        yield backend


@pytest.fixture(scope="module")
def router(
    fake: FakeBackend, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, int]]:
    workdir: Path = tmp_path_factory.mktemp("door-attack")
    entry = registry_entry(MODEL, fake.port, default_timeout=30, max_concurrency=4)
    env = registry_env(
        workdir,
        {MODEL: entry},
        SLM_MAX_URL_KB="8",
        SLM_MAX_HEADERS_KB="32",
        SLM_MAX_HEADERS="100",
        SLM_HEADER_TIMEOUT_SECONDS=str(HEADER_TIMEOUT),
        SLM_IDLE_TIMEOUT_SECONDS=str(IDLE_TIMEOUT),
    )
    with running_router(env, workdir) as (process, url):
        yield url, process.pid


@pytest.fixture(autouse=True)
def _reset(fake: FakeBackend) -> None:
    fake.reset()


# -- timers vs active requests ------------------------------------------------------


def test_a_single_request_slower_than_both_timers_is_answered(
    router: tuple[str, int], fake: FakeBackend
) -> None:
    url, _ = router
    fake.script(delay_seconds=IDLE_TIMEOUT + HEADER_TIMEOUT + 0.5)
    with Wire(url) as wire:
        wire.send(request("POST", "/v1/chat/completions", CHAT, **JSON))
        assert wire.response().status == 200
        wire.send(HEALTH)  # and the connection is still good for another
        assert wire.response().status == 200


def test_a_pipelined_request_slower_than_the_idle_timeout_is_answered(
    router: tuple[str, int], fake: FakeBackend
) -> None:
    url, _ = router
    fake.script(delay_seconds=IDLE_TIMEOUT + 1.5)
    with Wire(url) as wire:
        # Both in one write: the second is queued by uvicorn while the first runs.
        wire.send(HEALTH + request("POST", "/v1/chat/completions", CHAT, **JSON))
        assert wire.response().status == 200
        second = wire.response()  # ConnectionError: the idle timer closed it
    assert second.status == 200
    assert json.loads(second.body)["object"] == "chat.completion"


def test_a_stream_longer_than_both_timers_is_relayed_whole_then_keeps_alive(
    router: tuple[str, int], fake: FakeBackend
) -> None:
    url, _ = router
    fake.script(chunks=12, chunk_interval_seconds=0.3)  # 3.6 s of stream
    with Wire(url) as wire:
        started = time.monotonic()
        wire.send(request("POST", "/v1/chat/completions", STREAM, **JSON))
        reply = wire.response()
        assert time.monotonic() - started > IDLE_TIMEOUT + HEADER_TIMEOUT
        assert reply.status == 200
        assert reply.body.count(b"tok ") == 12
        assert b"data: [DONE]" in reply.body
        assert b'"error"' not in reply.body
        wire.send(HEALTH)
        assert wire.response().status == 200


def test_a_body_trickled_past_the_header_timeout_is_still_read(
    router: tuple[str, int], fake: FakeBackend
) -> None:
    """The header timeout is for the head; a body may take longer."""
    url, _ = router
    body = CHAT
    with Wire(url) as wire:
        full = request("POST", "/v1/chat/completions", body, **JSON)
        head = full[: len(full) - len(body)]
        wire.send(head)
        started = time.monotonic()
        pieces = [body[i : i + 8] for i in range(0, len(body), 8)]
        pace = (HEADER_TIMEOUT * 2) / len(pieces)
        for piece in pieces:
            wire.send(piece)
            time.sleep(pace)  # the attack is the pacing, not synchronisation
        assert time.monotonic() - started > HEADER_TIMEOUT * 1.5
        reply = wire.response()
    assert reply.status == 200
    fake.wait_for(lambda reqs: len(reqs) == 1)


# -- a body is not a head -------------------------------------------------------------


def test_a_body_sent_after_an_early_refusal_is_not_taken_for_a_head(
    router: tuple[str, int],
) -> None:
    url, _ = router
    body = b"x" * 100_000  # more than SLM_MAX_URL_KB + SLM_MAX_HEADERS_KB
    full = request("POST", "/v1/chat/completions", body, content_type="text/plain")
    with Wire(url) as wire:
        wire.send(full[: len(full) - len(body)])
        refused = wire.response()
        assert refused.status == 415  # before the body is read, as documented
        wire.send(body)  # a client that sends its body anyway, as curl and httpx do
        wire.send(HEALTH)
        after = wire.response()
    assert after.status == 200, after.body[:300]


def test_a_slow_body_after_an_early_refusal_gets_no_408(router: tuple[str, int]) -> None:
    url, _ = router
    body = b"x" * 20_000  # below the head limit: only the timer can trip
    full = request("POST", "/v1/chat/completions", body, content_type="text/plain")
    with Wire(url) as wire:
        wire.send(full[: len(full) - len(body)])
        assert wire.response().status == 415
        pieces = [body[i : i + 2_000] for i in range(0, len(body), 2_000)]
        try:
            for piece in pieces:
                wire.send(piece)
                time.sleep(HEADER_TIMEOUT * 2 / len(pieces))  # pacing: the attack
            wire.send(HEALTH)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the router closed: what it sent first is read below
        after = wire.response()  # a 408 header_timeout, with the bug
    assert after.status == 200, after.body[:300]


# -- unbounded parts of a request ------------------------------------------------------


def _send_endless(wire: Wire, total: int) -> int:
    sent = 0
    piece = b"e" * 65_536
    wire.sock.settimeout(20)
    try:
        while sent < total:
            wire.send(piece)
            sent += len(piece)
    except (BrokenPipeError, ConnectionResetError):
        pass
    return sent


def test_an_endless_header_pipelined_behind_a_running_request_is_cut(
    router: tuple[str, int], fake: FakeBackend
) -> None:
    url, pid = router
    fake.script(delay_seconds=6)
    before = psutil.Process(pid).memory_info().rss
    total = 24 * 1024 * 1024
    with Wire(url) as wire:
        wire.send(request("POST", "/v1/chat/completions", CHAT, **JSON))
        fake.wait_for(lambda reqs: len(reqs) == 1)  # the first request is running
        wire.send(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Endless: ")
        sent = _send_endless(wire, total)
        grown = psutil.Process(pid).memory_info().rss - before
        try:
            rest = wire.rest()
        except ConnectionResetError:
            rest = wire.buffer
    assert sent < total, f"the router read all {sent} bytes of one header (RSS +{grown:,})"
    # The first request's answer has not begun: a 431 written now would be read as its
    # answer, so the router closes without one.
    assert b" 431 " not in rest


def test_an_endless_trailer_on_a_chunked_body_is_cut(router: tuple[str, int]) -> None:
    url, pid = router
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    chunk = b"%x\r\n%s\r\n" % (len(CHAT), CHAT)
    before = psutil.Process(pid).memory_info().rss
    total = 24 * 1024 * 1024
    with Wire(url) as wire:
        wire.send(head + chunk + b"0\r\nX-Endless: ")
        sent = _send_endless(wire, total)
    grown = psutil.Process(pid).memory_info().rss - before
    assert sent < total, f"the router read all {sent} bytes of one trailer (RSS +{grown:,})"


def test_an_endless_header_on_a_kept_alive_connection_is_cut(router: tuple[str, int]) -> None:
    """The second head on a connection, after the first answer: counted like a first."""
    url, _ = router
    with Wire(url) as wire:
        wire.send(HEALTH)
        assert wire.response().status == 200
        wire.send(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Endless: ")
        sent = _send_endless(wire, 24 * 1024 * 1024)
        try:
            rest = wire.rest()
        except ConnectionResetError:
            rest = wire.buffer
    assert sent < 24 * 1024 * 1024
    assert rest.startswith(b"HTTP/1.1 431 ")


def test_an_unfinished_pipelined_head_is_408(router: tuple[str, int], fake: FakeBackend) -> None:
    url, _ = router
    fake.script(delay_seconds=0.5)
    with Wire(url) as wire:
        first = request("POST", "/v1/chat/completions", CHAT, **JSON)
        wire.send(first + b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # never ends
        assert wire.response().status == 200
        rest = wire.rest()
    assert rest.startswith(b"HTTP/1.1 408 "), rest[:200]


# -- heads in pieces, counts per request -------------------------------------------------


def test_a_head_in_one_byte_writes_is_served_and_counted(router: tuple[str, int]) -> None:
    url, _ = router
    with Wire(url) as wire:
        wire.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for byte in HEALTH:
            wire.send(bytes([byte]))
        assert wire.response().status == 200
        big = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"b" * 41_000
        try:
            for i in range(0, len(big), 16):
                wire.send(big[i : i + 16])
        except (BrokenPipeError, ConnectionResetError):
            pass
        try:
            rest = wire.rest()
        except ConnectionResetError:
            rest = wire.buffer
    assert rest.startswith(b"HTTP/1.1 431 ")


def test_the_header_count_is_per_request_on_one_connection(router: tuple[str, int]) -> None:
    url, _ = router
    sixty = {f"x_h{i}": "v" for i in range(60)}
    with Wire(url) as wire:
        for _ in range(3):  # 180 headers on the connection, 60 per request
            wire.send(request("GET", "/health", **sixty))
            assert wire.response().status == 200
        many = {f"x_h{i}": "v" for i in range(101)}
        wire.send(request("GET", "/health", **many))
        refused = wire.response()
    assert refused.status == 431
    assert b"too_many_headers" in refused.body


def test_pipelined_requests_in_one_write_are_all_answered_in_order(
    router: tuple[str, int], fake: FakeBackend
) -> None:
    url, _ = router
    with Wire(url) as wire:
        post = request("POST", "/v1/chat/completions", CHAT, **JSON)
        wire.send(HEALTH + post + HEALTH + request("GET", "/v1/models"))
        statuses = [wire.response().status for _ in range(4)]
    assert statuses == [200, 200, 200, 200]


def test_a_connection_idle_after_its_answer_is_closed_within_the_idle_timeout(
    router: tuple[str, int],
) -> None:
    url, _ = router
    with Wire(url) as wire:
        wire.send(HEALTH)
        assert wire.response().status == 200
        started = time.monotonic()
        assert wire.closed_without_more()
        took = time.monotonic() - started
    # uvicorn's own keep-alive timer is ceil(IDLE_TIMEOUT); the door's must come first.
    assert took < IDLE_TIMEOUT + 1.0


def test_the_router_answers_health_while_an_attack_connection_waits(
    router: tuple[str, int], fake: FakeBackend
) -> None:
    url, _ = router
    fake.script(delay_seconds=3)
    with Wire(url) as slow, Wire(url) as other:
        slow.send(request("POST", "/v1/chat/completions", CHAT, **JSON) + b"GET /he")
        fake.wait_for(lambda reqs: len(reqs) == 1)
        other.send(HEALTH)
        assert other.response().status == 200
    poll(lambda: len(fake.requests()) == 1, 5, "the fake's record")
