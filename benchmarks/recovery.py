"""Scenario ``recovery``: how long a client is without a model after its llama-server
dies or hangs, with the watchdog thresholds the integration tests use.

* ``kill``: ``kill -9`` of the backend, then a request through the router every
  ``POLL_SECONDS`` until one succeeds; measured from the kill to that first success,
  with the watchdog's ``backend_exited`` and ``restart_succeeded`` events on the way.
* ``stop``: ``SIGSTOP`` of the backend while two clients keep streaming through the
  router; measured from the signal to ``restart_succeeded`` (the router's first-byte
  stall timer trips, the supervisor confirms the process is stopped and replaces it)
  and to the first successful request after it.
* ``stalled``: a backend whose ``/health`` keeps answering 200 while every completion
  stalls, with two clients streaming; measured from the moment it stalls to
  ``restart_confirmed`` (the one-token canary got no answer within its share of
  ``SLM_WATCHDOG_CONFIRM_SECONDS``), ``restart_succeeded`` and the first success. The
  real llama-server cannot be made to do this on demand, so this kind runs the
  scriptable fake llama-server (``tests/fakes/fake-llama-server``), a real process on a
  real port; its start-up takes well under a second, so the load time is not SmolLM2's.

Each trial runs on a fresh launcher and router, serving SmolLM2 135M (the ``standard``
entry of ``config/models.yaml.example``) for ``kill`` and ``stop``; trials of the three
kinds alternate. Confirmation is on, as always, with its default budget.
"""

from __future__ import annotations

import datetime
import os
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from benchmarks.report import DASH, Check, show, spread, table
from benchmarks.servers import Launched, free_port, launcher, router_for
from slm_server.settings import WatchdogSettings
from tests import one_shot
from tests.integration.real_stack import example_registry, llama_server_bin
from tests.integration.watched import FAKE_LLAMA_SERVER, FAST_WATCHDOG, fake_entry
from tests.processes import pid_alive, poll

ROLE = "standard"
POLL_SECONDS = 0.02
HELLO = [{"role": "user", "content": "Say hello."}]


@dataclass(frozen=True)
class Plan:
    trials: int = 5  # of each kind


def smollm_models() -> dict[str, dict[str, Any]]:
    ports = {"standard": free_port(), "gemma": 0, "embeddings": 0}
    models: dict[str, dict[str, Any]] = example_registry(ports, roles=(ROLE,))["models"]
    models[ROLE]["default_timeout"] = 3  # as in tests/integration/test_watchdog_real.py
    return models


def _wall(ts: str) -> float:
    return datetime.datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


def _event_after(launched: Launched, name: str, since: float, **match: Any) -> dict[str, Any]:
    found: list[dict[str, Any]] = []

    def seen() -> bool:
        found[:] = [
            e
            for e in launched.events(name)
            if _wall(e["ts"]) >= since - 0.001 and all(e.get(k) == v for k, v in match.items())
        ]
        return bool(found)

    poll(seen, 90, f"watchdog event {name}", interval=0.02)
    return found[0]


def _chat(client: httpx.Client, url: str, model: str, stream: bool = False) -> int:
    body = {"model": model, "messages": HELLO, "max_tokens": 4, "stream": stream}
    try:
        if not stream:
            return client.post(f"{url}/v1/chat/completions", json=body, timeout=10).status_code
        with client.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=10) as reply:
            text = reply.read()
            return reply.status_code if b"[DONE]" in text and b'"error"' not in text else 599
    except httpx.HTTPError:
        return 0


def _first_success(
    url: str, model: str, started: float, stream: bool = False
) -> tuple[float, Counter[int]]:
    """Poll through the router until a request succeeds: seconds since ``started``
    and the statuses seen on the way (0: no answer)."""
    seen: Counter[int] = Counter()
    with httpx.Client(trust_env=False) as client:
        while time.perf_counter() - started < 120:
            status = _chat(client, url, model, stream)
            seen[status] += 1
            if status == 200:
                return time.perf_counter() - started, seen
            time.sleep(POLL_SECONDS)
    raise AssertionError(f"no successful request within 120 s: {dict(seen)}")


