"""Memory pressure on real processes: the real launcher runs fake llama-servers, the
real router reads the machine's free memory from a simulated file the test writes
(``SLM_MEMORY_SIMULATED_FILE``), and below the floor it unloads the idle on-demand
models least recently used first, never the busy one or the ``always`` one, refuses
loads with the reason, and loads again once the memory is back."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tests import one_shot
from tests.fakes.memory import write_simulated
from tests.integration.test_on_demand import (
    api,
    assert_intact,
    chat,
    code_of,
    gateway,
    on_demand,
    stream_chat,
)
from tests.integration.watched import Watched, fake_entry
from tests.processes import pid_alive, poll

CHUNKS = 40
LONG_STREAM = {"script": {"chunks": CHUNKS, "chunk_interval_seconds": 0.15}}  # 6 s


def pressure_env(free: Path) -> dict[str, str]:
    write_simulated(free, 100_000)
    return {
        "SLM_MEMORY_SIMULATED_FILE": str(free),
        "SLM_MEMORY_FLOOR_MB": "1000",  # pressure ends at 1256 MiB free
        "SLM_MEMORY_POLL_SECONDS": "0.1",
    }


def memory(stack: Watched) -> dict[str, Any]:
    """The ``memory`` object of ``GET /health``."""
    found: dict[str, Any] = one_shot.get(f"{stack.url}/health", timeout=5).json()["memory"]
    return found


def evicted_roles(stack: Watched) -> list[str]:
    return [e["role"] for e in stack.events("evicted_for_pressure")]


def test_below_the_floor_idle_models_go_in_lru_order_and_loads_wait_for_the_memory(
    tmp_path: Path,
) -> None:
    models = {
        "base": fake_entry(tmp_path, "base", memory_mb=300),
        "busy": on_demand(tmp_path, "busy", LONG_STREAM, memory_mb=400, default_timeout=30),
        **{role: on_demand(tmp_path, role, memory_mb=400) for role in ("a", "b", "c")},
    }
    free = tmp_path / "free"
    with gateway(tmp_path, models, pressure_env(free)) as stack, ThreadPoolExecutor(1) as pool:
        poll(lambda: memory(stack)["free_mb"] == 100_000, 5, "the first reading")
        for model_id in ("fake-b", "fake-c", "fake-a"):  # b is the least recently used
            assert chat(stack, model_id).status_code == 200
        first = threading.Event()
        streaming = pool.submit(stream_chat, stack, "fake-busy", first)
        assert first.wait(10), "the stream never started"
        busy_pid, base_pid = stack.pid("busy"), stack.pid("base")

        write_simulated(free, 990)
        poll(lambda: len(evicted_roles(stack)) >= 3, 10, "the three idle models evicted")
        assert evicted_roles(stack) == ["b", "c", "a"]
        entered = stack.wait_event("memory_pressure", state="entered")
        assert (entered["free_mb"], entered["floor_mb"], entered["resume_mb"]) == (990, 1000, 1256)
        assert entered["source"] == "simulated"
        named = {h["role"]: h for h in entered["holders"]}
        assert named["base"] == {
            "role": "base",
            "model_id": "fake-base",
            "memory_mb": 300,
            "load": "always",
            "busy": False,
        }
        assert named["busy"]["busy"] is True
        for event in stack.events("evicted_for_pressure"):
            assert (event["free_mb"], event["floor_mb"], event["memory_mb"]) == (990, 1000, 400)
        for role in ("b", "c", "a"):
            gone = stack.wait_event("backend_unloaded", role=role)
            assert gone["reason"] == "pressure", gone
            stack.wait_state(role, "unloaded")

        # A load is refused at once, with the reason, by a request and by the API.
        refused = chat(stack, "fake-a")
        assert refused.status_code == 503, refused.text
        assert code_of(refused) == "insufficient_memory"
        message = refused.json()["error"]["message"]
        assert "990 MiB" in message and "memory floor of 1000 MiB" in message, message
        assert refused.headers.get("retry-after")
        by_api = api(stack, "load", "fake-b")
        assert by_api.status_code == 503 and code_of(by_api) == "insufficient_memory"
        assert memory(stack)["below_floor"] is True

        # The busy model streamed on, whole; the always one was never touched.
        assert_intact(streaming.result(), CHUNKS)
        assert stack.state("base")["state"] == "ready" and pid_alive(base_pid)
        assert "busy" not in evicted_roles(stack)[:3]
        # Idle now: it goes too, once its stream has ended.
        stack.wait_event("evicted_for_pressure", role="busy")
        poll(lambda: not pid_alive(busy_pid), 10, "the busy model's process to exit")

        # Between the floor and the resume level: still below, no flapping.
        write_simulated(free, 1100)
        poll(lambda: memory(stack)["free_mb"] == 1100, 5, "a reading of 1100 MiB")
        assert chat(stack, "fake-a").status_code == 503
        assert len(stack.events("memory_pressure")) == 1

        # Back above the resume level: loads resume.
        write_simulated(free, 5000)
        left = stack.wait_event("memory_pressure", state="left")
        assert left["free_mb"] == 5000
        again = chat(stack, "fake-a")
        assert again.status_code == 200, again.text
        assert stack.state("a")["state"] == "ready"
        assert stack.state("base")["state"] == "ready" and stack.pid("base") == base_pid
        assert [e for e in stack.events("backend_unloaded") if e["role"] == "base"] == []
