"""Issue 33: the router's memory is bounded by the budget for bodies in flight, whatever
the bodies hold. On a real router process with the default limits (32 MiB a body,
256 MiB of bodies in flight), eight clients at once send 30 MiB bodies of numbers, of
strings and of small objects, on the chat, Messages and Responses routes. The router's
resident memory, sampled every 10 ms, must stay within its baseline plus twice the
budget, and come back within 100 MB of the baseline 10 s later; every request gets an
answer (200, 413, 503 or 504), never a dropped connection."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import psutil
import pytest

from tests import one_shot
from tests.fakes.control import FakeBackend
from tests.processes import RunningRouter, StartRouter, poll
from tests.registry_entries import registry_entry

pytestmark = pytest.mark.xdist_group("test_router_memory_bound")

FAKE_ROLES = ("big",)
MIB = 1024 * 1024
BUDGET_MB = 256  # the default SLM_MAX_BODIES_IN_FLIGHT_MB
CLIENTS = 8
BODY = 30 * MIB


@pytest.fixture(scope="module")
def router_process(fake: FakeBackend, start_router: StartRouter) -> RunningRouter:
    entry = registry_entry("big", fake.port, default_timeout=60, max_concurrency=8, max_queue=64)
    return start_router({"big": entry}, SLM_OTEL_ENABLED="false")


def numbers(route: str) -> bytes:
    values = b",".join(b"%d" % (1000 + i % 9000) for i in range(BODY // 5))
    return _wrap(route, b'"x"', b"[" + values + b"]")


def strings(route: str) -> bytes:
    return _wrap(route, b'"' + b"x" * (BODY - 400) + b'"', None)


def objects(route: str) -> bytes:
    return _wrap(route, b'"x"', b"[" + b",".join(b'{"a":1}' for _ in range(BODY // 8)) + b"]")


def messages(route: str) -> bytes:
    """Many messages of 600 characters: allocations of every size at once, which the C
    allocator keeps (in the worker threads' arenas too) unless asked to give back."""
    one = b'{"role":"user","content":"' + b"y" * 600 + b'"}'
    listed = b"[" + b",".join(one for _ in range(BODY // (len(one) + 1))) + b"]"
    if route == "/v1/responses":
        return b'{"model":"big","input":' + listed + b"}"
    extra = b',"max_tokens":8' if route == "/v1/messages" else b""
    return b'{"model":"big","messages":' + listed + extra + b"}"


def _wrap(route: str, text: bytes, enum: bytes | None) -> bytes:
    """A valid request of ``route``'s shape whose message is ``text`` and, when given,
    with a JSON schema whose ``enum`` is ``enum`` where each API takes one (the reply's
    format for chat and Responses, a tool's input schema for Messages)."""
    schema = b'{"enum":' + enum + b"}" if enum is not None else None
    if route == "/v1/chat/completions":
        body = b'{"model":"big","messages":[{"role":"user","content":' + text + b"}]"
        if schema is not None:
            body += b',"response_format":{"type":"json_schema","json_schema":{"name":"n",'
            body += b'"schema":' + schema + b"}}"
    elif route == "/v1/messages":
        body = b'{"model":"big","max_tokens":8,"messages":[{"role":"user","content":' + text
        body += b"}]"
        if schema is not None:
            body += b',"tools":[{"name":"f","input_schema":{"type":"object","properties":'
            body += b'{"v":' + schema + b"}}}]"
    else:
        body = b'{"model":"big","input":' + text
        if schema is not None:
            body += b',"text":{"format":{"type":"json_schema","name":"n","schema":' + schema
            body += b"}}"
    return body + b"}"


@contextmanager
def sampled(pid: int) -> Iterator[list[int]]:
    """The process's resident set, sampled every 10 ms while the block runs."""
    process = psutil.Process(pid)
    samples = [process.memory_info().rss]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.01):
            samples.append(process.memory_info().rss)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield samples
    finally:
        stop.set()
        sampler.join(5)


def send(url: str, route: str, body: bytes) -> int:
    reply = one_shot.post(
        f"{url}{route}", content=body, headers={"content-type": "application/json"}, timeout=120
    )
    return reply.status_code


ROUTES = ["/v1/chat/completions", "/v1/messages", "/v1/responses"]
SHAPES: dict[str, Callable[[str], bytes]] = {
    "messages": messages,
    "numbers": numbers,
    "strings": strings,
    "objects": objects,
}


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
