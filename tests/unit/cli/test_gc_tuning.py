"""The router's request path leaves no reference cycles behind (so the collector tuned
by :mod:`slm_server.cli.gc_tuning` has nothing to find), and the tuning itself."""

from __future__ import annotations

import asyncio
import gc
import json
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from slm_server.cli import gc_tuning
from tests.unit.router.door_client import Recording, door_for
from tests.unit.router.inprocess import Sent, call, make_router, sse, whole
from tests.unit.router.test_proxy import ANSWER, CHAT, chat, delta


@pytest.fixture
def saved_collector() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.set_threshold(*thresholds)
    gc.unfreeze()
    gc.set_debug(0)
    gc.garbage.clear()


async def answer(sent: Sent) -> object:
    if sent.json().get("stream"):
        return sse(delta("Hello"), delta(" there", "stop"))
    return whole(ANSWER)


async def garbage_of(
    serve_all: Callable[[], Awaitable[None]], then: Callable[[], None] = lambda: None
) -> Counter[str]:
    """What 20 rounds of ``serve_all`` (after one to warm up: lazy imports, caches)
    leave that only the cyclic collector finds; ``then`` runs before it looks."""
    await serve_all()
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for _ in range(20):
            await serve_all()
        then()
        gc.collect()
        return Counter(type(o).__qualname__ for o in gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


def test_proxied_answers_whole_streamed_and_refused_make_no_reference_cycles(
    tmp_path: Path, saved_collector: None
) -> None:
    router = make_router(tmp_path, answer)  # type: ignore[arg-type]
    requests = [
        (CHAT, chat()),
        (CHAT, chat(stream=True)),
        (CHAT, {**chat(), "model": "no-such-model"}),  # 404 from the handler
        (CHAT, b"{not json"),  # 400
        ("/v1/models", b""),
    ]

    async def serve_all() -> None:
        for path, body in requests:
            method = "GET" if path == "/v1/models" else "POST"
            got = await call(router.app, path, body, method=method)
            assert got.status in (200, 400, 404)

    async def scenario() -> Counter[str]:
        async with router.app.router.lifespan_context(router.app):
            return await garbage_of(serve_all)

    found = asyncio.run(scenario())
    assert not found, f"objects left in reference cycles by 100 requests: {found.most_common(10)}"


def http_request(path: str, body: bytes, method: str = "POST") -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nhost: 127.0.0.1\r\n"
    if method == "POST":
        head += f"content-type: application/json\r\ncontent-length: {len(body)}\r\n"
    return head.encode() + b"\r\n" + body


def test_requests_served_through_the_door_on_one_connection_make_no_reference_cycles(
    tmp_path: Path, saved_collector: None
) -> None:
    """The door's per-request objects (in the scope, pointing at uvicorn's cycle, whose
    scope they are in) and the client watch must not tie a finished request's cycle and
    scope into a loop that only the collector would free."""
    router = make_router(tmp_path, answer)  # type: ignore[arg-type]
    requests = [
        http_request(CHAT, json.dumps(chat()).encode()),
        http_request(CHAT, json.dumps(chat(stream=True)).encode()),
        http_request(CHAT, json.dumps({**chat(), "model": "no-such-model"}).encode()),
        http_request(CHAT, b"{not json"),
        http_request("/v1/models", b"", method="GET"),
    ]
    connection: list[Any] = []  # the one connection, until it is lost
    kinds: list[type] = []  # its protocol's class, made for this test: a cycle of its own

    async def serve_all() -> None:
        protocol = connection[0]
        for raw in requests:
            writes = protocol.transport.writes
            before = len(writes)
            protocol.data_received(raw)
            await asyncio.gather(*protocol.tasks)
            assert len(writes) > before, "no answer written"

    def lose_it() -> None:
        protocol = connection.pop()
        protocol.connection_lost(None)
        # As asyncio's and uvloop's transports drop their protocol once it is told the
        # connection is lost: the fake one's link back is no cycle of the door's.
        protocol.transport.protocol = None
        kinds.append(type(protocol))

    async def scenario() -> Counter[str]:
        async with router.app.router.lifespan_context(router.app):
            connection.append(door_for(router.app, Recording()))
            return await garbage_of(serve_all, then=lose_it)

    found = asyncio.run(scenario())
    assert not found, f"objects left in reference cycles by 100 requests: {found.most_common(10)}"


def test_tuning_freezes_what_startup_made_and_spaces_out_young_collections(
    saved_collector: None,
) -> None:
    gc_tuning.tune_for_serving()
    assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == (gc_tuning.YOUNG_THRESHOLD, *gc_tuning.OLDER_THRESHOLDS)
