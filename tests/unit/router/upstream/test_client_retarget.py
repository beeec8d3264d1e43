"""The upstream client retargeted by a reloaded registry: a backend the reload left as
it was keeps its pool (and its kept-alive connections), a request routed before the
reload still reaches the backend it was routed to, and the old backend's pool is
closed only once nothing uses it."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import pytest

from slm_server.registry.schema import ModelSpec, parse_registry
from slm_server.router.upstream import client
from slm_server.router.upstream.client import Upstream, read_all
from tests.registry_entries import model_spec
from tests.unit.router.inprocess import run
from tests.unit.test_http1 import Peer, Server, chunked, ok


def spec_at(port: int, role: str = "m") -> ModelSpec:
    return model_spec(
        role, "m", port, model_path="models/m.gguf", default_timeout=5, quantization="Q4_0"
    )


async def answering(peer: Peer) -> None:
    """Answer every request on the connection with a small whole body."""
    while await peer.request() is not None:
        peer.send(ok(b"{}"))


async def until(predicate: object, what: str, timeout: float = 5.0) -> None:
    """Wait (yielding to the loop) until ``predicate()`` holds."""
    assert callable(predicate)
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


@pytest.fixture(autouse=True)
def quick_sweeps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client, "SWEEP_SECONDS", 0.01)


def test_a_backend_the_reload_left_alone_keeps_its_pool() -> None:
    async def scenario() -> None:
        async with Server(answering) as server:
            before = spec_at(server.port)
            upstream = Upstream((before,), 1.0, 0.5)
            await read_all(before, await upstream.open(before, "/v1/x", b"{}", {}), 1024)
            after = spec_at(server.port)  # the same entry, parsed again
            upstream.retarget((after,))
            await read_all(after, await upstream.open(after, "/v1/x", b"{}", {}), 1024)
            await read_all(before, await upstream.open(before, "/v1/x", b"{}", {}), 1024)
            assert len(server.peers) == 1  # one kept-alive connection throughout
            await upstream.aclose()

    run(scenario())


def test_a_request_routed_before_a_reload_reaches_its_backend_whose_pool_closes_after_it() -> None:
    release = asyncio.Event()

    async def streaming(peer: Peer) -> None:
        await peer.request()
        peer.send(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked(b"one"))
        await release.wait()
        peer.send(chunked(b"two") + b"0\r\n\r\n")
        while await peer.request() is not None:
            peer.send(ok(b"{}"))

    async def scenario() -> None:
        async with Server(streaming) as old_server, Server(answering) as new_server:
            old, new = spec_at(old_server.port), spec_at(new_server.port)
            upstream = Upstream((old,), 1.0, 0.5)
            stream = await upstream.open(old, "/v1/x", b"{}", {})
            assert await stream.receive() == b"one"
            upstream.retarget((new,))  # the entry now names another backend
            await read_all(new, await upstream.open(new, "/v1/x", b"{}", {}), 1024)
            assert len(new_server.peers) == 1
            upstream.retarget((new,))  # a sweep now, and more while the stream lasts
            await asyncio.sleep(0.05)  # (a close would reach the server within this)
            assert not old_server.peers[0].eof.is_set()  # the old pool is still in use
            release.set()
            assert await read_all(old, stream, 1024) == b"two"
            # Its connection went back to the old pool, which is closed now it is unused.
            await until(lambda: old_server.peers[0].eof.is_set(), "the old pool to close")
            # A straggler routed by the old registry still reaches the old backend.
            late = await upstream.open(old, "/v1/x", b"{}", {})
            assert await read_all(old, late, 1024) == b"onetwo"
            assert len(old_server.peers) == 2
            await until(lambda: old_server.peers[1].eof.is_set(), "the straggler's pool to close")
            await upstream.aclose()

    run(scenario())


def remote_spec(role: str, url: str) -> ModelSpec:
    registry = f"""
models:
  {role}:
    id: {role}
    backend: remote
    url: {url}
    api_key_env: {role.upper()}_KEY
    default_timeout: 5
"""
    [spec] = parse_registry(registry, Path("models.yaml")).models
    return spec


def test_a_remote_without_its_key_is_named_once_and_again_when_a_reload_adds_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    far = remote_spec("far", "http://10.0.0.5:8080/v1")
    with caplog.at_level(logging.WARNING, logger="slm_server.router"):
        upstream = Upstream((far,), 1.0, 0.5, env={})
        upstream.retarget((remote_spec("far", "http://10.0.0.5:8080/v1"),))  # unchanged
        upstream.retarget((far, remote_spec("farther", "http://10.0.0.6:8080/v1")))
    warned = [r.getMessage() for r in caplog.records]
    assert warned == [
        "far: FAR_KEY is not set; the remote is sent no key",
        "farther: FARTHER_KEY is not set; the remote is sent no key",
    ]
