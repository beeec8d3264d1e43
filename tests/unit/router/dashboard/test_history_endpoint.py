"""``GET /v1/ui/history`` in-process, through the production app: samples start with
the router, traffic makes the series move (requests, time to the first token, tokens
from the cache), gauges and lanes come from the gates, the memory watch and the
published states, watchdog events come from the log, ``since`` answers only what is
newer, a bad ``since`` is 400, and API keys apply."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from slm_server.contracts.events import utc_timestamp
from slm_server.router.dashboard.history import SERIES
from tests.unit.router.dashboard.history_router import (
    CHAT,
    HISTORY,
    KEY,
    MODEL,
    router_at,
)
from tests.unit.router.inprocess import (
    Router,
    backend_state,
    call,
    serving,
)


def run(scenario: Awaitable[None]) -> None:
    asyncio.run(asyncio.wait_for(scenario, 30))


async def history(router: Router, query: str = "") -> dict[str, Any]:
    got = await call(router.app, HISTORY + query, b"", method="GET", headers=KEY)
    assert got.status == 200, got.body
    answer: dict[str, Any] = got.json()
    return answer


async def history_until(
    router: Router, condition: Callable[[dict[str, Any]], bool], what: str
) -> dict[str, Any]:
    """The history once ``condition`` holds of it (asked every 50 ms, for 10 s)."""
    for _ in range(200):
        answer = await history(router)
        if condition(answer):
            return answer
        await asyncio.sleep(0.05)
    raise AssertionError(f"never: {what}")


def series(answer: dict[str, Any]) -> dict[str, list[Any]]:
    [model] = answer["models"]
    assert model["model"] == MODEL
    found: dict[str, list[Any]] = model["series"]
    return found


def publish_ready(router: Router) -> None:
    """A launcher runs and has published the chat model ready, holding 640 MiB."""
    spec = router.spec
    router.states.alive = True
    router.states.states[(spec.role, spec.entry.port)] = backend_state(
        spec, "ready", footprint_mb=640, budget_max=5, budget_window_seconds=600.0
    )


def test_traffic_moves_the_series_and_the_lanes_and_events_are_answered(tmp_path: Path) -> None:
    router = router_at(tmp_path)
    publish_ready(router)
    log = router.settings.watchdog.log_path

    async def scenario() -> None:
        async with serving(router):
            first = await history_until(router, lambda a: len(a["times"]) >= 2, "two samples")
            assert first["object"] == "ui.history"
            assert (first["interval_seconds"], first["keep_seconds"]) == (0.2, 3600.0)
            assert set(series(first)) == set(SERIES)
            assert series(first)["requests_ok"][0] is None  # no interval before the first
            assert series(first)["requests_ok"][1] == 0.0
            for _ in range(3):
                got = await call(
                    router.app, CHAT, {"model": MODEL, "messages": [], "stream": True}, headers=KEY
                )
                assert got.status == 200
            log.parent.mkdir(parents=True, exist_ok=True)
            record = {
                "ts": utc_timestamp(first["now"]),
                "event": "restart_succeeded",
                "role": "chat",
                "model_id": MODEL,
                "reason": "stall",
            }
            log.write_text(json.dumps(record) + "\n", encoding="utf-8")

            def moved(answer: dict[str, Any]) -> bool:
                values = series(answer)
                return any(values["requests_ok"][1:]) and bool(answer["events"])

            after = await history_until(router, moved, "the requests and the event in it")
            values = series(after)
            assert sum(v for v in values["prompt_tokens_cached"] if v) == 18  # 3 requests, 6 each
            assert (
                sum(v for v in values["prompt_tokens_computed"] if v) == 12
            )  # 3 requests, 10 - 6 each
            assert any(v is not None and v > 0 for v in values["ttft_p50"])
            assert values["memory_mb"][-1] == 640.0
            assert values["in_flight"][-1] == 0.0 and values["queued"][-1] == 0.0
            assert after["machine"]["held_mb"][-1] == 640.0
            assert after["machine"]["free_mb"][-1] == float(router.memory.free_mb or 0)
            [backend] = after["backends"]
            assert backend["role"] == "chat" and backend["model"] == MODEL
            assert set(backend["states"]) == {"ready"}
            assert backend["restart_budget"] == {
                "used": 0,
                "limit": 5,
                "left": 5,
                "frees_in_seconds": None,
            }
            [event] = after["events"]
            assert event["event"] == "restart_succeeded"
            assert (event["lane"], event["mark"], event["reason"]) == ("ready", "restart", "stall")
            assert (event["role"], event["model"]) == ("chat", MODEL)
            for key in ("times", *after["machine"]):
                column = after["times"] if key == "times" else after["machine"][key]
                assert len(column) == len(after["times"])
            assert all(len(v) == len(after["times"]) for v in values.values())

            # Only what is newer than ``since``.
            last = after["times"][-1]
            newer = await history(router, f"?since={last}")
            assert all(t > last for t in newer["times"])
            assert all(len(v) == len(newer["times"]) for v in series(newer).values())
            assert newer["events"] == []
            assert len(newer["backends"][0]["states"]) == len(newer["times"])

    run(scenario())


@pytest.mark.usefixtures("via")  # through plain ASGI and through the door
def test_the_key_is_needed_and_a_bad_since_is_refused(tmp_path: Path) -> None:
    router = router_at(tmp_path)

    async def scenario() -> None:
        refused = await call(router.app, HISTORY, b"", method="GET")
        assert refused.status == 401
        for since in ("abc", "nan", "inf", ""):
            got = await call(router.app, f"{HISTORY}?since={since}", b"", method="GET", headers=KEY)
            assert got.status == 400, since
            error = got.json()["error"]
            assert (error["param"], error["code"]) == ("since", "invalid_request")
            assert error["type"] == "invalid_request_error"
            assert "since" in error["message"]
        fine = await call(router.app, f"{HISTORY}?since=1.5e9", b"", method="GET", headers=KEY)
        assert fine.status == 200
        assert fine.json()["times"] == []  # not started: no samples yet

    run(scenario())
