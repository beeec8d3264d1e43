"""Saving and restoring slots through the supervisor's shell (supervise/slot_saves.py)
on the fake slot API of :class:`FakeControl`: what is saved when, what a failure
costs (an event, never the unload or the load), that a restore happens once per
process and before the backend is published ready, and that nothing is saved for a
backend the watchdog stops or one under confirmation (it may be wedged).

Synchronised on the shell's tasks and turns (:func:`until`) and on asyncio events,
never on sleeps."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

from slm_server.contracts.commands import Command
from slm_server.contracts.restart_requests import RestartRequest, write_request
from slm_server.contracts.states import State
from slm_server.supervise.core.confirm import Evidence
from slm_server.supervise.shell.evidence import Target
from slm_server.supervise.supervisor import Supervisor
from tests.unit.supervise.fakes import (
    STOP_TIMEOUT,
    WALL,
    FakeControl,
    events,
    make,
    port,
    serving,
    state,
    until,
)

ON_DEMAND = {"load": "on_demand"}
TOKENS = 500


def saves(control: FakeControl) -> list[str]:
    return [path for _port, path in control.slot_posts if path.endswith("action=save")]


def restores(control: FakeControl) -> list[str]:
    return [path for _port, path in control.slot_posts if path.endswith("action=restore")]


def slot_files(tmp_path: Path) -> list[str]:
    folder = tmp_path / "slots"
    return sorted(os.listdir(folder)) if folder.exists() else []


async def load(supervisor: Supervisor, control: FakeControl, role: str = "a") -> None:
    supervisor.command(Command("load", role))
    await until(supervisor, lambda: state(supervisor, role) is State.READY, f"{role} ready")


async def unload(supervisor: Supervisor, role: str = "a") -> None:
    supervisor.command(Command("unload", role, "idle_ttl"))
    await until(supervisor, lambda: state(supervisor, role) is State.UNLOADED, f"{role} unloaded")


async def saved_once(supervisor: Supervisor, control: FakeControl) -> None:
    """Load, fill slot 0 with TOKENS, unload: one set saved."""
    await load(supervisor, control)
    control.slot_tokens[port(0)] = TOKENS
    await unload(supervisor)


def test_an_unload_of_a_ready_backend_saves_its_slots_privately(tmp_path: Path) -> None:
    supervisor, control = make(tmp_path, fields=ON_DEMAND)

    async def scenario() -> None:
        supervisor.start()
        await saved_once(supervisor, control)
        await supervisor.stop_all()

    asyncio.run(scenario())
    assert saves(control) == ["/slots/0?action=save"]
    [saved] = events(supervisor, "cache_saved")
    assert (saved["role"], saved["slots"], saved["tokens"]) == ("a", 1, TOKENS)
    assert saved["bytes"] > 0
    key = control.plans[0].slot_cache_key
    assert key is not None
    assert slot_files(tmp_path) == [f"{key}.json", f"{key}.slot0.bin"]
    for name in slot_files(tmp_path):
        assert (tmp_path / "slots" / name).stat().st_mode & 0o777 == 0o600
    assert supervisor.backends["a"].slot_tokens == TOKENS
    names = [e["event"] for e in events(supervisor)]
    assert names.index("cache_saved") < names.index("backend_unloaded")


def test_empty_slots_are_not_kept(tmp_path: Path) -> None:
    """Two slots, only slot 0 holds a prompt: slot 1's file goes; all empty: no set."""
    supervisor, control = make(tmp_path, fields={**ON_DEMAND, "max_concurrency": 2})

    async def scenario() -> None:
        supervisor.start()
        await saved_once(supervisor, control)
        key = control.plans[0].slot_cache_key
        assert slot_files(tmp_path) == [f"{key}.json", f"{key}.slot0.bin"]
        await supervisor.stop_all()

    asyncio.run(scenario())
    assert saves(control) == ["/slots/0?action=save", "/slots/1?action=save"]
    [saved] = events(supervisor, "cache_saved")
    assert saved["slots"] == 1

    (tmp_path / "empty").mkdir()
    empty, control = make(tmp_path / "empty", fields=ON_DEMAND)

    async def nothing() -> None:
        empty.start()
        await load(empty, control)
        await unload(empty)
        await empty.stop_all()

    asyncio.run(nothing())
    assert saves(control) == ["/slots/0?action=save"]
    assert events(empty, "cache_saved") == []
    assert slot_files(tmp_path / "empty") == []


