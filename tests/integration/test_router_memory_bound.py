"""Issue 33: the router's memory is bounded by the budget for bodies in flight, whatever
the bodies hold. On a real router process with the default limits (32 MiB a body,
256 MiB of bodies in flight), eight clients at once send 30 MiB bodies of numbers, of
strings and of small objects, on the chat, Messages and Responses routes. The router's
resident memory, sampled every 10 ms, must stay within its baseline plus twice the
budget, and come back within 100 MB of the baseline 10 s later; every request gets an
answer (200, 413, 503 or 504), never a dropped connection."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest

from tests import one_shot
from tests.fakes.control import FakeBackend
from tests.huge_bodies import MIB, ROUTES, SHAPES, sampled
from tests.processes import RunningRouter, StartRouter, poll
from tests.registry_entries import registry_entry

pytestmark = pytest.mark.xdist_group("test_router_memory_bound")

FAKE_ROLES = ("big",)
BUDGET_MB = 256  # the default SLM_MAX_BODIES_IN_FLIGHT_MB
CLIENTS = 8


@pytest.fixture(scope="module")
def router_process(fake: FakeBackend, start_router: StartRouter) -> RunningRouter:
    entry = registry_entry("big", fake.port, default_timeout=60, max_concurrency=8, max_queue=64)
    return start_router({"big": entry}, SLM_OTEL_ENABLED="false")


def send(url: str, route: str, body: bytes) -> int:
    reply = one_shot.post(
        f"{url}{route}", content=body, headers={"content-type": "application/json"}, timeout=120
    )
    return reply.status_code


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_a_burst_of_huge_bodies_stays_within_the_budget_and_memory_comes_back(
    router_process: RunningRouter, fake: FakeBackend, route: str, shape: str
) -> None:
    url, pid = router_process.url, router_process.pid
    process = psutil.Process(pid)
    assert one_shot.get(f"{url}/health", timeout=5).status_code == 200
    baseline = process.memory_info().rss
    body = SHAPES[shape](route)
    assert len(body) <= 32 * MIB
    fake.script(delay_seconds=0.3)
    with sampled(pid) as samples, ThreadPoolExecutor(CLIENTS) as pool:
        futures = [pool.submit(send, url, route, body) for _ in range(CLIENTS)]
        statuses = [f.result() for f in futures]  # an exception here: a dropped connection
    fake.script()
    peak = max(samples)
    assert set(statuses) <= {200, 413, 503, 504}, statuses
    limit = baseline + 2 * BUDGET_MB * MIB
    assert peak <= limit, (
        f"{shape} on {route}: peak {peak / MIB:.0f} MiB, baseline {baseline / MIB:.0f} MiB, "
        f"statuses {statuses}"
    )
    settle_until = time.monotonic() + 10
    poll(
        lambda: process.memory_info().rss - baseline < 100 * 1024 * 1024,
        max(0.1, settle_until - time.monotonic()),
        f"the router's memory back within 100 MB of {baseline / MIB:.0f} MiB",
    )
    # And it still serves.
    small = {"model": "big", "messages": [{"role": "user", "content": "hi"}]}
    reply = one_shot.post(f"{url}/v1/chat/completions", json=small, timeout=10)
    assert reply.status_code == 200
