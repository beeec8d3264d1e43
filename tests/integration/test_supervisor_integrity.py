"""The supervisor never dies and never hangs (issue 11, item 4), on real processes: the
real launcher supervising fake llama-servers.

- a failed housekeeping chore (a log trim, a state-file write) is an event, and
  supervision goes on;
- one backend's hanging health probe does not delay another backend's exit detection;
- SIGTERM stops every backend at once, not one after another;
- a restart request stamped in the future is discarded.
"""

from __future__ import annotations

import os
import signal
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx

from slm_server.contracts.restart_requests import RestartRequest, write_request
from tests import one_shot
from tests.integration.watched import fake_entry, watched
from tests.processes import pid_alive, poll


def chat(url: str, model: str) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    return one_shot.post(f"{url}/v1/chat/completions", json=body, timeout=10)


def event_wall(record: dict[str, object]) -> float:
    stamp = datetime.strptime(str(record["ts"]), "%Y-%m-%dT%H:%M:%S.%fZ")
    return stamp.replace(tzinfo=UTC).timestamp()


def test_a_failed_log_trim_is_an_event_and_the_backend_is_still_served(tmp_path: Path) -> None:
    models = {"chat": fake_entry(tmp_path, "chat")}
    # 50 KiB: far above the watchdog log of this test, below the 100 KiB written below.
    with watched(tmp_path, models, SLM_BACKEND_LOG_MAX_MB="0.05") as stack:
        log_path = Path(stack.state("chat")["log_path"])
        prev = log_path.with_name(log_path.name + ".prev")
        prev.unlink(missing_ok=True)
        prev.mkdir()  # the trim's copy to <log>.prev now fails (root ignores modes)
        with log_path.open("ab") as log:
            log.write(b"x" * 100_000)
        failed = stack.wait_event("backend_log_trim_failed", role="chat")
        assert failed["path"] == str(log_path)
        assert "IsADirectoryError" in failed["error"]
        assert chat(stack.url, stack.model_id("chat")).status_code == 200
        old = stack.pid("chat")
        os.kill(old, signal.SIGKILL)  # supervision goes on: the restart works (the
        # log rotation at spawn tolerates the blocked .prev too)
        stack.wait_event("restart_succeeded", role="chat", old_pid=old)
        # Reported once per distinct error, not at every sweep (0.1 s apart here).
        assert len(stack.events("backend_log_trim_failed")) == 1
        assert chat(stack.url, stack.model_id("chat")).status_code == 200


def test_a_failed_state_write_is_an_event_and_exits_are_still_handled(tmp_path: Path) -> None:
    models = {"chat": fake_entry(tmp_path, "chat")}
    with watched(tmp_path, models, router=False) as stack:
        old = stack.pid("chat")
        state_file = stack.log_dir / "backends.state.json"
        # The atomic rename onto a folder fails. The supervisor may publish again between
        # the unlink and the mkdir (CI once): take the file away again until the folder
        # is there.
        poll(lambda: _folder_in_place_of(state_file), 10, "a folder in the file's place")
        os.kill(old, signal.SIGKILL)
        stack.wait_event("state_write_failed", path=str(state_file))
        stack.wait_event("restart_succeeded", role="chat", old_pid=old)
        state_file.rmdir()  # the next write succeeds and publishes the new process
        poll(lambda: stack.state("chat").get("pid") not in (None, old), 10, "new state")
        assert stack.state("chat")["state"] == "ready"


def _folder_in_place_of(path: Path) -> bool:
    """Replace the file ``path`` with an empty folder; False when another writer put a
    file back first."""
    path.unlink(missing_ok=True)
    try:
        path.mkdir()
    except FileExistsError:
        return False
    return True


def test_a_hanging_health_probe_does_not_delay_another_backends_exit(tmp_path: Path) -> None:
    models = {
        # Its /health never answers: every probe of it waits out the probe timeout.
        "hung": fake_entry(tmp_path, "hung", {"script": {"health_stall": True}}),
        "chat": fake_entry(tmp_path, "chat"),
    }
    with watched(
        tmp_path, models, router=False, wait_ready=False, SLM_HEALTH_PROBE_TIMEOUT_SECONDS="30"
    ) as stack:
        stack.wait_ready("chat")
        assert stack.state("hung")["state"] == "starting"
        pid = stack.pid("chat")
        killed_at = time.time()
        os.kill(pid, signal.SIGKILL)
        exited = stack.wait_event("backend_exited", pid=pid)
        assert event_wall(exited) - killed_at < 3.0  # the hanging probe's timeout is 30 s
        assert stack.state("hung")["state"] == "starting"


def test_sigterm_stops_every_backend_in_parallel(tmp_path: Path) -> None:
    stubborn = {"ignore_sigterm": True}  # each one takes the whole stop timeout
    models = {role: fake_entry(tmp_path, role, stubborn) for role in ("a", "b", "c")}
    with watched(tmp_path, models, router=False, SLM_STOP_TIMEOUT_SECONDS="2") as stack:
        pids = [stack.pid(role) for role in models]
        started = time.monotonic()
        status = stack.launcher.stop(signal.SIGTERM, timeout=30)
        took = time.monotonic() - started
        assert status == 0
        assert not any(pid_alive(pid) for pid in pids)
        # One after another would take 3 x 2 s; all at once, one stop timeout.
        assert took < 4.5, took


def test_a_restart_request_stamped_in_the_future_is_discarded(tmp_path: Path) -> None:
    models = {"chat": fake_entry(tmp_path, "chat")}
    with watched(tmp_path, models, router=False) as stack:
        pid = stack.pid("chat")
        entry = models["chat"]
        request = RestartRequest(
            role="chat",
            model_id=entry["id"],
            port=entry["port"],
            reason="5xx",
            requested_at=time.time() + 3600,
        )
        write_request(Path(stack.env["SLM_BACKEND_LOG_DIR"]) / "watchdog-requests", request)
        discarded = stack.wait_event("stale_request_discarded", role="chat")
        assert discarded["reason"] == "stamped in the future"
        assert stack.events("restart_started") == []
        assert stack.pid("chat") == pid


def test_the_state_file_publishes_what_was_planned_for_the_router(tmp_path: Path) -> None:
    models = {"chat": fake_entry(tmp_path, "chat", temp=0.5)}
    with watched(tmp_path, models) as stack:
        state = stack.state("chat")
        # The fake runs as the native llama-server: /health, no request defaults.
        assert (state["kind"], state["health_path"], state["request_defaults"]) == (
            "llama-server",
            "/health",
            {},
        )
        health = one_shot.get(f"{stack.url}/v1/backends/health", timeout=5).json()["chat"]
        assert health["status"] == "healthy"
