"""The body budget (router/intake/body_budget.py) against clients that try to exhaust the
router's memory, on a real router process: large bodies at once are held to one budget
(503 before their bodies are read), and the router's memory comes back down after the
burst."""

from __future__ import annotations

import json
import socket
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import psutil
import pytest

from tests import one_shot
from tests.fakes.control import FakeBackend
from tests.processes import RunningRouter, StartRouter, poll
from tests.registry_entries import registry_entry

# Its module-scoped stack starts once: one worker runs the whole module.
pytestmark = pytest.mark.xdist_group("test_body_budget_memory")

FAKE_ROLES = ("big",)
BODY_MB = 5
# A 5 MiB body is charged about 20 MiB (itself and its parsed cost): one fits, not two.
BUDGET_MB = 24


@pytest.fixture(scope="module")
def router_process(fake: FakeBackend, start_router: StartRouter) -> RunningRouter:
    entry = registry_entry("big", fake.port, default_timeout=30, max_concurrency=1, max_queue=64)
    return start_router(
        {"big": entry}, SLM_MAX_BODY_MB="6", SLM_MAX_BODIES_IN_FLIGHT_MB=str(BUDGET_MB)
    )


def big_body() -> bytes:
    text = "x" * (BODY_MB * 1024 * 1024 - 200)
    return json.dumps({"model": "big", "messages": [{"role": "user", "content": text}]}).encode()


def post(url: str, body: bytes) -> httpx.Response:
    headers = {"content-type": "application/json"}
    return one_shot.post(f"{url}/v1/chat/completions", content=body, headers=headers, timeout=60)


def test_a_body_past_the_budget_is_503_before_it_is_read(router: str, fake: FakeBackend) -> None:
    fake.script(delay_seconds=3)
    first: list[httpx.Response] = []
    sender = threading.Thread(target=lambda: first.append(post(router, big_body())))
    sender.start()
    try:
        fake.wait_for(lambda requests: len(requests) == 1, timeout=20)
        # The first body is held while its request runs: a second one does not fit.
        host, port = router.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            head = (
                "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                "Content-Type: application/json\r\n"
                f"Content-Length: {BODY_MB * 1024 * 1024}\r\n\r\n"
            )
            sock.sendall(head.encode())  # and none of the body
            reply = b""
            while not reply.endswith(b"}}") and (chunk := sock.recv(65536)):
                reply += chunk
        assert reply.startswith(b"HTTP/1.1 503"), reply[:300]
        assert b"retry-after: 1" in reply.lower()
        assert b"bodies_over_budget" in reply
    finally:
        sender.join(30)
    assert first[0].status_code == 200
    assert post(router, big_body()).status_code == 200, "the budget was given back"


def test_a_burst_of_large_bodies_leaves_memory_where_it_was(
    router_process: RunningRouter, fake: FakeBackend
) -> None:
    url = router_process.url
    process = psutil.Process(router_process.pid)
    assert post(url, big_body()).status_code == 200  # warm: allocator arenas exist
    before = process.memory_info().rss
    fake.script(delay_seconds=0.5)
    body = big_body()
    with ThreadPoolExecutor(max_workers=8) as pool:
        statuses = [
            f.result().status_code for f in [pool.submit(post, url, body) for _ in range(8)]
        ]
    assert set(statuses) <= {200, 503}, statuses
    assert 503 in statuses and 200 in statuses, statuses
    fake.script()

    def settled() -> bool:
        return process.memory_info().rss - before < 40 * 1024 * 1024

    poll(settled, 10, f"the router's RSS back near {before / 1e6:.0f} MB")
    assert one_shot.get(f"{url}/health", timeout=1).status_code == 200
