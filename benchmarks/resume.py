"""Scenario ``resume``: coming back to a long prefix after a swap, on the real llama-server.

SmolLM2 135M (one slot, 8192-token context) and Gemma 3 270M, both ``load: on_demand``,
under a memory budget that holds only one. Each trial, on a fresh launcher and router:

1. SmolLM2 loaded; one streamed request with a ~6,000-token prefix: **cold** (a full
   prefill); the same request again: **warm** (the prefix in the slot, same process).
2. A request for Gemma evicts SmolLM2 (its slot saved: ``cache_saved``); a streamed
   request on the prefix brings SmolLM2 back: the **swap back**, its time to first
   token against the unload of Gemma, SmolLM2's load (the restore included: it happens
   before the load is published) and the warm time to first token; the rest is what the
   gateway adds (goal, as for every swap: ≤ 300 ms).
3. Gemma again, then ``POST /v1/models/load`` for SmolLM2 (restored while loading), and
   the prefix request once it is ready: **restored** (goal: ≤ 1.5 times warm).

The same three steps with ``SLM_SLOT_CACHE=false`` give the swap back and the first
request **without** the slot cache, side by side (a full prefill each time).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from benchmarks.report import DASH, Check, event_time, kind_spread, show, spread, table
from benchmarks.servers import Launched, free_port, launcher, router_for
from tests import one_shot
from tests.integration.real_stack import example_registry, llama_server_bin
from tests.processes import poll

ADDED_GOAL_MS = 300.0
RESTORED_GOAL = 1.5  # restored time to first token over warm
# SmolLM2 at 8192 cells (~320 MiB) or Gemma at 32k (~490 MiB), each with a prompt cache
# of an eighth of the budget (100 MiB), never both.
ONE_MODEL_BUDGET_MB = 800
WORDS = ["river", "stone", "lantern", "copper", "meadow", "signal", "harbor", "velvet"]


@dataclass(frozen=True)
class Plan:
    trials: int = 3
    prefix_words: int = 5700  # about 6,000 tokens with SmolLM2's tokenizer


def _prefix(words: int) -> str:
    rng = random.Random(6000)
    return "Reference notes: " + " ".join(rng.choice(WORDS) for _ in range(words))


def _ttft(url: str, model: str, system: str | None) -> float:
    """Seconds from sending a streamed chat request to its first content chunk."""
    messages = [{"role": "user", "content": "Name one word."}]
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})
    body = {"model": model, "messages": messages, "max_tokens": 4, "stream": True}
    body["temperature"] = 0
    started = time.perf_counter()
    with (
        httpx.Client(trust_env=False) as client,
        client.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=300) as reply,
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


def _events(launched: Launched, name: str, count: int, **match: Any) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []

    def seen() -> bool:
        found[:] = [
            e for e in launched.events(name) if all(e.get(k) == v for k, v in match.items())
        ]
        return len(found) >= count

    poll(seen, 120, f"{count} watchdog events {name} {match}", interval=0.02)
    return found


def _models() -> dict[str, dict[str, Any]]:
    ports = {"standard": free_port(), "gemma": free_port(), "embeddings": 0}
    models: dict[str, dict[str, Any]] = example_registry(ports, ("standard", "gemma"))["models"]
    for entry in models.values():
        entry["load"] = "on_demand"
    models["standard"].update(context_length=8192, max_concurrency=1)
    return models


def trial(workdir: Path, index: int, kept: bool, plan: Plan) -> dict[str, Any]:
    models = _models()
    small, other = models["standard"]["id"], models["gemma"]["id"]
    prefix = _prefix(plan.prefix_words)
    env = {
        "SLM_LLAMA_SERVER_BIN": llama_server_bin(),
        "SLM_SWAP_HOLD_SECONDS": "0",
        "SLM_MEMORY_BUDGET_MB": str(ONE_MODEL_BUDGET_MB),
        "SLM_SLOT_CACHE": "true" if kept else "false",
        "SLM_SLOT_CACHE_DIR": str(workdir / "slots"),
    }
    with launcher(workdir, models, env) as launched, router_for(workdir, launched.env) as router:
        load = one_shot.post(f"{router.url}/v1/models/load", json={"model": small}, timeout=120)
        load.raise_for_status()
        cold = _ttft(router.url, small, prefix)
        warm = _ttft(router.url, small, prefix)
        _ttft(router.url, other, None)  # evicts SmolLM2 (saved when kept)
        back = _ttft(router.url, small, prefix)
        unloaded = _events(launched, "backend_unloaded", 1, role="gemma")[-1]
        loading = _events(launched, "backend_loading", 2, role="standard")[-1]
        loaded = _events(launched, "backend_loaded", 2, role="standard")[-1]
        _ttft(router.url, other, None)
        loaded_again = one_shot.post(
            f"{router.url}/v1/models/load", json={"model": small}, timeout=120
        )
        loaded_again.raise_for_status()
        restored = _ttft(router.url, small, prefix)
        saves = launched.events("cache_saved")
        restores = launched.events("cache_restored")
    load_s = event_time(loaded["ts"]) - event_time(loading["ts"])
    unload_s = float(unloaded["seconds"])
    result: dict[str, Any] = {
        "kind": "kept" if kept else "not_kept",
        "trial": index,
        "cold_ttft_s": cold,
        "warm_ttft_s": warm,
        "back_ttft_s": back,
        "unload_s": unload_s,
        "load_s": load_s,
        "restored_ttft_s": restored,
        "added_ms": (back - unload_s - load_s - (warm if kept else cold)) * 1000,
        "restored_over_warm": restored / warm,
    }
    if kept:
        if not saves or not restores:
            raise AssertionError(f"no save or restore: {saves} {restores}")
        result |= {
            "saved_tokens": saves[-1]["tokens"],
            "saved_mb": saves[-1]["bytes"] / 2**20,
            "save_ms": saves[-1]["ms"],
            "restore_ms": restores[-1]["ms"],
        }
    return result


def run_trials(plan: Plan, workdir: Path, say: Callable[[str], None]) -> list[dict[str, Any]]:
    trials = []
    for index in range(1, plan.trials + 1):
        for kept in (True, False):
            result = trial(workdir / f"{kept}-{index}", index, kept, plan)
            say(
                f"  {result['kind']} #{index}: cold {result['cold_ttft_s']:.2f} s, warm "
                f"{result['warm_ttft_s']:.2f} s, swap back {result['back_ttft_s']:.2f} s, "
                f"restored {result['restored_ttft_s']:.2f} s"
            )
            trials.append(result)
    return trials


def checks(trials: list[dict[str, Any]]) -> list[Check]:
    return [
        Check(
            "restored: time to first token on the prefix over warm (same process)",
            RESTORED_GOAL,
            "x",
            kind_spread(trials, "kept", "restored_over_warm"),
        ),
        Check(
            "swap back: time to first token minus unload, load (with the restore) and warm",
            ADDED_GOAL_MS,
            "ms",
            kind_spread(trials, "kept", "added_ms"),
        ),
    ]


def tables(trials: list[dict[str, Any]]) -> str:
    def row(what: str, key: str, scale: float = 1.0, digits: int = 2) -> list[str]:
        cells = [what]
        for kind in ("kept", "not_kept"):
            values = [t[key] * scale for t in trials if t["kind"] == kind and key in t]
            cells.append(show(spread(values), digits) if values else DASH)
        return cells

    rows = [
        row("cold: time to first token (s)", "cold_ttft_s"),
        row("warm: time to first token (s)", "warm_ttft_s"),
        row("swap back: time to first token (s)", "back_ttft_s"),
        row("  unload of the other model (s)", "unload_s"),
        row("  load, restore included (s)", "load_s"),
        row("  added by the gateway (ms)", "added_ms", digits=0),
        row("after a load: time to first token (s)", "restored_ttft_s"),
        row("  over warm (x)", "restored_over_warm"),
        row("saved tokens", "saved_tokens", digits=0),
        row("saved (MiB)", "saved_mb", digits=1),
        row("save (ms)", "save_ms", digits=1),
        row("restore (ms)", "restore_ms", digits=1),
    ]
    head = ["measure", f"slot cache kept: median [min{DASH}max]", "not kept"]
    return table(head, rows)
