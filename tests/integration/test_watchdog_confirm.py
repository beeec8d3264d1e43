"""Confirmation through the whole stack: the router trips, the supervisor asks the
backend itself (process state, /health, /slots, a one-token canary) and restarts only
when that evidence says it cannot serve. Fake llama-servers, real processes and ports."""

from __future__ import annotations

from pathlib import Path

from tests import one_shot
from tests.integration.watched import Watched, fake_entry, seconds_between, watched
from tests.processes import pid_alive

HELLO = [{"role": "user", "content": "hello"}]
CONFIRM_SECONDS = 2.0
STALL_SECONDS = 1.0  # FAST_WATCHDOG's SLM_WATCHDOG_STALL_SECONDS
LOAD_SECONDS = 10.0  # a fake llama-server's start-up, generously (a loaded CI machine)


def stream_once(stack: Watched, role: str) -> None:
    """One streaming request; the router ends it at its first-byte stall threshold."""
    body = {"model": stack.model_id(role), "messages": HELLO, "stream": True}
    with one_shot.stream("POST", f"{stack.url}/v1/chat/completions", json=body, timeout=30) as r:
        r.read()


def restarted_within_bound(stack: Watched, old_pid: int, reason: str, rule: str) -> None:
    requested = stack.wait_event("restart_requested", reason=reason)
    confirmed = stack.wait_event("restart_confirmed", timeout=CONFIRM_SECONDS + 10)
    assert confirmed["rule"] == rule, confirmed
    done = stack.wait_event("restart_succeeded", old_pid=old_pid, timeout=30)
    assert done["reason"] == reason
    assert not pid_alive(old_pid)
    # From the trip to a serving replacement: confirmation, the stop, then the load.
    took = seconds_between(requested["ts"], done["ts"])
    assert took < CONFIRM_SECONDS + LOAD_SECONDS, took


def test_a_backend_that_accepts_and_never_answers_health_included_is_restarted(
    tmp_path: Path,
) -> None:
    """Not stopped: a running process that holds its port and answers nothing."""
    models = {"standard": fake_entry(tmp_path, "standard", default_timeout=3)}
    with watched(tmp_path, models, SLM_WATCHDOG_CONFIRM_SECONDS=str(CONFIRM_SECONDS)) as stack:
        stack.past_startup_grace("standard")
        old_pid = stack.pid("standard")
        stack.control("standard", stall=True, health_stall=True)
        stream_once(stack, "standard")
        restarted_within_bound(stack, old_pid, "stall", "health_failed")
        assert stack.pid("standard") != old_pid
        body = {"model": stack.model_id("standard"), "messages": HELLO}
        reply = one_shot.post(f"{stack.url}/v1/chat/completions", json=body, timeout=10)
        assert reply.status_code == 200


def test_health_ok_but_every_completion_stalls_is_restarted(tmp_path: Path) -> None:
    models = {"standard": fake_entry(tmp_path, "standard", default_timeout=3)}
    with watched(tmp_path, models, SLM_WATCHDOG_CONFIRM_SECONDS=str(CONFIRM_SECONDS)) as stack:
        stack.past_startup_grace("standard")
        old_pid = stack.pid("standard")
        stack.control("standard", stall=True)
        assert one_shot.get(f"http://127.0.0.1:{stack.port('standard')}/health").status_code == 200
        stream_once(stack, "standard")
        restarted_within_bound(stack, old_pid, "stall", "canary_unanswered_idle")
        confirmed = stack.wait_event("restart_confirmed")
        assert confirmed["evidence"]["health"]["reply"] == "ok"


def test_429s_from_slots_busy_with_progressing_generations_are_not_a_restart(
    tmp_path: Path,
) -> None:
    """Every slot is busy and each look at /slots shows more tokens decoded: the 429s are
    the backend being full, not wedged. No canary is sent into a full backend."""
    models = {"standard": fake_entry(tmp_path, "standard")}
    with watched(tmp_path, models, SLM_WATCHDOG_CONFIRM_SECONDS=str(CONFIRM_SECONDS)) as stack:
        stack.past_startup_grace("standard")
        old_pid = stack.pid("standard")
        stack.control("standard", status=429, slots=2, busy_slots=2)
        body = {"model": stack.model_id("standard"), "messages": HELLO}
        for _ in range(2):
            reply = one_shot.post(f"{stack.url}/v1/chat/completions", json=body, timeout=10)
            assert reply.status_code == 429
        stack.wait_event("restart_requested", reason="saturated")
        refused = stack.wait_event("restart_not_confirmed", timeout=CONFIRM_SECONDS + 10)
        assert refused["rule"] == "busy_progressing", refused
        assert not stack.events("restart_started")
        assert stack.pid("standard") == old_pid
        # The streak was reset: one more 429 is not a second trip.
        reply = one_shot.post(f"{stack.url}/v1/chat/completions", json=body, timeout=10)
        assert reply.status_code == 429
        health = one_shot.get(f"{stack.url}/v1/backends/health", timeout=5).json()["standard"]
        assert health["failure_streak"] <= 1, health
        stack.control("standard")
        reply = one_shot.post(f"{stack.url}/v1/chat/completions", json=body, timeout=10)
        assert reply.status_code == 200
        assert len(stack.events("restart_requested")) == 1
        assert stack.pid("standard") == old_pid