def test_a_failed_save_discards_the_set_and_the_unload_completes(tmp_path: Path) -> None:
    """A save that fails leaves no set at all, not even the one saved before."""
    supervisor, control = make(tmp_path, fields=ON_DEMAND)

    async def scenario() -> None:
        supervisor.start()
        await saved_once(supervisor, control)
        assert slot_files(tmp_path) != []
        await load(supervisor, control)
        control.slot_failures["save"] = (500, b'{"error": "disk full"}')
        await unload(supervisor)
        await supervisor.stop_all()

    asyncio.run(scenario())
    [failed] = events(supervisor, "cache_save_failed")
    assert (failed["role"], failed["slot"]) == ("a", 0)
    assert "answered 500" in failed["reason"] and "disk full" in failed["reason"]
    assert len(events(supervisor, "cache_saved")) == 1  # the first unload only
    assert len(events(supervisor, "backend_unloaded")) == 2
    assert slot_files(tmp_path) == []
    assert supervisor.backends["a"].slot_tokens == 0


def test_a_restore_happens_once_per_process_before_it_is_ready(tmp_path: Path) -> None:
    supervisor, control = make(tmp_path, fields=ON_DEMAND)
    seen: list[tuple[str, State]] = []
    post = control.post_json

    async def watching(base_url: str, path: str, payload: Any, timeout: float) -> Any:
        seen.append((path, state(supervisor)))
        return await post(base_url, path, payload, timeout)

    control.post_json = watching  # type: ignore[method-assign]

    async def scenario() -> None:
        supervisor.start()
        await saved_once(supervisor, control)
        control.slot_tokens.clear()  # a new process holds nothing
        await load(supervisor, control)
        for _ in range(5):  # more probes: no second restore
            await until(supervisor, lambda: True, "a turn")
            supervisor.sweep()
        await supervisor.stop_all()

    asyncio.run(scenario())
    assert [p for p, _s in seen if "restore" in p] == ["/slots/0?action=restore"]
    assert [s for p, s in seen if "restore" in p] == [State.LOADING]
    assert control.slot_tokens[port(0)] == TOKENS  # what the new process was given
    [restored] = events(supervisor, "cache_restored")
    assert (restored["slots"], restored["tokens"]) == (1, TOKENS)
    names = [e["event"] for e in events(supervisor)]
    second_load = [i for i, name in enumerate(names) if name == "backend_loaded"][1]
    assert names.index("cache_restored") < second_load


def test_a_refused_restore_discards_the_set_and_the_backend_becomes_ready(
    tmp_path: Path,
) -> None:
    supervisor, control = make(tmp_path, fields=ON_DEMAND)

    async def scenario() -> None:
        supervisor.start()
        await saved_once(supervisor, control)
        control.slot_failures["restore"] = (400, b'{"error": "invalid slot file"}')
        control.slot_tokens.clear()  # a new process holds nothing
        await load(supervisor, control)
        assert supervisor.backends["a"].slot_tokens == 0
        await supervisor.stop_all()

    asyncio.run(scenario())
    [rejected] = events(supervisor, "cache_rejected")
    assert (rejected["role"], rejected["slot"]) == ("a", 0)
    assert "answered 400" in rejected["reason"]
    assert events(supervisor, "cache_restored") == []
    assert len(events(supervisor, "backend_loaded")) == 2
    # Nothing left of the refused set; the graceful stop saved nothing (slot 0 empty).
    assert slot_files(tmp_path) == []


def test_a_forged_set_on_disk_is_rejected_without_asking_the_server(tmp_path: Path) -> None:
    supervisor, control = make(tmp_path, fields=ON_DEMAND)

    async def scenario() -> None:
        supervisor.start()
        await saved_once(supervisor, control)
        key = control.plans[0].slot_cache_key
        (tmp_path / "slots" / f"{key}.slot0.bin").write_text("tampered, another size")
        await load(supervisor, control)
        await supervisor.stop_all()

    asyncio.run(scenario())
    assert restores(control) == []
    [rejected] = events(supervisor, "cache_rejected")
    assert "bytes, not" in rejected["reason"]
    assert len(events(supervisor, "backend_loaded")) == 2


def test_a_graceful_stop_saves_every_ready_backend(tmp_path: Path) -> None:
    supervisor, control = make(tmp_path, ("a", "b"))

    async def scenario() -> None:
        await serving(supervisor)
        control.slot_tokens[port(0)] = TOKENS
        control.slot_tokens[port(1)] = TOKENS + 1
        await supervisor.stop_all()

    asyncio.run(scenario())
    saved = {e["role"]: e["tokens"] for e in events(supervisor, "cache_saved")}
    assert saved == {"a": TOKENS, "b": TOKENS + 1}
    # The next run finds a set (status shows the saved tokens before any load).
    again, _control = make(tmp_path, ("a", "b"), fields=ON_DEMAND)  # same launch, not started
    again.start()
    assert again.backends["a"].slot_tokens in (TOKENS, TOKENS + 1)