def kill_trial(workdir: Path, index: int) -> dict[str, Any]:
    models = smollm_models()
    model = models[ROLE]["id"]
    env = {**FAST_WATCHDOG, "SLM_LLAMA_SERVER_BIN": llama_server_bin()}
    with launcher(workdir, models, env) as launched, router_for(workdir, launched.env) as router:
        _first_success(router.url, model, time.perf_counter())
        pid = int(launched.states()[ROLE]["pid"])
        wall, started = time.time(), time.perf_counter()
        os.kill(pid, signal.SIGKILL)
        first_ok, statuses = _first_success(router.url, model, started)
        exited = _event_after(launched, "backend_exited", wall, pid=pid)
        assert not launched.events("restart_confirmed"), "an exit needs no confirmation"
        begun = _event_after(launched, "restart_started", wall, old_pid=pid)
        restarted = _event_after(launched, "restart_succeeded", wall, old_pid=pid)
    return {
        "kind": "kill",
        "trial": index,
        "first_success_s": first_ok,
        "exit_noticed_s": _wall(exited["ts"]) - wall,
        "restart_started_s": _wall(begun["ts"]) - wall,
        "restart_succeeded_s": _wall(restarted["ts"]) - wall,
        "restart_reason": restarted.get("reason"),
        "statuses_before_success": {str(k): v for k, v in statuses.items()},
    }


def _wedged_trial(
    kind: str,
    index: int,
    workdir: Path,
    models: dict[str, dict[str, Any]],
    env: dict[str, str],
    wedge: Callable[[int], None],
    unwedge: Callable[[int], None],
) -> dict[str, Any]:
    """Past the startup grace, ``wedge`` the backend (given its pid) while two clients
    stream through the router; time the watchdog's events from that moment until the
    first success after the restart. ``unwedge`` runs on the old pid afterwards."""
    model = str(models[ROLE]["id"])
    with launcher(workdir, models, env) as launched, router_for(workdir, launched.env) as router:
        _first_success(router.url, model, time.perf_counter())
        started_at = float(launched.states()[ROLE]["started_at"])
        grace = float(FAST_WATCHDOG["SLM_WATCHDOG_STARTUP_GRACE_SECONDS"])
        poll(lambda: time.time() > started_at + grace + 0.1, 10, "the startup grace to pass")
        pid = int(launched.states()[ROLE]["pid"])
        wall, started = time.time(), time.perf_counter()
        wedge(pid)
        stop_clients = threading.Event()
        clients = _streaming_clients(router.url, model, stop_clients)
        try:
            restarted = _event_after(launched, "restart_succeeded", wall, old_pid=pid)
            stop_clients.set()
            first_ok, statuses = _first_success(router.url, model, started)
            requested = _event_after(launched, "restart_requested", wall)
            confirmed = _event_after(launched, "restart_confirmed", wall)
            begun = _event_after(launched, "restart_started", wall, old_pid=pid)
        finally:
            stop_clients.set()
            unwedge(pid)
            for thread in clients:
                thread.join(15)
    return {
        "kind": kind,
        "trial": index,
        "restart_requested_s": _wall(requested["ts"]) - wall,
        "restart_confirmed_s": _wall(confirmed["ts"]) - wall,
        "confirm_rule": confirmed.get("rule"),
        "restart_started_s": _wall(begun["ts"]) - wall,
        "restart_succeeded_s": _wall(restarted["ts"]) - wall,
        "first_success_s": first_ok,
        "restart_reason": restarted.get("reason"),
        "statuses_before_success": {str(k): v for k, v in statuses.items()},
    }


def _streaming_clients(url: str, model: str, stop: threading.Event) -> list[threading.Thread]:
    def client() -> None:
        with httpx.Client(trust_env=False) as http:
            while not stop.is_set():
                _chat(http, url, model, stream=True)

    clients = [threading.Thread(target=client, daemon=True) for _ in range(2)]
    for thread in clients:
        thread.start()
    return clients


def stop_trial(workdir: Path, index: int) -> dict[str, Any]:
    def resume(pid: int) -> None:
        if pid_alive(pid):
            os.kill(pid, signal.SIGCONT)

    env = {**FAST_WATCHDOG, "SLM_LLAMA_SERVER_BIN": llama_server_bin()}

    def stop(pid: int) -> None:
        os.kill(pid, signal.SIGSTOP)

    return _wedged_trial("stop", index, workdir, smollm_models(), env, stop, resume)


