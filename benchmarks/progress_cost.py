"""Scenario ``progress_cost``: what reading the engine's progress costs the router, side
by side with another commit's gateway (``--against REV``, one from before the router
asked for progress shows the cost whole).

Each trial starts the launcher and the router afresh from the tree under test, the
launcher running the scriptable fake llama-server (``tests/fakes/fake-llama-server``,
published as a native llama-server, so the router asks it for its prompt progress), and
one client sends ``REQUESTS`` chat completions one after another for each of
:data:`KINDS`: a short prompt (read in ``SHORT_READ_SECONDS``: llama-server's first
report and its last, as for any prompt of one batch), streamed and whole (this tree
streams a whole request from llama-server and gathers the answer), and a long prompt
streamed (read in ``LONG_READ_SECONDS`` with a report every ``LONG_REPORT_SECONDS``:
about twenty). Each answer is ``CHUNKS`` chunks. Measured is the router process's CPU
time (user + system) per request and per chunk of the answer.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil

from benchmarks.machine import ROOT
from benchmarks.overhead import AGAINST
from benchmarks.report import show, spread, table
from benchmarks.servers import launcher, router_for, scripted_fake_entry

ROLE = "standard"
MODEL = "fake-progress"
CHUNKS = 64
SHORT_READ_SECONDS = 0.01
LONG_READ_SECONDS = 0.2
LONG_REPORT_SECONDS = 0.01
# (name, read seconds, report interval, streamed)
KINDS = (
    ("short_stream", SHORT_READ_SECONDS, 1.0, True),
    ("short_whole", SHORT_READ_SECONDS, 1.0, False),
    ("long_stream", LONG_READ_SECONDS, LONG_REPORT_SECONDS, True),
)
FAKE = ROOT / "tests" / "fakes" / "fake-llama-server"
HELLO = [{"role": "user", "content": "Say hello."}]


@dataclass(frozen=True)
class Plan:
    rounds: int = 3
    requests: int = 100


def targets() -> tuple[str, ...]:
    return ("this", *(f"@{revision}" for revision in AGAINST))


def _models(workdir: Path) -> dict[str, dict[str, Any]]:
    return {ROLE: scripted_fake_entry(workdir, MODEL, _script(SHORT_READ_SECONDS, 1.0))}


def _script(read: float, every: float) -> dict[str, Any]:
    return {
        "chunks": CHUNKS,
        "chunk_text": "tok ",
        "delay_seconds": read,
        "progress_interval_seconds": every,
    }


def _cpu(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


def trial(target: str, index: int, workdir: Path, plan: Plan) -> dict[str, Any]:
    tree = AGAINST[target[1:]] if target.startswith("@") else ROOT
    workdir.mkdir(parents=True, exist_ok=True)
    models = _models(workdir)
    env = {"SLM_LLAMA_SERVER_BIN": str(FAKE), "FAKE_BACKEND_PYTHON": str(ROOT / ".venv/bin/python")}
    found: dict[str, Any] = {"target": target, "trial": index}
    with (
        launcher(workdir, models, env, tree=tree) as launched,
        router_for(workdir, launched.env, tree=tree) as router,
        httpx.Client(trust_env=False, timeout=60) as http,
    ):
        url = f"{router.url}/v1/chat/completions"
        control = f"http://127.0.0.1:{models[ROLE]['port']}/_control"
        body = {"model": MODEL, "messages": HELLO}
        http.post(url, json=body).raise_for_status()  # warm
        for kind, read, every, stream in KINDS:
            http.post(control, json=_script(read, every)).raise_for_status()
            before, started = _cpu(router.pid), time.perf_counter()
            chunks = 0
            for _ in range(plan.requests):
                if stream:
                    with http.stream("POST", url, json={**body, "stream": True}) as reply:
                        text = reply.read()
                    assert reply.status_code == 200, text[-200:]
                    assert text.endswith(b"[DONE]\n\n"), text[-200:]
                    chunks += text.count(b'"delta"')
                else:
                    reply = http.post(url, json=body)
                    assert reply.status_code == 200, reply.text[:200]
                    chunks += CHUNKS
            spent = _cpu(router.pid) - before
            found[f"{kind}_cpu_ms_per_request"] = spent / plan.requests * 1000
            found[f"{kind}_cpu_us_per_chunk"] = spent / chunks * 1e6
            found[f"{kind}_seconds"] = time.perf_counter() - started
    return found


def run_trials(plan: Plan, workdir: Path, say: Any) -> list[dict[str, Any]]:
    found = []
    for index in range(1, plan.rounds + 1):
        for target in targets():
            result = trial(target, index, workdir / f"{target.strip('@')}-{index}", plan)
            per_chunk = ", ".join(
                f"{kind} {result[f'{kind}_cpu_us_per_chunk']:.1f}" for kind, *_ in KINDS
            )
            say(f"  {target} #{index}: router CPU µs per chunk: {per_chunk}")
            found.append(result)
    return found


def tables(trials: list[dict[str, Any]]) -> str:
    rows = []
    for target in dict.fromkeys(t["target"] for t in trials):
        mine = [t for t in trials if t["target"] == target]
        row = ["this tree" if target == "this" else f"`{target[1:]}`"]
        for kind, *_ in KINDS:
            row.append(show(spread(t[f"{kind}_cpu_us_per_chunk"] for t in mine), 1))
            row.append(show(spread(t[f"{kind}_cpu_ms_per_request"] for t in mine), 2))
        rows.append(row)
    header = ["gateway"]
    for name in ("short prompt, streamed", "short prompt, whole", "long prompt, streamed"):
        header += [f"{name}: CPU µs / chunk", "CPU ms / request"]
    return table(header, rows)


__all__ = ["Plan", "run_trials", "tables", "targets"]