def test_a_backend_that_does_not_answer_its_save_does_not_hold_the_shutdown_up(
    tmp_path: Path,
) -> None:
    """Wedged but not yet caught, it looks ready: the graceful stop's saves are given up
    within the stop timeout (0.3 s here) all together, not the 30 s a slot may take."""
    supervisor, control = make(tmp_path, ("a", "b"), SLM_SLOT_CACHE_TIMEOUT_SECONDS="30")
    took: list[float] = []

    async def scenario() -> None:
        await serving(supervisor)
        control.slot_silent = True
        began = time.monotonic()
        await supervisor.stop_all()
        took.append(time.monotonic() - began)

    asyncio.run(scenario())
    assert took[0] < 0.3 + STOP_TIMEOUT * 2 + 1, took
    failed = events(supervisor, "cache_save_failed")
    assert {e["role"] for e in failed} == {"a", "b"}
    assert all("no answer" in e["reason"] or "no time left" in e["reason"] for e in failed)
    assert events(supervisor, "cache_saved") == []


def test_two_roles_of_the_same_launch_keep_their_own_sets(tmp_path: Path) -> None:
    """Two roles of the same file and flags (replicas, or roles differing only in port,
    alias or sampling) hold different conversations: the role is in the key."""
    supervisor, control = make(tmp_path, ("a", "b"))

    async def scenario() -> None:
        await serving(supervisor)
        control.slot_tokens[port(0)] = TOKENS
        control.slot_tokens[port(1)] = TOKENS + 1
        await supervisor.stop_all()

    asyncio.run(scenario())
    again, _control = make(tmp_path, ("a", "b"), fields=ON_DEMAND)
    again.start()
    assert again.backends["a"].slot_tokens == TOKENS
    assert again.backends["b"].slot_tokens == TOKENS + 1


def test_a_crash_is_not_saved_and_the_new_process_restores_the_last_set(tmp_path: Path) -> None:
    supervisor, control = make(tmp_path, fields=ON_DEMAND)

    async def scenario() -> None:
        supervisor.start()
        await saved_once(supervisor, control)
        await load(supervisor, control)
        control.slot_tokens[port(0)] = TOKENS * 2  # more since: lost with the crash
        control.child("a").status = -9
        await until(supervisor, lambda: len(control.children) == 3, "relaunched")
        await until(supervisor, lambda: state(supervisor) is State.READY, "ready again")
        await supervisor.stop_all()

    asyncio.run(scenario())
    assert len(saves(control)) == 2  # the unload and the graceful stop, not the crash
    assert restores(control) == ["/slots/0?action=restore"] * 2  # one per new process
    assert [e["tokens"] for e in events(supervisor, "cache_restored")] == [TOKENS, TOKENS]


def test_a_watchdog_restart_of_a_live_process_saves_nothing(tmp_path: Path) -> None:
    """The trip is confirmed (the fake's evidence: stopped) and the process killed:
    a wedged backend's state is never asked for, and the last set is restored."""
    supervisor, control = make(tmp_path, fields=ON_DEMAND)

    async def scenario() -> None:
        supervisor.start()
        await saved_once(supervisor, control)
        await load(supervisor, control)
        request = RestartRequest("a", "m-a", port(0), "stall", WALL, "no first byte")
        write_request(supervisor.watchdog.request_dir, request)
        supervisor.sweep()
        await until(supervisor, lambda: len(control.children) == 3, "relaunched")
        await until(supervisor, lambda: state(supervisor) is State.READY, "ready again")
        control.slot_tokens.clear()
        await supervisor.stop_all()

    asyncio.run(scenario())
    assert len(saves(control)) == 2  # the unload; the graceful stop (nothing in it)
    assert len(restores(control)) == 2
    assert len(events(supervisor, "cache_saved")) == 1


def test_a_backend_under_confirmation_is_not_saved_when_unloaded(tmp_path: Path) -> None:
    supervisor, control = make(tmp_path, fields=ON_DEMAND)
    gathering = asyncio.Event()

    async def hanging(base_url: str, target: Target, budget_seconds: float) -> Evidence:
        gathering.set()
        never: asyncio.Future[Evidence] = asyncio.get_running_loop().create_future()
        return await never  # the evidence never comes

    control.gather_evidence = hanging  # type: ignore[method-assign]

    async def scenario() -> None:
        supervisor.start()
        await load(supervisor, control)
        control.slot_tokens[port(0)] = TOKENS
        request = RestartRequest("a", "m-a", port(0), "stall", WALL, "no first byte")
        write_request(supervisor.watchdog.request_dir, request)
        supervisor.sweep()
        await until(supervisor, gathering.is_set, "confirming")
        assert type(supervisor.backends["a"].life.phase).__name__ == "Confirming"
        await unload(supervisor)
        await supervisor.stop_all()

    asyncio.run(scenario())
    assert saves(control) == []
    assert events(supervisor, "cache_saved") == []
    assert slot_files(tmp_path) == []
