"""Scenario ``api_shapes``: what each API shape the router translates costs beside chat
completions, which it relays as they are — Ollama's ``/api/chat`` (issue 43: at most
1.5 times chat completions' added time and router CPU per request), and the Messages
API's beside them for reference.

Each trial starts the launcher and the router afresh, the launcher running the
scriptable fake llama-server (``tests/fakes/fake-llama-server``: an engine that costs
next to nothing, answering ``CHUNKS`` chunks). One client sends, in blocks of
``BLOCK`` requests one after another and the kinds interleaved block by block (so
that a machine slowing down slows each kind alike): each shape whole and streamed,
and the same chat completions request straight to the fake (``direct``), the
reference the router's added time is counted from. Measured per kind: the median
wall time per request, the added time (the median less direct's) and the router
process's CPU time (user + system) per request.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil

from benchmarks.machine import ROOT
from benchmarks.report import Check, show, spread, table
from benchmarks.servers import launcher, router_for, scripted_fake_entry

ROLE = "standard"
MODEL = "fake-shapes"
CHUNKS = 32
BLOCK = 20
FAKE = ROOT / "tests" / "fakes" / "fake-llama-server"
HELLO = [{"role": "user", "content": "Say hello."}]
# (kind, path, body, streamed, through the router)
KINDS: tuple[tuple[str, str, dict[str, Any], bool, bool], ...] = (
    ("direct_whole", "/v1/chat/completions", {"messages": HELLO}, False, False),
    ("direct_stream", "/v1/chat/completions", {"messages": HELLO, "stream": True}, True, False),
    ("chat_whole", "/v1/chat/completions", {"messages": HELLO}, False, True),
    ("chat_stream", "/v1/chat/completions", {"messages": HELLO, "stream": True}, True, True),
    ("ollama_whole", "/api/chat", {"messages": HELLO, "stream": False}, False, True),
    ("ollama_stream", "/api/chat", {"messages": HELLO, "stream": True}, True, True),
    ("messages_whole", "/v1/messages", {"messages": HELLO, "max_tokens": 64}, False, True),
    (
        "messages_stream",
        "/v1/messages",
        {"messages": HELLO, "max_tokens": 64, "stream": True},
        True,
        True,
    ),
)
ROUTED = tuple(kind for kind, *_rest, routed in KINDS if routed)
LIMIT_RATIO = 1.5


@dataclass(frozen=True)
class Plan:
    rounds: int = 3
    blocks: int = 10  # per kind and trial


def _models(workdir: Path) -> dict[str, dict[str, Any]]:
    script = {"chunks": CHUNKS, "chunk_text": "tok "}
    return {ROLE: scripted_fake_entry(workdir, MODEL, script)}


def _cpu(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


def _ask(http: httpx.Client, url: str, body: dict[str, Any], stream: bool) -> float:
    """One request, read to its end: its wall time in seconds."""
    started = time.perf_counter()
    if stream:
        with http.stream("POST", url, json=body) as reply:
            text = reply.read()
        assert reply.status_code == 200, text[-200:]
        last = text.rstrip().rsplit(b"\n", 1)[-1]
        ended = (b"[DONE]", b'{"type":"message_stop"}')
        assert last.endswith(ended) or b'"done":true' in last, text[-200:]
    else:
        reply = http.post(url, json=body)
        assert reply.status_code == 200, reply.text[:200]
    return time.perf_counter() - started


def trial(index: int, workdir: Path, plan: Plan) -> dict[str, Any]:
    workdir.mkdir(parents=True, exist_ok=True)
    models = _models(workdir)
    env = {"SLM_LLAMA_SERVER_BIN": str(FAKE), "FAKE_BACKEND_PYTHON": str(ROOT / ".venv/bin/python")}
    walls: dict[str, list[float]] = {kind: [] for kind, *_ in KINDS}
    cpu: dict[str, float] = dict.fromkeys(walls, 0.0)
    with (
        launcher(workdir, models, env) as launched,
        router_for(workdir, launched.env) as router,
        httpx.Client(trust_env=False, timeout=60) as http,
    ):
        direct = f"http://127.0.0.1:{models[ROLE]['port']}"
        for _kind, path, body, stream, routed in KINDS:  # warm every path once
            _ask(http, (router.url if routed else direct) + path, {**body, "model": MODEL}, stream)
        for _ in range(plan.blocks):
            for kind, path, body, stream, routed in KINDS:
                url = (router.url if routed else direct) + path
                sent = {**body, "model": MODEL}
                before = _cpu(router.pid)
                walls[kind] += [_ask(http, url, sent, stream) for _ in range(BLOCK)]
                cpu[kind] += _cpu(router.pid) - before
    found: dict[str, Any] = {"trial": index}
    count = plan.blocks * BLOCK
    for kind in walls:
        found[f"{kind}_ms"] = statistics.median(walls[kind]) * 1000
        found[f"{kind}_cpu_ms"] = cpu[kind] / count * 1000
    for kind in ROUTED:
        reference = "direct_stream" if kind.endswith("stream") else "direct_whole"
        found[f"{kind}_added_ms"] = found[f"{kind}_ms"] - found[f"{reference}_ms"]
    for mode in ("whole", "stream"):
        chat, ollama = f"chat_{mode}", f"ollama_{mode}"
        found[f"{mode}_added_ratio"] = found[f"{ollama}_added_ms"] / found[f"{chat}_added_ms"]
        found[f"{mode}_cpu_ratio"] = found[f"{ollama}_cpu_ms"] / found[f"{chat}_cpu_ms"]
    return found


def run_trials(plan: Plan, workdir: Path, say: Callable[[str], None]) -> list[dict[str, Any]]:
    found = []
    for index in range(1, plan.rounds + 1):
        result = trial(index, workdir / f"trial-{index}", plan)
        say(
            f"  #{index}: /api/chat ÷ chat completions, added time whole "
            f"{result['whole_added_ratio']:.2f} stream {result['stream_added_ratio']:.2f}; "
            f"router CPU whole {result['whole_cpu_ratio']:.2f} "
            f"stream {result['stream_cpu_ratio']:.2f}"
        )
        found.append(result)
    return found


def checks(trials: list[dict[str, Any]]) -> list[Check]:
    found = []
    for mode in ("whole", "stream"):
        for what, name in (("added", "added time"), ("cpu", "router CPU")):
            stat = spread(t[f"{mode}_{what}_ratio"] for t in trials)
            found.append(
                Check(f"/api/chat ÷ chat completions, {name}, {mode}", LIMIT_RATIO, "times", stat)
            )
    return found


def tables(trials: list[dict[str, Any]]) -> str:
    rows = []
    for kind, path, _body, stream, routed in KINDS:
        label = f"{'router' if routed else 'direct'} `{path}` {'streamed' if stream else 'whole'}"
        added = show(spread(t[f"{kind}_added_ms"] for t in trials), 3) if routed else "—"
        cpu = show(spread(t[f"{kind}_cpu_ms"] for t in trials), 3) if routed else "—"
        rows.append([label, show(spread(t[f"{kind}_ms"] for t in trials), 3), added, cpu])
    header = ["request", "wall ms (median)", "added ms", "router CPU ms / request"]
    return table(header, rows)


__all__ = ["CHUNKS", "Plan", "checks", "run_trials", "tables"]