def stalled_trial(workdir: Path, index: int) -> dict[str, Any]:
    workdir.mkdir(parents=True, exist_ok=True)
    entry = fake_entry(workdir, ROLE, default_timeout=3)
    env = {
        **FAST_WATCHDOG,
        "SLM_LLAMA_SERVER_BIN": str(FAKE_LLAMA_SERVER),
        "FAKE_BACKEND_PYTHON": sys.executable,
    }

    def stall(_pid: int) -> None:
        control = f"http://127.0.0.1:{entry['port']}/_control"
        one_shot.post(control, json={"stall": True}, timeout=5).raise_for_status()

    return _wedged_trial("stalled", index, workdir, {ROLE: entry}, env, stall, lambda _pid: None)


def run_trials(plan: Plan, workdir: Path, say: Callable[[str], None]) -> list[dict[str, Any]]:
    trials = []
    for index in range(1, plan.trials + 1):
        for kind, trial in (
            ("kill", kill_trial),
            ("stop", stop_trial),
            ("stalled", stalled_trial),
        ):
            result = trial(workdir / f"{kind}-{index}", index)
            restarted, first = result["restart_succeeded_s"], result["first_success_s"]
            say(
                f"  {kind} #{index}: restart_succeeded after {restarted:.2f} s, "
                f"first success after {first:.2f} s (reason {result['restart_reason']}, "
                f"confirmed by {result.get('confirm_rule', 'none: an exit')})"
            )
            trials.append(result)
    return trials


def _stat(trials: list[dict[str, Any]], kind: str, key: str) -> dict[str, Any]:
    return spread(t.get(key) for t in trials if t["kind"] == kind)


# The integration tests' own bounds (tests/integration/test_watchdog_real.py).
TEST_RESTART_SECONDS = 60.0
TEST_FIRST_SUCCESS_SECONDS = 30.0
# A stalled backend: the stall threshold, the whole default confirmation budget (the
# canary's wait is a share of it), and a few seconds to stop and start the fake.
CONFIRM_SECONDS = WatchdogSettings.from_env(FAST_WATCHDOG, Path("logs")).confirm_seconds
STALLED_RESTART_SECONDS = float(FAST_WATCHDOG["SLM_WATCHDOG_STALL_SECONDS"]) + CONFIRM_SECONDS + 5.0


def checks(trials: list[dict[str, Any]]) -> list[Check]:
    return [
        Check(
            "kill -9 → first successful request",
            TEST_FIRST_SUCCESS_SECONDS,
            "s",
            _stat(trials, "kill", "first_success_s"),
        ),
        Check(
            "SIGSTOP → restart_succeeded",
            TEST_RESTART_SECONDS,
            "s",
            _stat(trials, "stop", "restart_succeeded_s"),
        ),
        Check(
            "/health OK, completions stalled → restart_succeeded",
            STALLED_RESTART_SECONDS,
            "s",
            _stat(trials, "stalled", "restart_succeeded_s"),
        ),
    ]


def tables(trials: list[dict[str, Any]]) -> str:
    rows = [
        ["kill -9", "backend_exited", show(_stat(trials, "kill", "exit_noticed_s"))],
        ["kill -9", "restart_started", show(_stat(trials, "kill", "restart_started_s"))],
        ["kill -9", "restart_succeeded", show(_stat(trials, "kill", "restart_succeeded_s"))],
        ["kill -9", "first successful request", show(_stat(trials, "kill", "first_success_s"))],
        [
            "SIGSTOP",
            "restart_requested (stall)",
            show(_stat(trials, "stop", "restart_requested_s")),
        ],
        ["SIGSTOP", "restart_confirmed", show(_stat(trials, "stop", "restart_confirmed_s"))],
        ["SIGSTOP", "restart_started", show(_stat(trials, "stop", "restart_started_s"))],
        ["SIGSTOP", "restart_succeeded", show(_stat(trials, "stop", "restart_succeeded_s"))],
        ["SIGSTOP", "first successful request", show(_stat(trials, "stop", "first_success_s"))],
        [
            "stalled (fake)",
            "restart_requested (stall)",
            show(_stat(trials, "stalled", "restart_requested_s")),
        ],
        [
            "stalled (fake)",
            "restart_confirmed",
            show(_stat(trials, "stalled", "restart_confirmed_s")),
        ],
        [
            "stalled (fake)",
            "restart_succeeded",
            show(_stat(trials, "stalled", "restart_succeeded_s")),
        ],
        [
            "stalled (fake)",
            "first successful request",
            show(_stat(trials, "stalled", "first_success_s")),
        ],
    ]
    return table(["fault", "seconds from the signal to", f"median [min{DASH}max]"], rows)
