"""Scenario ``reload``: what reloading the registry costs, on the real llama-server.

* ``add``: SmolLM2 135M runs, under load (two clients sending short requests back to
  back); Gemma 3 270M is added to the file and ``POST /v1/config/reload`` sent, then at
  once one streamed request for Gemma. Measured: the reload's answer, and the time from
  the reload request to Gemma's first token, against Gemma's own start (the reload
  applied to ready, from the state file) plus its warm time to first token. The rest is
  what the gateway adds (goal: ≤ 300 ms).
* ``replace``: both run, under load on both (a client asking SmolLM2 for whole answers
  and one streaming 16 tokens from Gemma, each pausing ``PAUSE_SECONDS`` between
  requests: on two cores, clients that never pause starve both servers, a 32-token
  stream then outlasts the drain timeout and is cut, as designed, which measures the
  machine rather than the reload); Gemma's ``context_length`` is changed and the
  registry reloaded. Measured:
  the time from the reload request to Gemma's first token on the new process (the old
  one's drain, stop and the new start included), and every request of the load that
  did not end with a whole answer (goal: none lost), with SmolLM2 kept on its pid.

Every trial runs on a fresh launcher and router.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from benchmarks.report import DASH, Check, kind_spread, show, spread, table
from benchmarks.servers import Launched, free_port, launcher, router_for
from tests.integration.real_stack import example_registry, llama_server_bin
from tests.processes import poll

HELLO = [{"role": "user", "content": "Say hello."}]
ADDED_GOAL_MS = 300.0
PAUSE_SECONDS = 0.2


@dataclass(frozen=True)
class Plan:
    trials: int = 3  # of each kind


def _ttft(client: httpx.Client, url: str, model: str, max_tokens: int = 8) -> float:
    """Seconds from sending a streamed chat request to its first content chunk (the
    stream read to its end)."""
    body = {"model": model, "messages": HELLO, "max_tokens": max_tokens, "stream": True}
    started = time.perf_counter()
    with client.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=120) as reply:
        if reply.status_code != 200:
            raise AssertionError(f"{model}: {reply.status_code} {reply.read()[:300]!r}")
        first = None
        done = False
        for line in reply.iter_lines():
            if first is None and line.startswith("data: ") and '"content"' in line:
                first = time.perf_counter() - started
            done = done or line == "data: [DONE]"
        if first is None or not done:
            raise AssertionError(f"{model}: the stream ended without content or [DONE]")
        return first


@dataclass
class Load:
    """Clients sending requests back to back until stopped; every outcome counted."""

    url: str
    sent: int = 0
    ok: int = 0
    failures: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def client(self, model: str, stream: bool) -> None:
        body = {"model": model, "messages": HELLO, "max_tokens": 16 if stream else 8}
        if stream:
            body["stream"] = True
        with httpx.Client(trust_env=False, timeout=120) as client:
            while not self.stop.is_set():
                outcome = self.one(client, body, stream)
                with self.lock:
                    self.sent += 1
                    if outcome is None:
                        self.ok += 1
                    else:
                        self.failures.append(f"{model}: {outcome}")
                self.stop.wait(PAUSE_SECONDS)

    def one(self, client: httpx.Client, body: dict[str, Any], stream: bool) -> str | None:
        """None for a whole answer, else what went wrong."""
        try:
            if not stream:
                reply = client.post(f"{self.url}/v1/chat/completions", json=body)
                if reply.status_code != 200:
                    return f"{reply.status_code} {reply.text[:200]}"
                return None if reply.json().get("choices") else "no choices"
            with client.stream("POST", f"{self.url}/v1/chat/completions", json=body) as reply:
                if reply.status_code != 200:
                    return f"{reply.status_code} {reply.read()[:200]!r}"
                lines = list(reply.iter_lines())
            return None if "data: [DONE]" in lines else "a stream ended without [DONE]"
        except httpx.HTTPError as exc:
            return f"{type(exc).__name__}: {exc}"

    def start(self, model: str, clients: int, stream: bool = False) -> None:
        for _ in range(clients):
            thread = threading.Thread(target=self.client, args=(model, stream), daemon=True)
            thread.start()
            self.threads.append(thread)

    def finish(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(180)


def _write(launched: Launched, models: dict[str, Any]) -> None:
    path = Path(launched.env["SLM_CONFIG"])
    path.write_text(yaml.safe_dump({"models": models}, sort_keys=False))


def _reload(client: httpx.Client, url: str) -> dict[str, Any]:
    reply = client.post(f"{url}/v1/config/reload", timeout=60)
    if reply.status_code != 200:
        raise AssertionError(f"reload: {reply.status_code} {reply.text[:500]}")
    answer: dict[str, Any] = reply.json()
    return answer


def _ready_since(launched: Launched, role: str) -> float:
    """When (wall clock) ``role`` became ready, from the state file."""
    found: list[float] = []

    def ready() -> bool:
        state = launched.states().get(role, {})
        if state.get("state") == "ready" and not state.get("reloaded"):
            found[:] = [float(state["since"])]
        return bool(found)

    poll(ready, 120, f"{role} ready", interval=0.02)
    return found[0]


def _env() -> dict[str, str]:
    return {"SLM_LLAMA_SERVER_BIN": llama_server_bin()}


def add_trial(workdir: Path, index: int) -> dict[str, Any]:
    ports = {"standard": free_port(), "gemma": free_port(), "embeddings": 0}
    full = example_registry(ports, roles=("standard", "gemma"))["models"]
    first = {"standard": full["standard"]}
    small, gemma = full["standard"]["id"], full["gemma"]["id"]
    with (
        launcher(workdir, first, _env()) as launched,
        router_for(workdir, launched.env) as router,
        httpx.Client(trust_env=False) as client,
    ):
        load = Load(router.url)
        load.start(small, 1)
        _write(launched, full)
        asked = time.time()
        started = time.perf_counter()
        answer = _reload(client, router.url)
        answered = time.perf_counter() - started
        first_token = _ttft(client, router.url, gemma) + answered
        ready = _ready_since(launched, "gemma")
        warm = _ttft(client, router.url, gemma)
        load.finish()
    assert answer["added"] == ["gemma"], answer
    start_s = ready - asked
    return {
        "kind": "add",
        "trial": index,
        "reload_answer_ms": answered * 1000,
        "first_token_s": first_token,
        "start_s": start_s,
        "warm_ttft_s": warm,
        "added_ms": (first_token - start_s - warm) * 1000,
        "sent": load.sent,
        "lost": len(load.failures),
        "failures": load.failures[:5],
    }


def replace_trial(workdir: Path, index: int) -> dict[str, Any]:
    ports = {"standard": free_port(), "gemma": free_port(), "embeddings": 0}
    models = example_registry(ports, roles=("standard", "gemma"))["models"]
    small, gemma = models["standard"]["id"], models["gemma"]["id"]
    with (
        launcher(workdir, models, _env()) as launched,
        router_for(workdir, launched.env) as router,
        httpx.Client(trust_env=False) as client,
    ):
        kept = launched.states()["standard"]["pid"]
        old = launched.states()["gemma"]["pid"]
        load = Load(router.url)
        load.start(small, 1)
        load.start(gemma, 1, stream=True)
        poll(lambda: load.ok >= 6, 60, "the load to run", interval=0.05)
        changed = {**models, "gemma": {**models["gemma"], "context_length": 4096}}
        _write(launched, changed)
        started = time.perf_counter()
        answer = _reload(client, router.url)
        answered = time.perf_counter() - started
        first_token = _ttft(client, router.url, gemma) + answered
        new = launched.states()["gemma"]["pid"]
        poll(lambda: load.ok >= 12, 60, "the load to go on", interval=0.05)
        load.finish()
        retired = [e for e in launched.events("backend_retired") if e.get("role") == "gemma"]
        assert launched.states()["standard"]["pid"] == kept
    assert answer["replaced"] == ["gemma"], answer
    assert answer["unchanged"] == ["standard"], answer
    assert new != old
    return {
        "kind": "replace",
        "trial": index,
        "reload_answer_ms": answered * 1000,
        "first_token_s": first_token,
        "drain_s": float(retired[0]["seconds"]) if retired else None,
        "ended": retired[0]["ended"] if retired else None,
        "sent": load.sent,
        "lost": len(load.failures),
        "failures": load.failures[:5],
    }


def run_trials(plan: Plan, workdir: Path, say: Callable[[str], None]) -> list[dict[str, Any]]:
    trials = []
    for index in range(1, plan.trials + 1):
        for kind, trial in (("add", add_trial), ("replace", replace_trial)):
            result = trial(workdir / f"{kind}-{index}", index)
            say(
                f"  {kind} #{index}: first token {result['first_token_s']:.2f} s after the "
                f"reload request; {result['lost']} of {result['sent']} requests lost"
            )
            trials.append(result)
    return trials


def checks(trials: list[dict[str, Any]]) -> list[Check]:
    lost = spread([float(sum(t["lost"] for t in trials))])
    return [
        Check(
            "add: reload request to first token, minus the new backend's start and warm TTFT",
            ADDED_GOAL_MS,
            "ms",
            kind_spread(trials, "add", "added_ms"),
        ),
        Check("requests lost across every reload under load", 0.0, "requests", lost),
    ]


def tables(trials: list[dict[str, Any]]) -> str:
    def row(kind: str, what: str, key: str, scale: float = 1.0, digits: int = 2) -> list[str]:
        values = [t[key] * scale for t in trials if t["kind"] == kind and t.get(key) is not None]
        return [kind, what, show(spread(values), digits)]

    rows = [
        row("add", "reload answered (ms)", "reload_answer_ms", digits=0),
        row("add", "reload request to the new model's first token (s)", "first_token_s"),
        row("add", "the new backend's start, reload to ready (s)", "start_s"),
        row("add", "its warm time to first token (s)", "warm_ttft_s"),
        row("add", "added by the gateway (ms)", "added_ms", digits=0),
        row("replace", "reload answered (ms)", "reload_answer_ms", digits=0),
        row("replace", "reload request to the new process's first token (s)", "first_token_s"),
        row("replace", "the old process's drain to stopped (s)", "drain_s"),
    ]
    sent = sum(t["sent"] for t in trials)
    lost = sum(t["lost"] for t in trials)
    rows.append(["both", "requests under load: sent / lost", f"{sent} / {lost}"])
    ended = sorted({str(t.get("ended")) for t in trials if t["kind"] == "replace"})
    rows.append(["replace", "how the old process's drain ended", ", ".join(ended) or DASH])
    return table(["kind", "measure", f"median [min{DASH}max]"], rows)
