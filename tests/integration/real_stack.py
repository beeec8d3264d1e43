"""The real gateway: the launcher running llama-server with the default models, and
the router in front of it, all as real processes on free ports."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.processes import ROOT, Command, free_port, pid_alive, poll, running_router, start_command


def llama_server_bin() -> str:
    """The pinned native llama-server; the test command builds it before pytest runs."""
    configured = os.environ.get("SLM_LLAMA_SERVER_BIN")
    if configured:
        path = configured
    else:
        printed = subprocess.run(
            ["bash", str(ROOT / "scripts" / "build_llama.sh"), "--print"],
            check=True,
            capture_output=True,
            text=True,
        )
        path = printed.stdout.strip()
    if not os.access(path, os.X_OK):
        raise AssertionError(
            f"llama-server not found at {path}: run the README's test command "
            "(scripts/test.sh), which builds it"
        )
    return path


def example_registry(ports: dict[str, int], roles: tuple[str, ...] | None = None) -> dict[str, Any]:
    """``config/models.yaml.example`` with its ports replaced (and optionally fewer roles)."""
    data: dict[str, Any] = yaml.safe_load((ROOT / "config" / "models.yaml.example").read_text())
    models = data["models"]
    for role, entry in models.items():
        model_file = ROOT / entry["model_path"]
        if not model_file.exists():
            raise AssertionError(f"{model_file} is missing: run scripts/fetch_models.py")
        entry["port"] = ports[role]
    if roles is not None:
        data["models"] = {role: models[role] for role in roles}
    return data


@dataclass
class Stack:
    workdir: Path
    env: dict[str, str]
    launcher: Command
    ports: dict[str, int]

    def state(self) -> list[dict[str, Any]]:
        try:
            data = json.loads((self.workdir / "logs" / "backends.state.json").read_text())
        except (OSError, ValueError):
            return []
        backends: list[dict[str, Any]] = data.get("backends", [])
        return backends

    def pids(self) -> list[int]:
        return [b["pid"] for b in self.state() if b.get("pid")]

    def all_ready(self) -> bool:
        states = self.state()
        return bool(states) and all(b["state"] == "ready" for b in states)


@contextmanager
def running_backends(workdir: Path, roles: tuple[str, ...] | None = None) -> Iterator[Stack]:
    """Start ``python -m slm_server backends`` on the example registry; stop it after,
    checking that no backend process outlives it."""
    data = yaml.safe_load((ROOT / "config" / "models.yaml.example").read_text())
    ports = {role: free_port() for role in data["models"]}
    with running_registry(workdir, example_registry(ports, roles)) as stack:
        yield stack


@contextmanager
def running_registry(workdir: Path, registry: dict[str, Any]) -> Iterator[Stack]:
    """Start ``python -m slm_server backends`` on ``registry`` (ports already chosen)
    and wait for every backend to be ready; stop it after, checking that no backend
    process outlives it."""
    ports = {role: int(entry["port"]) for role, entry in registry["models"].items()}
    config = workdir / "models.yaml"
    config.write_text(yaml.safe_dump(registry, sort_keys=False))
    env = {
        "SLM_CONFIG": str(config),
        "SLM_BACKEND_LOG_DIR": str(workdir / "logs"),
        "SLM_LLAMA_SERVER_BIN": llama_server_bin(),
        "SLM_ENV_FILE": str(workdir / "no.env"),
        "SLM_STOP_TIMEOUT_SECONDS": "5",
    }
    launcher = start_command("backends", env, workdir / "backends.out")
    stack = Stack(workdir, env, launcher, ports)
    try:
        poll(
            lambda: stack.all_ready() or launcher.popen.poll() is not None,
            180,
            "every backend to be ready",
        )
        if launcher.popen.poll() is not None:
            raise AssertionError(f"launcher exited:\n{launcher.text()}")
        yield stack
    finally:
        pids = stack.pids()
        launcher.stop()
        poll(lambda: not any(pid_alive(p) for p in pids), 15, "backends to exit")


@contextmanager
def running_gateway(workdir: Path) -> Iterator[tuple[Stack, str]]:
    with running_backends(workdir) as stack, running_router(stack.env, workdir) as (_r, url):
        yield stack, url
