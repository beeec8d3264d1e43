"""kill -9 and SIGSTOP against the real llama-server with the default chat model: the
watchdog must bring it back, and must catch the one that is alive but silent."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from slm_server.contracts.restart_requests import RestartRequest, write_request
from tests import one_shot
from tests.integration.real_stack import example_registry, llama_server_bin
from tests.integration.watched import Watched, seconds_between, watched
from tests.processes import free_port, pid_alive, poll

# Timing under a busy CPU decides these (a canary answered in time, a restart within its
# deadline): they run alone, after the parallel part of the suite (scripts/test.sh).
pytestmark = [pytest.mark.real_model, pytest.mark.serial]

HELLO = [{"role": "user", "content": "Say hello."}]


def smollm(tmp_path: Path) -> dict[str, dict[str, object]]:
    registry = example_registry(
        {"standard": free_port(), "gemma": 0, "embeddings": 0}, roles=("standard",)
    )
    models: dict[str, dict[str, object]] = registry["models"]
    models["standard"]["default_timeout"] = 3
    return models


def chat(stack: Watched, stream: bool = False) -> httpx.Response:
    body = {"model": "smollm2-135m-instruct", "messages": HELLO, "max_tokens": 8, "stream": stream}
    return one_shot.post(f"{stack.url}/v1/chat/completions", json=body, timeout=30)


def answers(stack: Watched, what: str) -> None:
    """A chat completion succeeds within 30 s: each try has the model's 3 s deadline,
    which a fresh llama-server's first answer can miss on a loaded two-core machine."""
    poll(lambda: chat(stack).status_code == 200, 30, what)


def test_real_llama_server_killed_is_restarted(tmp_path: Path) -> None:
    with watched(tmp_path, smollm(tmp_path), llama_server=llama_server_bin()) as stack:
        answers(stack, "a first chat completion")
        old_pid = stack.pid("standard")
        os.kill(old_pid, signal.SIGKILL)
        stack.wait_event("backend_exited", pid=old_pid)
        done = stack.wait_event("restart_succeeded", old_pid=old_pid, timeout=60)
        assert done["reason"] == "exited"
        answers(stack, "a chat completion after the restart")


def test_real_llama_server_stopped_is_caught_by_the_stall(tmp_path: Path) -> None:
    """Stopped, it holds its port and says nothing: a request that does not stream
    (streamed from llama-server and gathered) trips the silence rule, the process is
    killed at once and relaunched, and the request it stranded is sent again and
    answered."""
    models = smollm(tmp_path)
    models["standard"]["default_timeout"] = 30  # the wait and the answer again fit in it
    with watched(
        tmp_path, models, llama_server=llama_server_bin(), SLM_WATCHDOG_SILENCE_SECONDS="2"
    ) as stack:
        started = stack.state("standard")["started_at"]
        poll(lambda: time.time() > started + 0.6, 5, "the startup grace to pass")
        old_pid = stack.pid("standard")
        os.kill(old_pid, signal.SIGSTOP)
        try:
            stranded = chat(stack)
            assert stranded.status_code == 200, stranded.text
            assert stranded.json()["choices"][0]["message"]["content"]
            done = stack.wait_event("restart_succeeded", old_pid=old_pid, timeout=60)
            assert done["reason"] == "stall"
            assert not pid_alive(old_pid)
            # Killed at once: a stopped llama-server ignores SIGTERM (waited on: 2 s).
            [begun] = [e for e in stack.events("restart_started") if e["old_pid"] == old_pid]
            assert seconds_between(begun["ts"], done["ts"]) - done["seconds"] < 1.9
            [retried] = stack.events("request_retried")
            assert retried["model_id"] == "smollm2-135m-instruct"
        finally:
            if pid_alive(old_pid):
                os.kill(old_pid, signal.SIGCONT)
        answers(stack, "a chat completion from the new llama-server")


@pytest.mark.parametrize("reason", ["5xx", "stall", "saturated"])
def test_a_forged_trip_against_a_healthy_real_llama_server_is_not_confirmed(
    tmp_path: Path, reason: str
) -> None:
    """A restart request that the real llama-server disproves (its /health, its /slots
    and a one-token canary all answer) is logged and dropped: same process, no restart."""
    with watched(tmp_path, smollm(tmp_path), llama_server=llama_server_bin()) as stack:
        started = stack.state("standard")["started_at"]
        poll(lambda: time.time() > started + 0.6, 5, "the startup grace to pass")
        pid = stack.pid("standard")
        entry = stack.models["standard"]
        forged = RestartRequest(
            role="standard",
            model_id=str(entry["id"]),
            port=stack.port("standard"),
            reason=reason,
            requested_at=time.time(),
        )
        write_request(stack.log_dir / "watchdog-requests", forged)
        refused = stack.wait_event("restart_not_confirmed", timeout=30)
        assert refused["rule"] == "canary_ok", refused
        evidence = refused["evidence"]
        assert evidence["health"]["reply"] == "ok"
        assert evidence["canary"]["status"] == 200
        assert evidence["slots"] is not None, "a native llama-server shows its /slots"
        assert not stack.events("restart_started")
        assert stack.pid("standard") == pid
        answers(stack, "the healthy llama-server still answering")
        assert stack.pid("standard") == pid
