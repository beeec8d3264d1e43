"""A supervised gateway for watchdog tests: the real launcher running fake (or real)
llama-servers, the real router in front, every watchdog threshold set to seconds."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from tests import one_shot
from tests.processes import ROOT, Command, free_port, pid_alive, poll, running_router, start_command
from tests.registry_entries import registry_entry

FAKE_LLAMA_SERVER = ROOT / "tests" / "fakes" / "fake-llama-server"

FAST_WATCHDOG = {
    "SLM_WATCHDOG_SWEEP_SECONDS": "0.1",
    "SLM_WATCHDOG_STARTUP_GRACE_SECONDS": "0.5",
    "SLM_WATCHDOG_RESTART_COOLDOWN_SECONDS": "0",
    "SLM_WATCHDOG_STALL_SECONDS": "1",
    "SLM_WATCHDOG_SILENCE_SECONDS": "1",
    "SLM_WATCHDOG_FAILURE_THRESHOLD": "2",
    "SLM_STOP_TIMEOUT_SECONDS": "2",
}


# A real llama-server on this machine's shared CPUs, beside the suite's other workers,
# can go a few seconds between two reports or tokens: the fake's silence limit of a
# second would trip it (its test says so when it needs another).
REAL_ENGINE_SILENCE = {"SLM_WATCHDOG_SILENCE_SECONDS": "15"}


def fake_entry(
    tmp: Path, role: str, behaviour: dict[str, Any] | None = None, **fields: Any
) -> dict[str, Any]:
    """A registry entry whose model file tells the fake llama-server how to behave;
    ``fields`` add to it or override it (even ``port``)."""
    model = tmp / f"{role}.gguf"
    model.write_text(json.dumps(behaviour) if behaviour else "")
    own = registry_entry(f"fake-{role}", free_port(), model_path=str(model), default_timeout=5)
    return {**own, **fields}


@dataclass
class Watched:
    """The running launcher (and router), with views of what the watchdog did."""

    tmp: Path
    env: dict[str, str]
    models: dict[str, dict[str, Any]]
    launcher: Command
    url: str = ""
    router: Command | None = None

    @property
    def router_pid(self) -> int:
        assert self.router is not None, "started without a router"
        return self.router.popen.pid

    @property
    def log_dir(self) -> Path:
        return self.tmp / "logs"

    def states(self) -> dict[str, dict[str, Any]]:
        try:
            data = json.loads((self.log_dir / "backends.state.json").read_text())
        except (OSError, ValueError):
            return {}
        return {b["role"]: b for b in data.get("backends", [])}

    def state(self, role: str) -> dict[str, Any]:
        return self.states().get(role, {})

    def pid(self, role: str) -> int:
        pid = self.state(role).get("pid")
        assert isinstance(pid, int), self.state(role)
        return pid

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        path = self.log_dir / "watchdog.jsonl"
        if not path.exists():
            return []
        records = [json.loads(line) for line in path.read_text().splitlines() if line]
        return [r for r in records if name is None or r["event"] == name]

    def wait_event(self, name: str, timeout: float = 15.0, **match: Any) -> dict[str, Any]:
        """The first ``name`` event whose fields include ``match``; fails after ``timeout``."""
        found: list[dict[str, Any]] = []

        def seen() -> bool:
            found[:] = [
                e for e in self.events(name) if all(e.get(k) == v for k, v in match.items())
            ]
            return bool(found)

        poll(seen, timeout, f"watchdog event {name} {match}")
        return found[0]

    def past_startup_grace(self, role: str) -> None:
        """Wait until ``role``'s backend has been up longer than FAST_WATCHDOG's startup
        grace, so that a trip against it is taken."""
        begun = self.state(role)["started_at"]
        poll(lambda: time.time() > begun + 0.55, 5, "the startup grace to pass")

    def wait_ready(self, role: str, timeout: float = 20.0) -> None:
        self.wait_state(role, "ready", timeout)

    def wait_state(self, role: str, state: str, timeout: float = 20.0) -> None:
        """Wait until the supervisor publishes ``role`` in ``state`` and, with a router
        running, until the router sees it so too: the router reads the state file at
        most every 20 ms, and a request sent in between is answered by the old state."""
        poll(lambda: self.state(role).get("state") == state, timeout, f"{role} to be {state}")
        if self.url:
            # Done as well when the supervisor has moved on (the router may never show
            # a state that lasted less than its 20 ms).
            poll(
                lambda: (
                    self.router_state(role) in (state, None)
                    or self.state(role).get("state") != state
                ),
                timeout,
                f"the router to see {role} {state}",
            )

    def router_state(self, role: str) -> str | None:
        """The state the router's ``/v1/models`` gives the backend ``role`` (a replica's
        under its model's ``status.replicas``); None when it lists no such backend or
        gives it none."""
        keys = [k for k in self.env.get("SLM_API_KEYS", "").split(",") if k.strip()]
        headers = {"Authorization": f"Bearer {keys[0].strip()}"} if keys else {}
        answer = one_shot.get(f"{self.url}/v1/models", headers=headers, timeout=5)
        assert answer.status_code == 200, answer.text
        found: str | None = None
        for model in answer.json()["data"]:
            states = {r["role"]: r["state"] for r in model["status"].get("replicas", ())}
            if role in states:
                found = states[role]
                break
            if model.get("role") == role:
                found = model["status"]["state"]
                break
        return found

    def port(self, role: str) -> int:
        port = self.models[role]["port"]
        assert isinstance(port, int)
        return port

    def control(self, role: str, **script: Any) -> None:
        """Script the fake backend behind ``role`` directly on its port."""
        url = f"http://127.0.0.1:{self.port(role)}/_control"
        one_shot.post(url, json=script, timeout=5).raise_for_status()

    def model_id(self, role: str) -> str:
        model_id = self.models[role]["id"]
        assert isinstance(model_id, str)
        return model_id


@contextmanager
def watched(
    tmp: Path,
    models: dict[str, dict[str, Any]],
    *,
    router: bool = True,
    wait_ready: bool = True,
    llama_server: str | None = None,
    **env_overrides: str,
) -> Iterator[Watched]:
    """Start the launcher on ``models`` (and the router); stop both afterwards and check
    that no backend process outlives them. ``wait_ready``: first wait for every enabled
    model to be ready (a ``load: on_demand`` one: to be published unloaded).
    ``llama_server``: the native llama-server (the fake one by default; ``""`` for
    none, so that the Python fallback runs when it is importable)."""
    config = tmp / "models.yaml"
    config.write_text(yaml.safe_dump({"models": models}, sort_keys=False))
    env = {
        "SLM_CONFIG": str(config),
        "SLM_BACKEND_LOG_DIR": str(tmp / "logs"),
        "SLM_LLAMA_SERVER_BIN": str(FAKE_LLAMA_SERVER) if llama_server is None else llama_server,
        "FAKE_BACKEND_PYTHON": sys.executable,
        "SLM_ENV_FILE": str(tmp / "no.env"),
        **FAST_WATCHDOG,
        **(REAL_ENGINE_SILENCE if llama_server else {}),
        **env_overrides,
    }
    launcher = start_command("backends", env, tmp / "backends.out")
    stack = Watched(tmp, env, models, launcher)
    seen_pids: set[int] = set()
    try:
        with ExitStack() as stack_exit:
            if wait_ready:
                for role in models:
                    if not models[role].get("enabled", True):
                        continue
                    if models[role].get("load") == "on_demand":  # starts unloaded
                        stack.wait_state(role, "unloaded")
                    else:
                        stack.wait_ready(role)
            if router:
                stack.router, stack.url = stack_exit.enter_context(running_router(env, tmp))
            yield stack
            seen_pids = {e["new_pid"] for e in stack.events("restart_succeeded")}
            seen_pids |= {e["pid"] for e in stack.events("backend_loaded") if e.get("pid")}
    finally:
        seen_pids |= {s["pid"] for s in stack.states().values() if s.get("pid")}
        launcher.stop()
        poll(lambda: not any(pid_alive(p) for p in seen_pids), 15, "backends to exit")


def seconds_between(earlier: str, later: str) -> float:
    """Seconds between two event stamps (``2026-11-30T09:14:02.117Z``)."""
    stamp = "%Y-%m-%dT%H:%M:%S.%fZ"
    return (datetime.strptime(later, stamp) - datetime.strptime(earlier, stamp)).total_seconds()
