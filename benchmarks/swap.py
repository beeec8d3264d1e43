"""Scenario ``swap``: what loading on demand costs a client, on the real llama-server.

* ``cold``: SmolLM2 135M as ``load: on_demand``, nothing loaded. One streamed request:
  its time to first token through the router, against the backend's own part — its
  start to ready (``backend_loading`` → ``backend_loaded``) plus a warm request's time
  to first token. The rest is what the router and supervisor add (goal: ≤ 300 ms).
* ``swap``: SmolLM2 and Gemma 3 270M, both on demand, with a memory budget that holds
  only one. SmolLM2 is loaded and used; then one streamed request for Gemma: its time to
  first token against SmolLM2's unload (``backend_unloaded``'s ``seconds``), Gemma's
  load, and Gemma's warm time to first token (goal: the rest ≤ 300 ms).

Every trial runs on a fresh launcher and router (``SLM_SWAP_HOLD_SECONDS=0``: the
benchmark measures the mechanics, not the anti-thrash hold).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from benchmarks.report import DASH, Check, event_time, kind_spread, show, spread, table
from benchmarks.servers import Launched, free_port, launcher, router_for
from tests.integration.real_stack import example_registry, llama_server_bin
from tests.processes import poll

HELLO = [{"role": "user", "content": "Say hello."}]
ADDED_GOAL_MS = 300.0
# Holds either model, never both: their footprints count their prompt caches since
# issue 33 (SmolLM2 ~217 + 180 MiB, Gemma at 32k ~489 + 222 MiB).
ONE_MODEL_BUDGET_MB = 800


@dataclass(frozen=True)
class Plan:
    trials: int = 5  # of each kind


def _ttft(url: str, model: str) -> float:
    """Seconds from sending a streamed chat request to its first content chunk."""
    body = {"model": model, "messages": HELLO, "max_tokens": 8, "stream": True}
    started = time.perf_counter()
    with (
        httpx.Client(trust_env=False) as client,
        client.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=120) as reply,
    ):
        if reply.status_code != 200:
            raise AssertionError(f"{model}: {reply.status_code} {reply.read()[:300]!r}")
        first = None
        for line in reply.iter_lines():
            if first is None and line.startswith("data: ") and '"content"' in line:
                first = time.perf_counter() - started
        if first is None:
            raise AssertionError(f"{model}: no content in the stream")
        return first


def _event(launched: Launched, name: str, **match: Any) -> dict[str, Any]:
    found: list[dict[str, Any]] = []

    def seen() -> bool:
        found[:] = [
            e for e in launched.events(name) if all(e.get(k) == v for k, v in match.items())
        ]
        return bool(found)

    poll(seen, 60, f"watchdog event {name} {match}", interval=0.02)
    return found[-1]


def _models(roles: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    ports = {"standard": free_port(), "gemma": free_port(), "embeddings": 0}
    models: dict[str, dict[str, Any]] = example_registry(ports, roles=roles)["models"]
    for entry in models.values():
        entry["load"] = "on_demand"
    return models


def _env(**extra: str) -> dict[str, str]:
    return {"SLM_LLAMA_SERVER_BIN": llama_server_bin(), "SLM_SWAP_HOLD_SECONDS": "0", **extra}


def _load_seconds(launched: Launched, role: str) -> float:
    loading = _event(launched, "backend_loading", role=role)
    loaded = _event(launched, "backend_loaded", role=role)
    return event_time(loaded["ts"]) - event_time(loading["ts"])


def cold_trial(workdir: Path, index: int) -> dict[str, Any]:
    models = _models(("standard",))
    model = models["standard"]["id"]
    with launcher(workdir, models, _env()) as launched, router_for(workdir, launched.env) as router:
        cold = _ttft(router.url, model)
        warm = _ttft(router.url, model)
        load = _load_seconds(launched, "standard")
    return {
        "kind": "cold",
        "trial": index,
        "ttft_s": cold,
        "load_s": load,
        "warm_ttft_s": warm,
        "added_ms": (cold - load - warm) * 1000,
    }


def swap_trial(workdir: Path, index: int) -> dict[str, Any]:
    models = _models(("standard", "gemma"))
    first, second = models["standard"]["id"], models["gemma"]["id"]
    env = _env(SLM_MEMORY_BUDGET_MB=str(ONE_MODEL_BUDGET_MB))
    with launcher(workdir, models, env) as launched, router_for(workdir, launched.env) as router:
        _ttft(router.url, first)
        swapped = _ttft(router.url, second)
        warm = _ttft(router.url, second)
        unloaded = _event(launched, "backend_unloaded", role="standard")
        load = _load_seconds(launched, "gemma")
        assert unloaded["reason"] == "evicted", unloaded
    unload = float(unloaded["seconds"])
    return {
        "kind": "swap",
        "trial": index,
        "ttft_s": swapped,
        "unload_s": unload,
        "load_s": load,
        "warm_ttft_s": warm,
        "added_ms": (swapped - unload - load - warm) * 1000,
    }


def run_trials(plan: Plan, workdir: Path, say: Callable[[str], None]) -> list[dict[str, Any]]:
    trials = []
    for index in range(1, plan.trials + 1):
        for kind, trial in (("cold", cold_trial), ("swap", swap_trial)):
            result = trial(workdir / f"{kind}-{index}", index)
            say(
                f"  {kind} #{index}: first token after {result['ttft_s']:.2f} s, "
                f"the router and supervisor added {result['added_ms']:.0f} ms"
            )
            trials.append(result)
    return trials


def checks(trials: list[dict[str, Any]]) -> list[Check]:
    return [
        Check(
            "cold on-demand load: time to first token minus the backend's own start and TTFT",
            ADDED_GOAL_MS,
            "ms",
            kind_spread(trials, "cold", "added_ms"),
        ),
        Check(
            "swap: time to first token minus unload, load and the backend's own TTFT",
            ADDED_GOAL_MS,
            "ms",
            kind_spread(trials, "swap", "added_ms"),
        ),
    ]


def tables(trials: list[dict[str, Any]]) -> str:
    def row(kind: str, what: str, key: str, scale: float = 1.0, digits: int = 2) -> list[str]:
        values = [t[key] * scale for t in trials if t["kind"] == kind and key in t]
        return [kind, what, show(spread(values), digits)]

    rows = [
        row("cold", "time to first token (s)", "ttft_s"),
        row("cold", "backend start to ready (s)", "load_s"),
        row("cold", "warm time to first token (s)", "warm_ttft_s"),
        row("cold", "added by the gateway (ms)", "added_ms", digits=0),
        row("swap", "time to first token (s)", "ttft_s"),
        row("swap", "unload of the other model (s)", "unload_s"),
        row("swap", "backend start to ready (s)", "load_s"),
        row("swap", "warm time to first token (s)", "warm_ttft_s"),
        row("swap", "added by the gateway (ms)", "added_ms", digits=0),
    ]
    return table(["kind", "measure", f"median [min{DASH}max]"], rows)
