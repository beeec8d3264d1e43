"""Scenario ``progress_cost``: what reading the engine's progress costs the router, side
by side with another commit's gateway (``--against REV``, one from before the router
asked for progress shows the cost whole).

Each trial starts the launcher and the router afresh from the tree under test, the
launcher running the scriptable fake llama-server (``tests/fakes/fake-llama-server``,
published as a native llama-server, so the router asks it for its prompt progress)
with a script that reads each prompt for ``READ_SECONDS`` reporting every
``REPORT_SECONDS`` when asked, then streams ``CHUNKS`` chunks. One client sends
``REQUESTS`` chat completions one after another, streamed, then as many not streamed
(which this tree streams from llama-server and gathers whole). Measured is the router
process's CPU time (user + system) per request and per chunk of the answer, for each
kind; the reports are the router's extra work (this tree drops them, or gathers a whole
answer from the stream, where a commit before read the answer as it came).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil

from benchmarks.machine import ROOT
from benchmarks.overhead import AGAINST
from benchmarks.report import show, spread, table
from benchmarks.servers import free_port, launcher, router_for

ROLE = "standard"
MODEL = "fake-progress"
CHUNKS = 64
READ_SECONDS = 0.1
REPORT_SECONDS = 0.01  # about ten reports per request, when asked
FAKE = ROOT / "tests" / "fakes" / "fake-llama-server"
HELLO = [{"role": "user", "content": "Say hello."}]


@dataclass(frozen=True)
class Plan:
    rounds: int = 3
    requests: int = 100


def targets() -> tuple[str, ...]:
    return ("this", *(f"@{revision}" for revision in AGAINST))


def _models(workdir: Path) -> dict[str, dict[str, Any]]:
    behaviour = workdir / "fake-progress.gguf"  # its content scripts the fake
    script = {
        "chunks": CHUNKS,
        "chunk_text": "tok ",
        "delay_seconds": READ_SECONDS,
        "progress_interval_seconds": REPORT_SECONDS,
    }
    behaviour.write_text(json.dumps({"script": script}))
    entry = {
        "id": MODEL,
        "backend": "llamacpp",
        "port": free_port(),
        "model_path": str(behaviour),
        "default_timeout": 60,
        "quantization": "Q4_0",
    }
    return {ROLE: entry}


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
        body = {"model": MODEL, "messages": HELLO}
        http.post(url, json=body).raise_for_status()  # warm
        for kind, stream in (("stream", True), ("whole", False)):
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
            say(
                f"  {target} #{index}: streamed {result['stream_cpu_us_per_chunk']:.1f} µs/chunk, "
                f"whole {result['whole_cpu_us_per_chunk']:.1f} µs/chunk of router CPU"
            )
            found.append(result)
    return found


def tables(trials: list[dict[str, Any]]) -> str:
    rows = []
    for target in dict.fromkeys(t["target"] for t in trials):
        mine = [t for t in trials if t["target"] == target]
        rows.append(
            [
                "this tree" if target == "this" else f"`{target[1:]}`",
                show(spread(t["stream_cpu_us_per_chunk"] for t in mine), 1),
                show(spread(t["stream_cpu_ms_per_request"] for t in mine), 2),
                show(spread(t["whole_cpu_us_per_chunk"] for t in mine), 1),
                show(spread(t["whole_cpu_ms_per_request"] for t in mine), 2),
            ]
        )
    header = ["gateway", "streamed: CPU µs / chunk", "CPU ms / request"]
    header += ["whole: CPU µs / chunk", "CPU ms / request"]
    return table(header, rows)


__all__ = ["Plan", "run_trials", "tables", "targets"]
