"""Following the supervisor's applied registry, in-process: a new stamp whose snapshot
matches is followed and the router routes by it; a snapshot of another version is
not; nothing is followed without a running supervisor; the backends a reload retires
are told ``retired`` once their old gate holds nothing (and at once when the router
holds none), and a stream in flight on a removed entry completes."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import pytest

from slm_server.contracts.applied_registry import version_of, write_snapshot
from slm_server.contracts.commands import Command
from slm_server.router.reload.rewire import Change, Rewire
from tests.unit.router.inprocess import (
    Answer,
    FakeResponse,
    Router,
    Script,
    Sent,
    Step,
    call,
    entry_text,
    held_until,
    make_router,
    registry_text,
    run,
    serving,
    until,
    whole,
)
from tests.unit.router.reload.reloading import (
    ANSWER,
    APPLIED_AT,
    APPLIED_FROM,
    CHAT,
    CHAT_ID,
    chat_body,
    publish,
    retiring,
)

EXTRA = entry_text("extra", 18002)
WITH_EXTRA = registry_text(more=EXTRA)
ONLY_EXTRA = "models:\n" + EXTRA


async def answer_whole(_sent: Sent) -> FakeResponse:
    return whole(ANSWER)


def supervised(tmp_path: Path, script: Script = answer_whole) -> Router:
    """A router whose supervisor runs; it follows only when the test says."""
    router = make_router(tmp_path, script, follow_seconds=3600)
    router.states.alive = True
    return router


async def ids(router: Router) -> list[str]:
    listed = (await call(router.app, "/v1/models", b"", method="GET")).json()
    return [model["id"] for model in listed["data"]]


def test_a_new_stamp_whose_snapshot_matches_is_followed(tmp_path: Path) -> None:
    router = supervised(tmp_path)

    async def scenario() -> None:
        async with serving(router):
            before = (await call(router.app, "/health", b"", method="GET")).json()
            assert before["registry"] == {
                "version": version_of(registry_text()),
                "generation": None,
                "loaded_at": None,
                "path": str(tmp_path / "models.yaml"),
            }
            publish(router, WITH_EXTRA)
            assert (await call(router.app, CHAT, chat_body("extra-model"))).status == 404
            await router.follower.sync()
            got = await call(router.app, CHAT, chat_body("extra-model"))
            assert got.status == 200, got.body
            assert router.transport.sent[-1].spec.role == "extra"
            assert await ids(router) == [CHAT_ID, "extra-model"]
            assert set(router.deps.gates) == {"chat", "extra"}
            after = (await call(router.app, "/health", b"", method="GET")).json()
            after.pop("memory")  # the machine's, beside the budget: not the registry's
            assert after == {
                "status": "ok",
                "models": 2,
                "registry": {
                    "version": version_of(WITH_EXTRA),
                    "generation": 2,
                    "loaded_at": APPLIED_AT,
                    "path": APPLIED_FROM,
                },
            }
            listing = await call(router.app, "/v1/backends/health", b"", method="GET")
            assert listing.headers["x-registry-version"] == version_of(WITH_EXTRA)
            assert listing.headers["x-registry-generation"] == "2"
            assert set(listing.json()) == {"chat", "extra"}
            scrape = (await call(router.app, "/metrics", b"", method="GET")).body.decode()
            assert 'slm_backend_state{model="extra-model",replica="1",role="extra"' in scrape

    run(scenario())


def test_a_snapshot_of_another_version_is_not_followed_until_it_matches(tmp_path: Path) -> None:
    router = supervised(tmp_path)

    async def scenario() -> None:
        async with serving(router):
            stamp = publish(router, WITH_EXTRA)
            # A newer reload's text already, or a forged one: not the stamped version.
            write_snapshot(router.settings.log_dir, WITH_EXTRA + "\n# edited\n")
            await router.follower.sync()
            assert await ids(router) == [CHAT_ID]
            assert router.follower.in_force.version == version_of(registry_text())
            write_snapshot(router.settings.log_dir, WITH_EXTRA)
            await router.follower.sync()
            assert await ids(router) == [CHAT_ID, "extra-model"]
            assert router.follower.in_force.version == stamp.version

    run(scenario())


def test_nothing_is_followed_without_a_running_supervisor(tmp_path: Path) -> None:
    router = supervised(tmp_path)

    async def scenario() -> None:
        async with serving(router):
            router.states.alive = False
            publish(router, ONLY_EXTRA, retiring=(retiring("chat"),))
            await router.follower.sync()
            assert await ids(router) == [CHAT_ID]
            assert router.supervisor.sent("retired") == []
            router.states.alive = True
            await router.follower.sync()
            assert await ids(router) == ["extra-model"]

    run(scenario())


def test_a_router_started_after_a_reload_routes_by_the_applied_registry(tmp_path: Path) -> None:
    router = supervised(tmp_path)
    publish(router, ONLY_EXTRA)  # the file on disk still has the chat model

    async def scenario() -> None:
        async with serving(router):
            assert await ids(router) == ["extra-model"]
            assert (await call(router.app, CHAT, chat_body(CHAT_ID))).status == 404

    run(scenario())


def test_a_stream_on_a_removed_entry_completes_and_then_it_is_retired_once(
    tmp_path: Path,
) -> None:
    release = asyncio.Event()
    first = b'data: {"choices": [{"index": 0, "delta": {"content": "a"}}]}\n\n'
    last = b'data: {"choices": [{"index": 0, "delta": {"content": "b"}}]}\n\n'

    async def streaming(_sent: Sent) -> FakeResponse:
        steps: list[Step] = [first, release, last, b"data: [DONE]\n\n"]
        return FakeResponse(200, {"content-type": "text/event-stream"}, steps)

    router = supervised(tmp_path, streaming)

    async def scenario() -> None:
        async with serving(router):
            answer = Answer()
            streamed = asyncio.ensure_future(
                call(router.app, CHAT, chat_body(CHAT_ID, stream=True), answer=answer)
            )
            await until(lambda: bool(answer.chunks), "the stream's first chunk")
            old_gate = router.deps.gates["chat"]
            publish(router, ONLY_EXTRA, retiring=(retiring("chat"),))
            await router.follower.sync()
            assert "chat" not in router.deps.gates
            refused = await call(router.app, CHAT, chat_body(CHAT_ID))
            assert refused.status == 404
            assert refused.json()["error"]["code"] == "model_not_found"
            await router.follower.sync()
            assert router.supervisor.sent("retired") == []  # the stream is in flight
            assert router.follower.retirements.draining("chat") == (old_gate,)
            release.set()
            await streamed
            assert answer.status == 200 and answer.complete
            assert b'"content": "b"' in answer.body and answer.body.endswith(b"[DONE]\n\n")
            await router.follower.sync()
            await router.follower.sync()
            assert router.supervisor.sent("retired") == [Command("retired", "chat", pid=4242)]
            assert router.follower.retirements.draining("chat") == ()

    run(scenario())


def test_a_retiring_backend_the_router_holds_nothing_for_is_retired_at_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    router = supervised(tmp_path)

    async def scenario() -> None:
        async with serving(router):
            router.states.retired = [retiring("gone", pid=77)]
            router.supervisor.unreachable = True
            with caplog.at_level(logging.WARNING, logger="slm_server.router"):
                await router.follower.sync()
                await router.follower.sync()
            router.supervisor.unreachable = False
            await router.follower.sync()  # asked again: the last ones were not delivered
            await router.follower.sync()
            assert router.supervisor.sent("retired") == [Command("retired", "gone", pid=77)] * 3

    run(scenario())
    warned = [r for r in caplog.records if "is drained (asked again" in r.getMessage()]
    assert len(warned) == 1  # said once, not at every look


def test_a_replaced_backend_gets_a_new_gate_while_its_old_one_drains(tmp_path: Path) -> None:
    release = asyncio.Event()
    router = supervised(tmp_path, held_until(release, ANSWER))

    async def scenario() -> None:
        async with serving(router):
            held = asyncio.ensure_future(call(router.app, CHAT, chat_body(CHAT_ID)))
            old_gate = router.deps.gates["chat"]
            await until(lambda: old_gate.active == 1, "the request in flight")
            replaced = registry_text(chat="    context_length: 4096\n")
            publish(router, replaced, retiring=(retiring("chat", reason="replaced"),))
            await router.follower.sync()
            assert router.follower.in_force.version == version_of(replaced)
            new_gate = router.deps.gates["chat"]
            assert new_gate is not old_gate
            assert (new_gate.active, old_gate.active) == (0, 1)
            assert router.supervisor.sent("retired") == []
            release.set()
            assert (await held).status == 200
            await router.follower.sync()
            assert router.supervisor.sent("retired") == [Command("retired", "chat", pid=4242)]

    run(scenario())


def test_a_router_only_change_resizes_the_gate_it_keeps(tmp_path: Path) -> None:
    router = supervised(tmp_path)

    async def scenario() -> None:
        async with serving(router):
            gate = router.deps.gates["chat"]
            publish(router, registry_text(concurrency=5, queue=9, timeout=7))
            await router.follower.sync()
            assert router.deps.gates["chat"] is gate
            assert (gate.limit, gate.max_queue) == (5, 9)
            assert router.registry.models[0].entry.default_timeout == 5  # the file's
            listed = (await call(router.app, f"/v1/models/{CHAT_ID}", b"", method="GET")).json()
            assert listed["id"] == CHAT_ID
            assert router.follower.rewire.registry.entries[0].entry.default_timeout == 7

    run(scenario())


def test_a_snapshot_that_does_not_parse_is_reported_once_and_not_followed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    router = supervised(tmp_path)
    broken = "models:\n  chat: {id: 5}\n"

    async def scenario() -> None:
        async with serving(router):
            publish(router, broken)
            with caplog.at_level(logging.ERROR, logger="slm_server.router"):
                await router.follower.sync()
                await router.follower.sync()
            assert await ids(router) == [CHAT_ID]

    run(scenario())
    errors = [r for r in caplog.records if "does not parse here" in r.getMessage()]
    assert len(errors) == 1


def test_a_reload_that_adds_an_on_demand_model_loads_it_for_its_first_request(
    tmp_path: Path,
) -> None:
    router = supervised(tmp_path)
    added = registry_text(more=entry_text("lazy", 18003, "load: on_demand"))

    async def scenario() -> None:
        async with serving(router):
            publish(router, added)
            await router.follower.sync()
            lazy = router.follower.rewire.registry.lookup("lazy-model")
            router.supervisor.specs["lazy"] = lazy
            router.supervisor.publish(lazy, "unloaded")
            got = await call(router.app, CHAT, chat_body("lazy-model"))
            assert got.status == 200, got.body
            assert [c.role for c in router.supervisor.sent("load")] == ["lazy"]
            assert json.loads(router.transport.sent[-1].body)["model"] == "lazy-model"

    run(scenario())


def test_a_registry_the_router_cannot_be_rewired_to_is_reported_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    router = supervised(tmp_path)

    def broken(*_args: object) -> Change:
        raise RuntimeError("a fault of the router's")

    async def scenario() -> None:
        async with serving(router):
            publish(router, WITH_EXTRA)
            monkeypatch.setattr(Rewire, "apply", broken)
            with caplog.at_level(logging.ERROR, logger="slm_server.router"):
                await router.follower.sync()
                await router.follower.sync()
            assert router.follower.in_force.version == version_of(registry_text())

    run(scenario())
    errors = [r for r in caplog.records if "could not be rewired" in r.getMessage()]
    assert len(errors) == 1


def test_a_request_waiting_for_a_load_the_reload_removed_gets_404(tmp_path: Path) -> None:
    lazy = entry_text("lazy", 18003, "load: on_demand")
    router = make_router(tmp_path, answer_whole, more=lazy, follow_seconds=3600)
    router.supervisor.load_seconds = 60.0  # loading until the test is over

    async def scenario() -> None:
        async with serving(router):
            waiting = asyncio.ensure_future(call(router.app, CHAT, chat_body("lazy-model")))
            await until(lambda: router.supervisor.state("lazy") == "loading", "the load asked")
            publish(router, registry_text(), retiring=(retiring("lazy", pid=99),))
            await router.follower.sync()
            got = await waiting
            assert got.status == 404
            assert got.json()["error"]["code"] == "model_not_found"
            assert "removed from the registry by a reload" in got.json()["error"]["message"]
            await router.follower.sync()
            assert router.supervisor.sent("retired") == [Command("retired", "lazy", pid=99)]

    run(scenario())


def test_an_entry_whose_replicas_and_routing_a_reload_left_alone_keeps_its_balancer(
    tmp_path: Path,
) -> None:
    affinity = "    replicas: 2\n    routing: prefix_affinity\n"
    router = make_router(tmp_path, answer_whole, chat=affinity, follow_seconds=3600)
    router.states.alive = True
    choice = router.follower.rewire.choice

    async def scenario() -> None:
        async with serving(router):
            [balancer] = choice.balancers.values()
            publish(router, registry_text(chat=affinity, concurrency=5), generation=2)
            await router.follower.sync()
            assert list(choice.balancers.values()) == [balancer]
            more = "    replicas: 3\n    routing: prefix_affinity\n"
            publish(router, registry_text(chat=more), generation=3)
            await router.follower.sync()
            [grown] = choice.balancers.values()
            assert grown is not balancer and len(grown.indexes) == 3
            assert (await call(router.app, CHAT, chat_body(CHAT_ID))).status == 200

    run(scenario())


def test_a_request_queued_on_the_old_gate_is_served_by_the_old_process_not_held(
    tmp_path: Path,
) -> None:
    """The benchmark's deadlock: a request admitted on a replaced backend's old gate
    after the router followed the reload must not wait for the new backend (which
    starts only once the old gate is idle and the old process retired): it is sent to
    the old process, and the old gate drains at once."""
    release = asyncio.Event()
    router = make_router(tmp_path, held_until(release, ANSWER), concurrency=1, follow_seconds=3600)
    router.states.alive = True

    async def scenario() -> None:
        async with serving(router):
            first = asyncio.ensure_future(call(router.app, CHAT, chat_body(CHAT_ID)))
            old_gate = router.deps.gates["chat"]
            await until(lambda: old_gate.active == 1, "the first request in flight")
            queued = asyncio.ensure_future(call(router.app, CHAT, chat_body(CHAT_ID)))
            await until(lambda: old_gate.queued == 1, "the second request queued")
            replaced = registry_text(concurrency=1, chat="    context_length: 4096\n")
            publish(router, replaced, retiring=(retiring("chat", reason="replaced"),))
            await router.follower.sync()
            # The supervisor publishes the replacing backend: starting, by a reload.
            new_spec = router.registry.enabled[0]
            router.supervisor.publish(new_spec, "starting", reloaded=True)
            release.set()
            assert (await first).status == 200
            got = await asyncio.wait_for(queued, 3)
            assert got.status == 200, got.body
            assert (old_gate.active, old_gate.queued) == (0, 0)
            await router.follower.sync()
            assert router.supervisor.sent("retired") == [Command("retired", "chat", pid=4242)]

    run(scenario())
