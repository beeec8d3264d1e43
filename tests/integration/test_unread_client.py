"""A client that asks and never reads, on a real router in front of the raw-socket
backend (tests/fakes/raw_backend.py): after SLM_WRITE_STALL_SECONDS its connection is
cut, and with it the backend's connection and the answer the router had buffered for
it, while the router answers /health throughout. A client that reads slowly but keeps
reading is never cut."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import psutil
import pytest

from tests.integration.raw_stack import Raw, raw_stack, repeated_stream

# Its module-scoped stack starts once: one worker runs the whole module.
pytestmark = pytest.mark.xdist_group("test_unread_client")

MODEL = "raw-unread"
CHAT = "/v1/chat/completions"
HELLO = [{"role": "user", "content": "hello"}]
# SLM_WRITE_STALL_SECONDS here: 3 s, not 1, since beside the parallel part of the suite
# a slow reader that pauses 30 ms between reads was once starved of the CPU for a second.
STALL = 3.0
DEADLINE = 10.0  # the model's default_timeout (raw_stack): the cut must come first
MIB = 1024 * 1024


@pytest.fixture(scope="module")
def raw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Raw]:
    tmp = tmp_path_factory.mktemp("raw-unread")
    settings = {"SLM_WRITE_STALL_SECONDS": str(STALL)}
    with raw_stack(tmp, MODEL, answer_limit_mb=64, event_limit_mb=1, settings=settings) as stack:
        yield stack


def stream_script(raw: Raw, events: int) -> None:
    raw.script(*repeated_stream(MODEL, events))


def ask(raw: Raw, stream: bool, buffer: int = 4096, path: str = CHAT) -> socket.socket:
    """A request (to ``path``: chat completions, or Ollama's chat) sent on a socket with
    a small receive buffer, nothing read."""
    host, port = raw.url.removeprefix("http://").split(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, buffer)
    sock.settimeout(30)
    sock.connect((host, int(port)))
    body = json.dumps({"model": MODEL, "messages": HELLO, "stream": stream}).encode()
    head = f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
    sock.sendall(head.encode() + b"Content-Length: %d\r\n\r\n" % len(body) + body)
    return sock


def router_connections(raw: Raw) -> tuple[int, int]:
    """The router's established connections from clients, and to the backend."""
    router_port = int(raw.url.rsplit(":", 1)[1])
    clients = backends = 0
    for conn in psutil.Process(raw.router_pid).net_connections(kind="tcp"):
        if conn.status != psutil.CONN_ESTABLISHED or not conn.raddr:
            continue
        clients += conn.laddr.port == router_port
        backends += conn.raddr.port == raw.backend_port
    return clients, backends


def cut_within(raw: Raw, sock: socket.socket, seconds: float) -> float:
    """Seconds until the router holds no connection from ``sock``; fails past
    ``seconds``. /health must answer within 1 s all along."""
    mine = sock.getsockname()
    started = time.monotonic()
    # The answer has begun (peeked, nothing taken): the router holds the connection.
    assert sock.recv(1, socket.MSG_PEEK) == b"H"
    while True:
        conns = psutil.Process(raw.router_pid).net_connections(kind="tcp")
        if not any(c.raddr and tuple(c.raddr) == mine for c in conns):
            return time.monotonic() - started
        assert time.monotonic() - started < seconds, "the unread connection was never cut"
        assert raw.healthy_within(1.0)


@pytest.mark.parametrize("path", [CHAT, "/api/chat"], ids=["chat", "ollama"])
def test_a_stream_nobody_reads_is_cut_with_its_backend_after_the_write_stall(
    raw: Raw, path: str
) -> None:
    stream_script(raw, 200_000)  # about 30 MB: far more than the socket buffers hold
    before_rss = raw.rss_mb()
    before_fds = psutil.Process(raw.router_pid).num_fds()
    started = time.monotonic()
    sock = ask(raw, stream=True, path=path)
    try:
        cut_within(raw, sock, STALL + 5.0)
        took = time.monotonic() - started
        assert STALL <= took < DEADLINE - 2, took
        # The backend's connection went with it (the stream was cut, not pooled).
        deadline = time.monotonic() + 5.0
        while router_connections(raw)[1] and time.monotonic() < deadline:
            assert raw.healthy_within(1.0)
        assert router_connections(raw) == (0, 0)
    finally:
        sock.close()
    assert psutil.Process(raw.router_pid).num_fds() <= before_fds
    assert raw.rss_mb() - before_rss < 15


def test_a_whole_answer_nobody_reads_is_dropped_after_the_write_stall(raw: Raw) -> None:
    size = 32 * MIB
    answer = '{"object": "chat.completion", "pad": "' + "x" * size + '"}'
    raw.script(
        {"send": "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"},
        {"send": f"Content-Length: {len(answer)}\r\n\r\n"},
        {"send": answer},
    )
    before_rss = raw.rss_mb()
    sock = ask(raw, stream=False)
    try:
        # The router reads the answer whole and hands it to a connection that takes
        # nothing: it waits in the router's buffer until the cut.
        cut_within(raw, sock, STALL + 10.0)
    finally:
        sock.close()
    deadline = time.monotonic() + 5.0
    while raw.rss_mb() - before_rss > 10 and time.monotonic() < deadline:
        assert raw.healthy_within(1.0)
    assert raw.rss_mb() - before_rss < 10, f"router RSS {before_rss:.0f} → {raw.rss_mb():.0f} MB"


def test_a_client_reading_slowly_past_the_write_stall_gets_every_event(raw: Raw) -> None:
    events = 60_000  # about 8 MB: more than the socket buffers hold
    stream_script(raw, events)
    sock = ask(raw, stream=True, buffer=64 * 1024)
    received = bytearray()
    started = time.monotonic()
    try:
        while not received.endswith(b"0\r\n\r\n"):
            data = sock.recv(64 * 1024)
            assert data, "the stream ended early"
            received += data
            time.sleep(0.03)  # the reader's own pace, not a synchronisation
    finally:
        sock.close()
    assert time.monotonic() - started > 2 * STALL  # the router waited on it, often
    assert received.count(b'"content": "x"') == events
    assert b"data: [DONE]" in received
    assert b'"error"' not in received
