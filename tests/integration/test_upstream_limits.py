"""The limits on what a backend sends (router/upstream/client.py, router/answer/sse.py),
under attack from the backend side, on a real router in front of the raw-socket backend
(tests/fakes/raw_backend.py): an oversized SSE event right behind a good one in the
same read, floods of interim (1xx) responses, many headers spread over interim heads,
an answer over the cap without Content-Length."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests import one_shot
from tests.integration.raw_stack import SSE_HEAD, Raw, delta, raw_stack, repeated_stream
from tests.processes import http_ok

# Its module-scoped stack starts once: one worker runs the whole module.
pytestmark = pytest.mark.xdist_group("test_upstream_limits")

MODEL = "raw-attack"
CHAT = "/v1/chat/completions"
HELLO = [{"role": "user", "content": "hello"}]
EVENT_LIMIT = 8 * 1024  # SLM_MAX_SSE_EVENT_MB below, in bytes (0.0078125 MiB)
ANSWER_LIMIT = 64 * 1024
MIB = 1024 * 1024


@pytest.fixture(scope="module")
def raw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Raw]:
    tmp = tmp_path_factory.mktemp("raw-attack")
    with raw_stack(
        tmp, MODEL, answer_limit_mb=ANSWER_LIMIT / MIB, event_limit_mb=EVENT_LIMIT / MIB
    ) as stack:
        yield stack


def stream(raw: Raw) -> bytes:
    body = {"model": MODEL, "messages": HELLO, "stream": True}
    with one_shot.stream("POST", f"{raw.url}{CHAT}", json=body, timeout=20) as response:
        assert response.status_code == 200
        return response.read()


def test_an_oversized_event_alone_ends_the_stream_in_band(raw: Raw) -> None:
    raw.script(
        {"send": SSE_HEAD},
        {"chunk": delta(MODEL, "first")},
        {"sleep": 0.2},
        {"chunk": "data: " + "x" * (2 * EVENT_LIMIT) + "\n\n"},
        {"chunk": ""},
    )
    body = stream(raw)
    assert b'"first"' in body
    assert b"sse_event_too_large" in body


def test_a_good_event_in_the_same_read_as_an_oversized_one_still_reaches_the_client(
    raw: Raw,
) -> None:
    raw.script(
        {"send": SSE_HEAD},
        {"chunk": delta(MODEL, "first") + "data: " + "x" * (2 * EVENT_LIMIT) + "\n\n"},
        {"chunk": ""},
    )
    body = stream(raw)
    assert b"sse_event_too_large" in body
    assert b'"first"' in body, body[:300]


def test_a_flood_of_interim_responses_is_a_502(raw: Raw) -> None:
    raw.script(
        {"repeat": "HTTP/1.1 100 Continue\r\nX-Pad: p\r\n\r\n", "times": 200_000},
        {"send": "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"},
    )
    response = one_shot.post(
        f"{raw.url}{CHAT}", json={"model": MODEL, "messages": HELLO}, timeout=20
    )
    assert response.status_code == 502
    assert response.json()["error"]["type"] == "backend_error"
    assert http_ok(f"{raw.url}/health")


def test_headers_spread_over_interim_heads_are_bounded_by_bytes(raw: Raw) -> None:
    interim = "HTTP/1.1 103 Early Hints\r\n" + "Link: <x>\r\n" * 200 + "\r\n"
    raw.script(
        {"repeat": interim, "times": 100},  # 20,000 headers, 200 per head
        {"send": "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"},
    )
    response = one_shot.post(
        f"{raw.url}{CHAT}", json={"model": MODEL, "messages": HELLO}, timeout=20
    )
    assert response.status_code == 502


def test_a_few_interim_heads_then_an_answer_pass(raw: Raw) -> None:
    answer = json.dumps({"object": "chat.completion", "choices": []})
    raw.script(
        {"send": "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: <x>\r\n\r\n"},
        {"send": f"HTTP/1.1 200 OK\r\nContent-Length: {len(answer)}\r\n"},
        {"send": f"Content-Type: application/json\r\n\r\n{answer}"},
    )
    response = one_shot.post(
        f"{raw.url}{CHAT}", json={"model": MODEL, "messages": HELLO}, timeout=20
    )
    assert response.status_code == 200
    assert response.json()["object"] == "chat.completion"


@pytest.mark.parametrize("framing", ["chunked", "close"])
def test_an_answer_over_the_cap_without_a_content_length_is_502(raw: Raw, framing: str) -> None:
    if framing == "chunked":
        head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked"
        steps: list[dict[str, Any]] = [{"send": head + "\r\n\r\n"}]
        steps += [{"chunk": "x" * 16_384} for _ in range(8)] + [{"chunk": ""}]
    else:
        head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close"
        steps = [{"send": head + "\r\n\r\n"}, {"repeat": "x", "times": 4 * ANSWER_LIMIT}]
    raw.script(*steps)
    response = one_shot.post(
        f"{raw.url}{CHAT}", json={"model": MODEL, "messages": HELLO}, timeout=20
    )
    assert response.status_code == 502
    assert response.json()["error"]["code"] == "upstream_too_large"


def test_a_client_that_stops_reading_holds_the_backend_back_and_loses_nothing(
    raw: Raw,
) -> None:
    """A fast backend, a client that stops reading: the router's memory stays where it
    was (the backend's socket is paused, not buffered into the router), and when the
    client reads again every event arrives, in order."""
    events = 200_000  # about 30 MB of stream
    raw.script(*repeated_stream(MODEL, events))
    before = raw.rss_mb()
    host, port = raw.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    body = json.dumps({"model": MODEL, "messages": HELLO, "stream": True}).encode()
    head = f"POST {CHAT} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
    sock.sendall(head.encode() + b"Content-Length: %d\r\n\r\n" % len(body) + body)
    received = bytearray(sock.recv(65536))
    peak = before
    until = time.monotonic() + 3.0  # the client reads nothing for 3 s
    while time.monotonic() < until:
        peak = max(peak, raw.rss_mb())
        assert raw.healthy_within(1.0)
    assert peak - before < 15, f"router RSS {before:.0f} → {peak:.0f} MB"
    while not received.endswith(b"0\r\n\r\n"):
        data = sock.recv(1 << 20)
        assert data, "the stream ended early"
        received += data
    sock.close()
    assert received.count(b'"content": "x"') == events
    assert b"data: [DONE]" in received
    assert b'"error"' not in received
