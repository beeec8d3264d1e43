"""Each engine's own metrics in the router's /metrics, in-process: relabelled with
``model`` and ``role``, merged by family, cached, and never waited on past the timeout
when an engine hangs."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from slm_server.registry.schema import ModelSpec
from slm_server.router.dispatch.lookup import Registry
from slm_server.router.observe.engine_metrics import EngineMetrics
from tests.unit.router.inprocess import (
    FakeResponse,
    Router,
    Sent,
    call,
    entry_text,
    make_router,
    whole,
)

LLAMA_METRICS = b"""# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 30
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing{model="gguf-name"} 1
"""
SECOND = entry_text("second", 18002)


# Every test here runs twice: through plain ASGI and through the door (its fast path).
pytestmark = pytest.mark.usefixtures("via")


async def nothing(_sent: Sent) -> FakeResponse:
    return whole({})


def ready_router(tmp_path: Path) -> Router:
    router = make_router(tmp_path, nothing, more=SECOND)
    router.states.alive = True
    for spec in router.registry.models:
        router.supervisor.publish(spec, "ready")
    return router


def families(text: bytes) -> dict[str, list[tuple[dict[str, str], float]]]:
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text.decode()):
        found[family.name] = [(dict(s.labels), s.value) for s in family.samples]
    return found


def test_every_ready_engine_is_relabelled_and_merged_into_one_family(tmp_path: Path) -> None:
    router = ready_router(tmp_path)
    for role in ("chat", "second"):
        router.transport.pages[(role, "/metrics")] = (200, LLAMA_METRICS)

    async def scenario() -> None:
        got = await call(router.app, "/metrics", b"", method="GET")
        assert got.status == 200
        found = families(got.body)
        samples = sorted(found["llamacpp:prompt_tokens"], key=lambda s: s[0]["role"])
        assert samples == [
            ({"model": "org/chat-model", "role": "chat", "replica": "1"}, 30.0),
            ({"model": "second-model", "role": "second", "replica": "1"}, 30.0),
        ]
        # The engine's own "model" label is kept as engine_model.
        [(labels, _value), _other] = found["llamacpp:requests_processing"]
        assert labels["engine_model"] == "gguf-name"
        assert "slm_requests" in found  # the router's own families are there too

    asyncio.run(scenario())


def test_a_hung_engine_never_holds_a_scrape_and_others_still_show(tmp_path: Path) -> None:
    router = ready_router(tmp_path)
    router.transport.pages[("chat", "/metrics")] = asyncio.Event()  # never answers
    router.transport.pages[("second", "/metrics")] = (200, LLAMA_METRICS)

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        got = await call(router.app, "/metrics", b"", method="GET")
        assert loop.time() - started < 1.5  # the 0.5 s timeout, not the hang
        roles = {labels["role"] for labels, _ in families(got.body)["llamacpp:prompt_tokens"]}
        assert roles == {"second"}

    asyncio.run(scenario())


def test_answers_are_cached_and_an_engine_without_metrics_is_not_asked_again(
    tmp_path: Path,
) -> None:
    router = ready_router(tmp_path)
    asked: list[str] = []
    now = [100.0]

    transport = router.transport
    transport.pages[("chat", "/metrics")] = (200, LLAMA_METRICS)
    transport.pages[("second", "/metrics")] = (404, b"not found")
    real_fetch = transport.fetch

    async def counting(
        spec: ModelSpec, path: str, timeout: float, max_bytes: int
    ) -> tuple[int, bytes] | None:
        asked.append(spec.role)
        return await real_fetch(spec, path, timeout, max_bytes)

    transport.fetch = counting  # type: ignore[method-assign]
    registry = Registry(router.registry.models)
    engines = EngineMetrics(registry, router.states, transport, clock=lambda: now[0])

    async def scenario() -> None:
        await engines.refresh()
        assert sorted(asked) == ["chat", "second"]
        await engines.refresh()  # within the cache time: nothing asked
        assert len(asked) == 2
        now[0] += 3.0
        await engines.refresh()  # chat again; second said 404 a moment ago
        assert sorted(asked) == ["chat", "chat", "second"]
        assert b"llamacpp:prompt_tokens_total" in engines.exposition()

    asyncio.run(scenario())


def test_another_gateways_own_families_are_left_out(tmp_path: Path) -> None:
    router = ready_router(tmp_path)
    other_gateway = LLAMA_METRICS + (
        b"# HELP slm_requests_total Requests.\n# TYPE slm_requests_total counter\n"
        b'slm_requests_total{model="far"} 7\n'
    )
    router.transport.pages[("chat", "/metrics")] = (200, other_gateway)

    async def scenario() -> None:
        got = await call(router.app, "/metrics", b"", method="GET")
        assert got.status == 200
        assert got.body.count(b"# HELP slm_requests_total ") == 1  # no family twice
        found = families(got.body)
        assert "llamacpp:prompt_tokens" in found
        assert all("engine_model" not in labels for labels, _ in found["slm_requests"])

    asyncio.run(scenario())
