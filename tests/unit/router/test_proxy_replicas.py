"""Replicas in-process: the router spreads requests over an entry's replicas, skips the
ones the supervisor says cannot serve, answers 503 only when none can, sends a request
refused at connect to another replica, and keeps a conversation on one replica under
prefix affinity."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from slm_server.errors import BackendUnavailable
from slm_server.registry.schema import parse_registry
from slm_server.router.call.exchange import Exchange
from slm_server.router.observe.telemetry import span_attributes
from tests.registry_entries import registry_entry, registry_yaml
from tests.unit.router.inprocess import (
    FakeResponse,
    Router,
    Sent,
    call,
    held_until,
    make_router,
    run,
    whole,
)

CHAT = "/v1/chat/completions"
MODEL = "org/chat-model"
ANSWER = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": MODEL,
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
    ],
}
SYSTEM = "You are the assistant of conversation {0}. Answer briefly and politely. " * 8


# Every test here runs twice: through plain ASGI and through the door (its fast path).
pytestmark = pytest.mark.usefixtures("via")


def chat(content: str = "hi", system: str | None = None) -> dict[str, Any]:
    messages = [{"role": "user", "content": content}]
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})
    return {"model": MODEL, "messages": messages}


async def answer(_sent: Sent) -> FakeResponse:
    return whole(ANSWER)


def replicas(tmp_path: Path, script: Any = answer, count: int = 3, **fields: Any) -> Router:
    extra = "".join(f"    {k}: {v}\n" for k, v in {"replicas": count, **fields}.items())
    return make_router(tmp_path, script, concurrency=1, queue=4, chat=extra)


def supervised(router: Router, **states: str) -> None:
    """A running supervisor that publishes every replica ready, but those named."""
    router.states.alive = True
    for spec in router.registry.models:
        router.supervisor.publish(spec, states.get(spec.role.replace(".", "_"), "ready"))


def ports(router: Router) -> Counter[int]:
    return Counter(sent.spec.entry.port for sent in router.transport.sent)


def test_requests_in_flight_spread_over_the_replicas(tmp_path: Path) -> None:
    release = asyncio.Event()
    router = replicas(tmp_path, held_until(release, ANSWER))

    async def scenario() -> None:
        async with router.app.router.lifespan_context(router.app):
            calls = [asyncio.ensure_future(call(router.app, CHAT, chat())) for _ in range(3)]
            while len(router.transport.sent) < 3:
                await asyncio.sleep(0)
            assert ports(router) == {18001: 1, 18002: 1, 18003: 1}
            assert [router.deps.gates[r].active for r in ("chat", "chat.2", "chat.3")] == [1] * 3
            release.set()
            assert [got.status for got in await asyncio.gather(*calls)] == [200] * 3

    run(scenario())


def test_one_request_at_a_time_takes_the_replicas_in_turn(tmp_path: Path) -> None:
    router = replicas(tmp_path)

    async def scenario() -> None:
        async with router.app.router.lifespan_context(router.app):
            for _ in range(9):
                assert (await call(router.app, CHAT, chat())).status == 200
            assert ports(router) == {18001: 3, 18002: 3, 18003: 3}

    run(scenario())


def test_a_replica_that_is_not_ready_gets_no_traffic(tmp_path: Path) -> None:
    router = replicas(tmp_path)
    supervised(router, chat_2="restarting")

    async def scenario() -> None:
        async with router.app.router.lifespan_context(router.app):
            for _ in range(6):
                assert (await call(router.app, CHAT, chat())).status == 200
            assert ports(router) == {18001: 3, 18003: 3}
            for state in ("starting", "abandoned", "failed"):
                supervised(router, chat_3=state)
                before = len(router.transport.sent)
                for _ in range(4):
                    assert (await call(router.app, CHAT, chat())).status == 200
                sent = router.transport.sent[before:]
                assert {s.spec.role for s in sent} == {"chat", "chat.2"}, state

    run(scenario())


def test_with_no_replica_serving_a_request_waits_for_one_coming_back(tmp_path: Path) -> None:
    router = replicas(tmp_path, count=2)

    async def scenario() -> None:
        async with router.app.router.lifespan_context(router.app):
            supervised(router, chat="abandoned", chat_2="restarting")
            waiting = asyncio.ensure_future(call(router.app, CHAT, chat()))
            loop = asyncio.get_running_loop()
            give_up = loop.time() + 5
            while router.deps.gates["chat.2"].active == 0:
                assert loop.time() < give_up, "the request was never admitted"
                await asyncio.sleep(0.005)
            assert router.transport.sent == []  # it waits for the replica coming back
            supervised(router, chat="abandoned", chat_2="ready")
            got = await waiting
            assert got.status == 200
            assert [s.spec.role for s in router.transport.sent] == ["chat.2"]

    run(scenario())


def test_with_no_replica_serving_nor_coming_back_the_client_gets_503(tmp_path: Path) -> None:
    router = replicas(tmp_path, count=2)

    async def scenario() -> None:
        async with router.app.router.lifespan_context(router.app):
            supervised(router, chat="abandoned", chat_2="failed")
            got = await call(router.app, CHAT, chat())
            assert got.status == 503
            assert got.json()["error"]["code"] == "backend_abandoned"
            assert "retry-after" not in got.headers
            assert router.transport.sent == []

    run(scenario())


def test_a_replica_refusing_the_connection_passes_the_request_on(tmp_path: Path) -> None:
    async def script(sent: Sent) -> FakeResponse:
        if sent.spec.role == "chat.2":
            raise BackendUnavailable("The backend is unreachable", retry_after=5.0)
        return whole(ANSWER)

    router = replicas(tmp_path, script)

    async def scenario() -> None:
        async with router.app.router.lifespan_context(router.app):
            for _ in range(6):
                assert (await call(router.app, CHAT, chat())).status == 200
            refused = [s for s in router.transport.sent if s.spec.role == "chat.2"]
            assert refused  # it was tried, and every request it refused went on
            served = Counter(s.spec.role for s in router.transport.sent if s not in refused)
            assert served.total() == 6
            assert set(served) == {"chat", "chat.3"}
            # The refusals count against that replica alone.
            failures = router.events.named("backend_failure")
            assert failures
            assert {e["role"] for e in failures} == {"chat.2"}
            assert all(router.deps.gates[r].active == 0 for r in ("chat", "chat.2", "chat.3"))

    run(scenario())


def test_when_every_replica_refuses_the_client_gets_the_refusal(tmp_path: Path) -> None:
    async def script(_sent: Sent) -> FakeResponse:
        raise BackendUnavailable("The backend is unreachable", retry_after=5.0)

    router = replicas(tmp_path, script, count=2)

    async def scenario() -> None:
        async with router.app.router.lifespan_context(router.app):
            got = await call(router.app, CHAT, chat())
            assert got.status == 503
            assert got.json()["error"]["code"] == "backend_unreachable"
            assert sorted(s.spec.role for s in router.transport.sent) == ["chat", "chat.2"]

    run(scenario())


def test_a_queued_request_waits_on_the_least_loaded_replica(tmp_path: Path) -> None:
    release = asyncio.Event()
    router = replicas(tmp_path, held_until(release, ANSWER), count=2)

    async def scenario() -> None:
        async with router.app.router.lifespan_context(router.app):
            calls = [asyncio.ensure_future(call(router.app, CHAT, chat())) for _ in range(5)]
            gates = [router.deps.gates[r] for r in ("chat", "chat.2")]
            while sum(g.active + g.queued for g in gates) < 5:
                await asyncio.sleep(0)
            assert sorted((g.active, g.queued) for g in gates) == [(1, 1), (1, 2)]
            release.set()
            assert [got.status for got in await asyncio.gather(*calls)] == [200] * 5

    run(scenario())


def test_prefix_affinity_keeps_each_conversation_on_one_replica(tmp_path: Path) -> None:
    router = replicas(tmp_path, routing="prefix_affinity")

    async def scenario() -> None:
        async with router.app.router.lifespan_context(router.app):
            for turn in range(4):
                for conversation in range(3):
                    body = chat(f"turn {turn}", system=SYSTEM.format(conversation))
                    assert (await call(router.app, CHAT, body)).status == 200
            by_conversation: dict[str, set[str]] = {}
            for sent in router.transport.sent:
                system = sent.json()["messages"][0]["content"]
                by_conversation.setdefault(system, set()).add(sent.spec.role)
            assert all(len(roles) == 1 for roles in by_conversation.values())
            assert len({next(iter(r)) for r in by_conversation.values()}) == 3

    run(scenario())


def test_prefix_affinity_keeps_a_prompt_cache_key_on_one_replica(tmp_path: Path) -> None:
    """Codex CLI's sessions: each turn under the session's key, short inputs (no whole
    block of text), the key alone keeps the session where it went."""
    router = replicas(tmp_path, routing="prefix_affinity")

    async def scenario() -> None:
        async with router.app.router.lifespan_context(router.app):
            for turn in range(4):
                for session in range(3):
                    body = {**chat(f"turn {turn}"), "prompt_cache_key": f"session-{session}"}
                    assert (await call(router.app, CHAT, body)).status == 200
            by_session: dict[str, set[str]] = {}
            for sent in router.transport.sent:
                by_session.setdefault(sent.json()["prompt_cache_key"], set()).add(sent.spec.role)
            assert all(len(roles) == 1 for roles in by_session.values())
            assert len({next(iter(r)) for r in by_session.values()}) == 3

    run(scenario())


def test_prefix_affinity_bypasses_an_overloaded_favourite(tmp_path: Path) -> None:
    release = asyncio.Event()
    router = replicas(
        tmp_path,
        held_until(release, ANSWER),
        count=2,
        routing="prefix_affinity",
        affinity_threshold=1,
    )
    system = SYSTEM.format("busy")

    async def scenario() -> None:
        async with router.app.router.lifespan_context(router.app):
            calls = []
            for n in range(4):
                calls.append(asyncio.ensure_future(call(router.app, CHAT, chat(str(n), system))))
                while (
                    len(router.transport.sent)
                    + sum(router.deps.gates[r].queued for r in ("chat", "chat.2"))
                    < n + 1
                ):
                    await asyncio.sleep(0)
            # 0 and 1 go home (1 queued: 2 over 0 would pass the threshold of 1, so
            # not yet); 2 is bypassed to the idle replica, 3 follows wherever least.
            home = router.transport.sent[0].spec.role
            gates = router.deps.gates
            assert gates[home].active + gates[home].queued == 2
            other = "chat.2" if home == "chat" else "chat"
            assert gates[other].active + gates[other].queued == 2
            release.set()
            assert [got.status for got in await asyncio.gather(*calls)] == [200] * 4

    run(scenario())


def test_the_replica_and_its_match_are_visible(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="slm_server.access")
    router = replicas(tmp_path, count=2, routing="prefix_affinity")
    body = chat("a question", system=SYSTEM.format("seen"))

    async def scenario() -> None:
        async with router.app.router.lifespan_context(router.app):
            first = await call(router.app, CHAT, body)
            second = await call(router.app, CHAT, body)
            assert (first.status, second.status) == (200, 200)
            recent = (await call(router.app, "/v1/ui/requests", b"", method="GET")).json()
            models = (await call(router.app, "/v1/models", b"", method="GET")).json()
            scrape = (await call(router.app, "/metrics", b"", method="GET")).body.decode()
            health = (await call(router.app, "/v1/backends/health", b"", method="GET")).json()
        home = router.transport.sent[0].spec
        assert router.transport.sent[1].spec is home
        newest, oldest = recent["data"][:2]
        assert (oldest["replica"], oldest["prefix_match_chars"]) == (home.role, 0)
        matched = newest["prefix_match_chars"]
        assert newest["replica"] == home.role
        assert matched > 0 and matched % 64 == 0
        [line_one, line_two] = [r for r in caplog.records if r.name == "slm_server.access"][:2]
        assert getattr(line_two, "replica", None) == home.role
        assert getattr(line_two, "routing", None) == "prefix_match"
        assert getattr(line_two, "prefix_match_chars", None) == matched
        assert line_two.getMessage().endswith(
            f" replica={home.role} routing=prefix_match match={matched}"
        )
        assert getattr(line_one, "routing", None) == "least_outstanding"
        # One model for the id, its replicas in its status.
        [model] = models["data"]
        assert (model["id"], model["replicas"], model["routing"]) == (MODEL, 2, "prefix_affinity")
        assert [r["role"] for r in model["status"]["replicas"]] == ["chat", "chat.2"]
        assert [r["port"] for r in model["status"]["replicas"]] == [18001, 18002]
        assert {role: item["replica"] for role, item in health.items()} == {"chat": 1, "chat.2": 2}
        counted = f'slm_routed_requests_total{{model="{MODEL}",replica="{home.replica}",'
        assert counted + 'rule="prefix_match"} 1.0' in scrape

    run(scenario())


def test_span_attributes_name_the_replica_and_the_match() -> None:
    entry = registry_entry(
        "m",
        9100,
        model_path="m.gguf",
        default_timeout=5,
        quantization="Q4_1",
        replicas=2,
        routing="prefix_affinity",
    )
    text = "models:\n" + registry_yaml("chat", entry)
    second = parse_registry(text, Path("models.yaml")).models[1]
    exchange = Exchange("id", "POST", CHAT, spec=second)
    assert "slm.replica" not in span_attributes(exchange)  # not routed among replicas
    exchange.routing_rule, exchange.prefix_match_chars = "prefix_match", 640
    attributes = span_attributes(exchange)
    assert attributes["slm.replica"] == 2
    assert attributes["slm.routing.rule"] == "prefix_match"
    assert attributes["slm.routing.prefix_match_chars"] == 640
    assert attributes["server.port"] == 9101


def test_a_replica_seen_restarting_loses_its_prefixes(tmp_path: Path) -> None:
    router = replicas(tmp_path, count=2, routing="prefix_affinity")
    body = chat("a question", system=SYSTEM.format("kept"))

    async def scenario() -> None:
        async with router.app.router.lifespan_context(router.app):
            supervised(router)
            assert (await call(router.app, CHAT, body)).status == 200
            home = router.transport.sent[0].spec.role
            supervised(router, **{home.replace(".", "_"): "restarting"})
            assert (await call(router.app, CHAT, body)).status == 200  # served elsewhere
            supervised(router)
            assert (await call(router.app, CHAT, body)).status == 200
        roles = [sent.spec.role for sent in router.transport.sent]
        assert roles[1] != home
        assert roles[2] == roles[1]  # its cache, not the restarted replica's, holds it

    run(scenario())
