"""Models on demand with the real llama-server and the default models (SmolLM2 and
Gemma, both ``load: on_demand``): loaded by the first request, evicted under a budget
that holds one of them, unloaded by the API; no process left behind."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from tests import one_shot
from tests.integration.real_stack import example_registry, llama_server_bin
from tests.integration.watched import Watched, watched
from tests.processes import free_port, pid_alive, poll

pytestmark = pytest.mark.real_model

ROLES = ("standard", "gemma")


def llama_servers(ports: list[int]) -> list[int]:
    """Live llama-server processes listening (by their command line) on ``ports``."""
    found = []
    for proc in psutil.process_iter(["name", "cmdline"]):
        cmdline = proc.info.get("cmdline") or []
        if not cmdline or not cmdline[0].endswith("llama-server"):
            continue
        flags = {f"{flag} {value}" for flag, value in itertools.pairwise(cmdline)}
        if flags & {f"--port {port}" for port in ports} and pid_alive(proc.pid):
            found.append(proc.pid)
    return found


def chat(stack: Watched, model_id: str) -> httpx.Response:
    body = {
        "model": model_id,
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 8,
        "temperature": 0,
    }
    return one_shot.post(f"{stack.url}/v1/chat/completions", json=body, timeout=120)


def test_real_models_load_on_first_request_evict_under_a_budget_and_unload(
    tmp_path: Path,
) -> None:
    ports = {role: free_port() for role in ("standard", "gemma", "embeddings")}
    models: dict[str, dict[str, Any]] = example_registry(ports, ROLES)["models"]
    for entry in models.values():
        entry.update(load="on_demand", memory_mb=400)
    used_ports = [ports[r] for r in ROLES]
    env = {"SLM_MEMORY_BUDGET_MB": "600", "SLM_SWAP_HOLD_SECONDS": "0"}
    with watched(
        tmp_path, models, router=True, wait_ready=True, llama_server=llama_server_bin(), **env
    ) as stack:
        assert {s["state"] for s in stack.states().values()} == {"unloaded"}
        assert llama_servers(used_ports) == []
        small, gemma = models["standard"]["id"], models["gemma"]["id"]

        first = chat(stack, small)
        assert first.status_code == 200, first.text
        assert first.json()["choices"][0]["message"]["content"]
        loaded = stack.wait_event("backend_loaded", role="standard")
        assert loaded["memory_measured_mb"] >= 50, loaded  # the weights, touched
        small_pid = stack.pid("standard")
        assert llama_servers(used_ports) == [small_pid]

        second = chat(stack, gemma)
        assert second.status_code == 200, second.text
        evicted = stack.wait_event("backend_unloaded", role="standard")
        assert evicted["reason"] == "evicted" and evicted["for_model"] == gemma, evicted
        assert not pid_alive(small_pid)
        gemma_pid = stack.pid("gemma")
        assert llama_servers(used_ports) == [gemma_pid]
        assert stack.state("standard")["state"] == "unloaded"

        gone = one_shot.post(f"{stack.url}/v1/models/unload", json={"model": gemma}, timeout=60)
        assert gone.status_code == 200, gone.text
        assert gone.json()["status"]["state"] == "unloaded"
        assert not pid_alive(gemma_pid)
        assert stack.wait_event("backend_unloaded", role="gemma")["reason"] == "api"
        assert stack.events("restart_started") == []
        assert [s["restarts"] for s in stack.states().values()] == [0, 0]
    poll(lambda: not llama_servers(used_ports), 15, "every llama-server to exit")
