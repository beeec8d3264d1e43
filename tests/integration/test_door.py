"""Limits at the door, on a real router process, from raw sockets: long request lines,
too many or too large headers, heads that never finish and connections that never
speak are answered (414, 431, 408) and closed, before any body or key is read; memory
and descriptors stay flat, and the router keeps answering ``/health`` meanwhile."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import psutil
import pytest

from tests import one_shot
from tests.processes import free_port, poll, registry_env, running_router
from tests.registry_entries import registry_entry

# Its module-scoped stack starts once: one worker runs the whole module.
pytestmark = pytest.mark.xdist_group("test_door")

HEADER_TIMEOUT = 1.0
IDLE_TIMEOUT = 1.5


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    workdir: Path = tmp_path_factory.mktemp("door")
    env = registry_env(
        workdir,
        {"door": registry_entry("door", free_port())},
        SLM_API_KEYS="sk-door-test-key",
        SLM_MAX_URL_KB="8",
        SLM_MAX_HEADERS_KB="32",
        SLM_MAX_HEADERS="100",
        SLM_HEADER_TIMEOUT_SECONDS=str(HEADER_TIMEOUT),
        SLM_IDLE_TIMEOUT_SECONDS=str(IDLE_TIMEOUT),
    )
    with running_router(env, workdir) as (process, url):
        yield url, process.pid


def connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def read_all(sock: socket.socket, timeout: float = 10.0) -> bytes:
    """Everything until the router closes the connection (fails if it never does)."""
    sock.settimeout(timeout)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def healthy_within_a_second(url: str) -> bool:
    started = time.monotonic()
    ok = one_shot.get(f"{url}/health", timeout=1.0).status_code == 200
    return ok and time.monotonic() - started < 1.0


def status_of(reply: bytes) -> int:
    return int(reply.split(b" ", 2)[1])


def test_a_long_request_line_is_414(router: tuple[str, int]) -> None:
    url, _ = router
    with connect(url) as sock:
        sock.sendall(b"GET /v1/models?" + b"a" * 16_384 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        reply = read_all(sock)
    assert status_of(reply) == 414
    assert b'"code": "url_too_long"' in reply
    assert b"connection: close" in reply.lower()


def test_too_many_headers_is_431(router: tuple[str, int]) -> None:
    url, _ = router
    headers = b"".join(b"X-H%d: 1\r\n" % i for i in range(200))
    with connect(url) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n")
        reply = read_all(sock)
    assert status_of(reply) == 431
    assert b'"code": "too_many_headers"' in reply


def test_headers_too_large_is_431_before_any_key_is_checked(router: tuple[str, int]) -> None:
    url, _ = router
    big = b"X-Big: " + b"b" * 40_000 + b"\r\n"
    with connect(url) as sock:
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + big + b"\r\n")
        reply = read_all(sock)
    assert status_of(reply) == 431  # not 401: the door answers first
    assert b'"code": "headers_too_large"' in reply


def test_an_endless_header_is_cut_off_and_memory_stays_flat(router: tuple[str, int]) -> None:
    url, pid = router
    before = psutil.Process(pid).memory_info().rss
    with connect(url) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Endless: ")
        sent = 0
        piece = b"e" * 65_536
        try:
            while sent < 48 * 1024 * 1024:
                sock.sendall(piece)
                sent += len(piece)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the router stopped reading and closed: what we want
        reply = read_all(sock)
    assert sent < 48 * 1024 * 1024, "the router read the whole endless header"
    assert status_of(reply) == 431
    assert psutil.Process(pid).memory_info().rss - before < 20 * 1024 * 1024
    assert healthy_within_a_second(url)


def test_a_head_that_never_finishes_is_408_after_the_header_timeout(
    router: tuple[str, int],
) -> None:
    url, _ = router
    with connect(url) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
        started = time.monotonic()
        reply = read_all(sock)
        took = time.monotonic() - started
    assert status_of(reply) == 408
    assert b'"code": "header_timeout"' in reply
    assert HEADER_TIMEOUT - 0.1 < took < HEADER_TIMEOUT + 2.0


def test_a_slowloris_head_is_cut_at_the_header_timeout(router: tuple[str, int]) -> None:
    """Trickled one header line at a time: each byte is progress, but the head as a
    whole must arrive within the timeout."""
    url, _ = router
    with connect(url) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\n")
        started = time.monotonic()
        try:
            for i in range(100):
                sock.sendall(b"X-Slow-%d: 1\r\n" % i)
                time.sleep(0.1)  # the attack itself is the pacing, not synchronisation
        except (BrokenPipeError, ConnectionResetError):
            pass
        reply = read_all(sock)
        took = time.monotonic() - started
    assert status_of(reply) == 408
    assert took < HEADER_TIMEOUT + 2.0


def test_a_connection_that_never_speaks_is_closed(router: tuple[str, int]) -> None:
    url, _ = router
    with connect(url) as sock:
        started = time.monotonic()
        assert read_all(sock) == b""
        took = time.monotonic() - started
    assert IDLE_TIMEOUT - 0.1 < took < IDLE_TIMEOUT + 2.0


def test_keep_alive_serves_several_requests_then_closes_when_idle(
    router: tuple[str, int],
) -> None:
    url, _ = router
    with connect(url) as sock:
        for _ in range(3):
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            reply = b""
            sock.settimeout(10)
            while b'"ok"' not in reply and b"}" not in reply:
                reply += sock.recv(65536)
            assert status_of(reply) == 200
        started = time.monotonic()
        rest = read_all(sock)
        assert rest == b"" or rest.endswith(b"}")
        assert time.monotonic() - started < IDLE_TIMEOUT + 2.0


def test_requests_within_the_limits_pass(router: tuple[str, int]) -> None:
    url, _ = router
    headers = {f"X-H{i}": "v" * 200 for i in range(90)}  # 90 headers, about 19 KiB
    response = one_shot.get(f"{url}/health", headers=headers, timeout=10)
    assert response.status_code == 200
    response = one_shot.get(f"{url}/health?" + "q" * 7_000, timeout=10)
    assert response.status_code == 200


def test_many_silent_connections_are_all_closed_and_descriptors_return(
    router: tuple[str, int],
) -> None:
    url, pid = router
    process = psutil.Process(pid)
    before = process.num_fds()
    with ExitStack() as stack:
        socks = [stack.enter_context(connect(url)) for _ in range(200)]
        for sock in socks[:100]:
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")  # half-sent
        assert healthy_within_a_second(url)
        for sock in socks:
            read_all(sock, timeout=IDLE_TIMEOUT + 5)
    poll(lambda: process.num_fds() <= before + 5, 5, f"descriptors back to {before}")
    assert healthy_within_a_second(url)
