"""Scenario ``frozen``: a llama-server frozen (``SIGSTOP``) under the gateway's shipped
watchdog settings, with clients that keep asking as agents do; side by side with
another commit's gateway (``--against REV``).

Each trial starts the launcher and the router afresh from the tree under test, serving
SmolLM2 135M (the ``standard`` entry of ``config/models.yaml.example``, its
``default_timeout`` of 120 s), with every watchdog setting at its default but the
startup grace, shortened to ``GRACE_SECONDS`` so a trial need not wait three minutes
before a trip may act (the grace only says when, after a start, a trip may restart;
nothing in the recovery path depends on it). Once past it, the backend is stopped and
``CLIENTS`` clients each send a chat completion — the first streamed, the second whole
(not streamed), and so on — wait for its end (the gateway's deadline, no timeout of
their own), and send the next at once, as an agent retries: measured are the seconds
from the stop to the first successful answer, the requests that failed on the way (and
how), the requests that were answered, and the watchdog's events. A trial gives up
after ``GIVE_UP_SECONDS``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from benchmarks.machine import ROOT
from benchmarks.overhead import AGAINST
from benchmarks.report import DASH, TIMES, show, spread, table
from benchmarks.servers import Launched, Server, free_port, launcher, router_for
from tests.integration.real_stack import example_registry, llama_server_bin
from tests.processes import pid_alive, poll

ROLE = "standard"
GRACE_SECONDS = 5.0
CLIENTS = 2
GIVE_UP_SECONDS = 420.0
HELLO = [{"role": "user", "content": "Say hello."}]


@dataclass(frozen=True)
class Plan:
    rounds: int = 2


def targets() -> tuple[str, ...]:
    return ("this", *(f"@{revision}" for revision in AGAINST))


def _models() -> dict[str, dict[str, Any]]:
    ports = {"standard": free_port(), "gemma": 0, "embeddings": 0}
    models: dict[str, dict[str, Any]] = example_registry(ports, roles=(ROLE,))["models"]
    # Absolute: another commit's gateway runs from its own checkout, without models/.
    models[ROLE]["model_path"] = str(ROOT / models[ROLE]["model_path"])
    return models


def _ask(http: httpx.Client, url: str, model: str, stream: bool = True) -> str:
    """One chat completion to its end: ``ok``, the error code in band or the status
    (``whole`` before it, for one not streamed), or ``no answer``."""
    if not stream:
        return _ask_whole(http, url, model)
    body = {"model": model, "messages": HELLO, "max_tokens": 8, "stream": True}
    try:
        with http.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=None) as reply:
            text = reply.read()
    except httpx.HTTPError:
        return "no answer"
    if reply.status_code != 200:
        return f"{reply.status_code}"
    if b'"error"' in text:
        return "200, error in band"
    return "ok" if b"[DONE]" in text else "200, cut"


def _ask_whole(http: httpx.Client, url: str, model: str) -> str:
    body = {"model": model, "messages": HELLO, "max_tokens": 8}
    try:
        reply = http.post(f"{url}/v1/chat/completions", json=body, timeout=None)
    except httpx.HTTPError:
        return "whole, no answer"
    if reply.status_code != 200:
        return f"whole {reply.status_code}"
    return "ok" if reply.json().get("choices") else "whole, no choices"


def trial(target: str, index: int, workdir: Path) -> dict[str, Any]:
    tree = AGAINST[target[1:]] if target.startswith("@") else ROOT
    models = _models()
    model = str(models[ROLE]["id"])
    env = {
        "SLM_LLAMA_SERVER_BIN": llama_server_bin(),
        "SLM_WATCHDOG_STARTUP_GRACE_SECONDS": str(GRACE_SECONDS),
    }
    with (
        launcher(workdir, models, env, tree=tree) as launched,
        router_for(workdir, launched.env, tree=tree) as router,
    ):
        return _frozen(target, index, launched, router, model)


def _frozen(
    target: str, index: int, launched: Launched, router: Server, model: str
) -> dict[str, Any]:
    with httpx.Client(trust_env=False) as http:
        assert _ask(http, router.url, model) == "ok", "the backend answers before the stop"
    started_at = float(launched.states()[ROLE]["started_at"])
    poll(lambda: time.time() > started_at + GRACE_SECONDS + 0.5, 30, "the startup grace")
    pid = int(launched.states()[ROLE]["pid"])
    outcomes: list[tuple[float, float, str]] = []  # sent, ended (s after the stop), outcome
    answered = threading.Event()
    lock = threading.Lock()
    stopped = time.perf_counter()
    os.kill(pid, signal.SIGSTOP)

    def client(stream: bool) -> None:
        with httpx.Client(trust_env=False) as http:
            while not answered.is_set() and time.perf_counter() - stopped < GIVE_UP_SECONDS:
                sent = time.perf_counter() - stopped
                outcome = _ask(http, router.url, model, stream)
                with lock:
                    outcomes.append((sent, time.perf_counter() - stopped, outcome))
                if outcome == "ok":
                    answered.set()

    threads = [
        threading.Thread(target=client, args=(n % 2 == 0,), daemon=True) for n in range(CLIENTS)
    ]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(GIVE_UP_SECONDS + 30)
    finally:
        if pid_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    first_ok = min((ended for _, ended, outcome in outcomes if outcome == "ok"), default=None)
    failed = Counter(outcome for _, _, outcome in outcomes if outcome != "ok")
    succeeded = launched.events("restart_succeeded")
    return {
        "target": target,
        "trial": index,
        "first_success_s": first_ok,
        "requests": len(outcomes),
        "failed": sum(failed.values()),
        "failures": dict(failed),
        "ok": sum(1 for *_, outcome in outcomes if outcome == "ok"),
        "retried": len(launched.events("request_retried")),
        "restart_reason": succeeded[0].get("reason") if succeeded else None,
        "outcomes": outcomes,
    }


def run_trials(plan: Plan, workdir: Path, say: Any) -> list[dict[str, Any]]:
    found = []
    for index in range(1, plan.rounds + 1):
        for target in targets():
            result = trial(target, index, workdir / f"{target.strip('@')}-{index}")
            first = result["first_success_s"]
            say(
                f"  {target} #{index}: first success "
                f"{'never' if first is None else f'after {first:.1f} s'}, "
                f"{result['failed']} of {result['requests']} requests failed "
                f"{result['failures']}, restart reason {result['restart_reason']}"
            )
            found.append(result)
    return found


def tables(trials: list[dict[str, Any]]) -> str:
    rows = []
    for target in dict.fromkeys(t["target"] for t in trials):
        mine = [t for t in trials if t["target"] == target]
        failures: Counter[str] = Counter()
        for t in mine:
            failures.update(t["failures"])
        rows.append(
            [
                "this tree" if target == "this" else f"`{target[1:]}`",
                show(spread(t["first_success_s"] for t in mine), 1),
                show(spread(t["failed"] for t in mine), 0),
                ", ".join(f"{k} {TIMES}{v}" for k, v in sorted(failures.items())) or DASH,
                show(spread(t["retried"] for t in mine), 0),
                ", ".join(sorted({str(t["restart_reason"]) for t in mine})),
            ]
        )
    header = ["gateway", "stop → first answer (s)", "failed requests", "how they failed"]
    header += ["requests retried", "restart reason"]
    return table(header, rows)


__all__ = ["Plan", "run_trials", "tables", "targets"]
