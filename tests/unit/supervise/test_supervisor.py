"""The supervisor's shell on a fake :class:`ProcessControl`: children whose exit the test
decides, health answers it chooses (one may hang forever), signals recorded. No process
is started and no port is opened.

Tests synchronise on the shell's own tasks and on turns of its loop, never on sleeps;
the only real time measured is the bound on a parallel shutdown.
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path
from typing import Any

from slm_server.contracts.commands import Command, Reply
from slm_server.contracts.records import budget_view, read_state
from slm_server.contracts.restart_requests import RestartRequest, write_request
from slm_server.contracts.states import State
from slm_server.launch.process import PortHolder
from slm_server.registry.schema import ModelEntry, ModelSpec, RegistryFile
from slm_server.settings import Settings
from slm_server.supervise.core.confirm import Probe
from slm_server.supervise.core.confirm import Reply as ProbeReply
from slm_server.supervise.supervisor import Supervisor
from tests.unit.supervise.fakes import (
    GENTLE,
    HANG,
    HEALTHY,
    LLAMA,
    ONLY_SIGKILL,
    PROMPT_CACHE_MB,
    STOP_TIMEOUT,
    TOOLS,
    UNKILLABLE,
    WALL,
    FakeControl,
    StepClock,
    events,
    make,
    port,
    serving,
    state,
    until,
)

# -- launching -----------------------------------------------------------------------


def test_launch_spawns_through_the_control_and_probes_health(tmp_path: Path) -> None:
    supervisor, control = make(tmp_path)

    async def scenario() -> None:
        supervisor.start()
        await until(
            supervisor,
            lambda: state(supervisor) is State.STARTING and bool(control.children),
            "spawned",
        )
        await until(supervisor, lambda: state(supervisor) is State.READY, "ready")
        await supervisor.stop_all()

    asyncio.run(scenario())
    [plan] = control.plans
    assert plan.argv[0] == LLAMA
    assert (plan.role, plan.port) == ("a", port(0))
    assert control.probes[0] == f"http://127.0.0.1:{port(0)}/health"
    life = supervisor.backends["a"].life
    assert life.pid == control.child("a").pid
    assert [e["event"] for e in events(supervisor)] == ["supervisor_started"]


def test_port_held_by_a_foreign_process_is_refused_and_retried(tmp_path: Path) -> None:
    supervisor, control = make(tmp_path)
    control.holders[port(0)] = PortHolder(77, "nc -l", ("nc", "-l", "8601"), 5.0)

    async def scenario() -> None:
        supervisor.start()
        await until(supervisor, lambda: state(supervisor) is State.RESTARTING, "refused")
        assert control.children == []
        del control.holders[port(0)]  # the foreign process went away
        await until(supervisor, lambda: state(supervisor) is State.READY, "ready")
        await supervisor.stop_all()

    asyncio.run(scenario())
    [refused] = events(supervisor, "stray_kill_refused")
    assert (refused["pid"], refused["command"]) == (77, "nc -l")
    assert control.strays_killed == []
    assert len(control.children) == 1


def test_port_held_by_our_own_leftover_is_freed(tmp_path: Path) -> None:
    supervisor, control = make(tmp_path)

    async def scenario() -> None:
        supervisor.start()
        await until(supervisor, lambda: state(supervisor) is State.READY, "ready")
        plan = control.plans[0]
        # the same command line as our launch: verifiably ours
        control.holders[port(0)] = PortHolder(88, "llama-server", plan.argv, 9.0)
        control.child("a").status = -9
        await until(supervisor, lambda: len(control.children) == 2, "relaunched")
        await supervisor.stop_all()

    asyncio.run(scenario())
    assert control.strays_killed == [88]
    [killed] = events(supervisor, "port_stray_killed")
    assert (killed["pid"], killed["freed"]) == (88, True)


def test_spawn_that_raises_is_a_failed_launch_and_retried(tmp_path: Path) -> None:
    supervisor, control = make(tmp_path)
    control.spawn_error = PermissionError(13, "Permission denied")

    async def scenario() -> None:
        supervisor.start()
        await until(supervisor, lambda: state(supervisor) is State.RESTARTING, "failed")
        control.spawn_error = None
        await until(supervisor, lambda: state(supervisor) is State.READY, "ready")
        await supervisor.stop_all()

    asyncio.run(scenario())
    [started] = events(supervisor, "restart_started")
    assert started["reason"] == "cannot start: [Errno 13] Permission denied"
    assert len(control.children) == 1


def test_log_trim_failure_is_reported_once_and_supervision_goes_on(tmp_path: Path) -> None:
    supervisor, control = make(tmp_path)
    control.trim_error = OSError(28, "No space left on device")

    async def scenario() -> None:
        await serving(supervisor)
        supervisor.sweep()
        supervisor.sweep()  # the same error again: not repeated
        control.child("a").status = -9
        await until(supervisor, lambda: len(control.children) == 2, "relaunched")
        await supervisor.stop_all()

    asyncio.run(scenario())
    failed = events(supervisor, "backend_log_trim_failed")
    paths = sorted(e["path"] for e in failed)
    assert paths == sorted([str(supervisor.watchdog.log_path), str(control.plans[0].log_path)])
    assert {e["error"] for e in failed} == {"OSError: [Errno 28] No space left on device"}


# -- exits -----------------------------------------------------------------------------


def test_sigkilled_child_is_reported_and_relaunched(tmp_path: Path) -> None:
    supervisor, control = make(tmp_path)

    async def scenario() -> None:
        await serving(supervisor)
        first = control.child("a")
        first.status = -9
        supervisor.turn()  # detected on the very next turn
        assert state(supervisor) is State.RESTARTING
        await until(supervisor, lambda: len(control.children) == 2, "relaunched")
        await until(supervisor, lambda: state(supervisor) is State.READY, "ready again")
        await supervisor.stop_all()

    asyncio.run(scenario())
    first, second = control.children
    [exited] = events(supervisor, "backend_exited")
    assert exited == {
        "ts": exited["ts"],
        "event": "backend_exited",
        "role": "a",
        "model_id": "m-a",
        "port": port(0),
        "pid": first.pid,
        "signal": "SIGKILL",
        "state": "ready",
    }
    [started] = events(supervisor, "restart_started")
    assert (started["reason"], started["old_pid"], started["attempt"]) == ("exited", first.pid, 1)
    [succeeded] = events(supervisor, "restart_succeeded")
    assert (succeeded["old_pid"], succeeded["new_pid"]) == (first.pid, second.pid)
    # a dead process is not signalled by the restart
    assert control.signals_of(first.pid) == []


def test_hanging_probe_of_one_backend_does_not_delay_anothers_exit(tmp_path: Path) -> None:
    supervisor, control = make(tmp_path, ("a", "b"))
    control.health[port(0)] = HANG

    async def scenario() -> None:
        supervisor.start()
        await until(supervisor, lambda: state(supervisor, "b") is State.READY, "b ready")
        assert control.probes.count(f"http://127.0.0.1:{port(0)}/health") >= 1
        assert state(supervisor, "a") is State.STARTING  # its probe is still hanging
        control.child("b").status = -9
        supervisor.turn()
        assert [e["role"] for e in events(supervisor, "backend_exited")] == ["b"]
        assert state(supervisor, "b") is State.RESTARTING
        await supervisor.stop_all()  # and the hanging probe is cancelled, not awaited

    asyncio.run(scenario())


def test_watch_detects_an_exit_within_a_second_while_a_probe_hangs(tmp_path: Path) -> None:
    supervisor, control = make(tmp_path, ("a", "b"))
    control.health[port(0)] = HANG

    async def scenario() -> float:
        watching = asyncio.create_task(supervisor.watch())
        deadline = time.monotonic() + 10.0
        while "b" not in supervisor.backends or state(supervisor, "b") is not State.READY:
            assert time.monotonic() < deadline
            await asyncio.wait([watching], timeout=0.01)
        control.child("b").status = -9
        began = time.monotonic()
        while not events(supervisor, "backend_exited"):
            assert time.monotonic() - began < 5.0
            await asyncio.wait([watching], timeout=0.01)
        took = time.monotonic() - began
        supervisor.stopping.set()
        assert await watching == 0
        await supervisor.stop_all()
        return took

    assert asyncio.run(scenario()) < 1.0
    assert state(supervisor, "a") is State.STOPPED


# -- stops -----------------------------------------------------------------------------


def test_stop_all_stops_every_child_at_once(tmp_path: Path) -> None:
    roles = ("a", "b", "c")
    supervisor, control = make(tmp_path, roles)
    for role in roles:
        control.ends_on[role] = ONLY_SIGKILL  # each takes the whole stop timeout

    async def scenario() -> float:
        await serving(supervisor)
        began = time.monotonic()
        await supervisor.stop_all()
        return time.monotonic() - began

    took = asyncio.run(scenario())
    pids = [control.child(role).pid for role in roles]
    for pid in pids:
        assert control.signals_of(pid) == [
            signal.SIGCONT,
            signal.SIGTERM,
            signal.SIGKILL,
            signal.SIGKILL,  # the group, for anything the backend forked
        ]
    # in parallel: every SIGTERM went out before the first SIGKILL ...
    sent = [sig for _pid, sig in control.signals]
    assert sent.index(signal.SIGKILL) > max(i for i, s in enumerate(sent) if s == signal.SIGTERM)
    # ... so the whole shutdown takes one stop timeout, not three
    assert STOP_TIMEOUT <= took < 2.5 * STOP_TIMEOUT, took  # one after another: 3
    assert all(state(supervisor, role) is State.STOPPED for role in roles)
    assert all(c.status == -signal.SIGKILL for c in control.children)


def test_stop_all_sends_sigterm_and_no_sigkill_wait_when_it_ends(tmp_path: Path) -> None:
    supervisor, control = make(tmp_path, ("a", "b"))
    control.ends_on["b"] = ONLY_SIGKILL

    async def scenario() -> None:
        await serving(supervisor)
        control.child("a").status = 0  # ended on its own before shutdown: not signalled
        await supervisor.stop_all()

    asyncio.run(scenario())
    assert control.signals_of(control.child("a").pid) == []
    assert control.signals_of(control.child("b").pid)[:2] == [signal.SIGCONT, signal.SIGTERM]


def test_child_that_survives_sigkill_in_a_restart_is_reported_and_left(tmp_path: Path) -> None:
    supervisor, control = make(tmp_path, clock=StepClock(0.5))
    control.ends_on["a"] = UNKILLABLE

    async def scenario() -> None:
        await serving(supervisor)
        control.ends_on["a"] = GENTLE  # the replacement is an ordinary process
        request = RestartRequest("a", "m-a", port(0), "5xx", WALL, "2 consecutive 5xx")
        write_request(supervisor.watchdog.request_dir, request)
        supervisor.sweep()
        await until(supervisor, lambda: len(control.children) == 2, "relaunched")
        await until(supervisor, lambda: state(supervisor) is State.READY, "ready again")
        await supervisor.stop_all()

    asyncio.run(scenario())
    old, new = control.children
    assert old.status is None  # still there: left, not waited on forever
    assert control.signals_of(old.pid) == [
        signal.SIGCONT,
        signal.SIGTERM,
        signal.SIGKILL,
        signal.SIGKILL,
    ]
    [unkillable] = events(supervisor, "process_unkillable")
    assert (unkillable["role"], unkillable["pid"]) == ("a", old.pid)
    [succeeded] = events(supervisor, "restart_succeeded")
    assert (succeeded["reason"], succeeded["old_pid"], succeeded["new_pid"]) == (
        "5xx",
        old.pid,
        new.pid,
    )


def test_wedged_restart_sigkills_at_once(tmp_path: Path) -> None:
    supervisor, control = make(tmp_path)

    async def scenario() -> None:
        await serving(supervisor)
        request = RestartRequest("a", "m-a", port(0), "stall", WALL, "no first byte")
        write_request(supervisor.watchdog.request_dir, request)
        supervisor.sweep()
        await until(supervisor, lambda: len(control.children) == 2, "relaunched")
        await supervisor.stop_all()

    asyncio.run(scenario())
    old = control.children[0]
    assert control.signals_of(old.pid) == [signal.SIGKILL, signal.SIGKILL]


# -- load: on_demand ---------------------------------------------------------------------


def test_an_on_demand_model_waits_unloaded_and_loads_on_the_routers_command(
    tmp_path: Path,
) -> None:
    supervisor, control = make(tmp_path, ("a", "b"), fields={"load": "on_demand"})

    async def scenario() -> None:
        supervisor.start()
        for _ in range(3):
            supervisor.turn()
        assert state(supervisor) is State.UNLOADED
        assert control.children == []
        assert supervisor.running()  # nothing loaded is no reason to give up
        reply = supervisor.command(Command("load", "a"))
        assert reply == Reply(True, "loading")
        await until(supervisor, lambda: bool(control.children), "spawned")
        control.resident[control.child("a").pid] = 321
        await until(supervisor, lambda: state(supervisor) is State.READY, "ready")
        assert state(supervisor, "b") is State.UNLOADED
        supervisor.publish()
        [snapshot] = [s for s in read_state(supervisor.settings.state_path)[1] if s.role == "a"]
        assert (snapshot.state, snapshot.load, snapshot.memory_measured_mb) == (
            "ready",
            "on_demand",
            321,
        )
        # What it measured at ready, and what its prompt cache may fill on top.
        assert snapshot.prompt_cache_mb == PROMPT_CACHE_MB
        assert snapshot.footprint_mb == 321 + PROMPT_CACHE_MB
        assert snapshot.memory_resident_mb == 321
        assert snapshot.loaded_at == WALL
        reply = supervisor.command(Command("unload", "a", "idle_ttl"))
        assert reply == Reply(True, "unloading")
        await until(supervisor, lambda: state(supervisor) is State.UNLOADED, "unloaded")
        await supervisor.stop_all()

    asyncio.run(scenario())
    names = [e["event"] for e in events(supervisor)]
    assert names == ["supervisor_started", "backend_loading", "backend_loaded", "backend_unloaded"]
    [unloaded] = events(supervisor, "backend_unloaded")
    assert unloaded["reason"] == "idle_ttl"
    assert supervisor.backends["a"].life.budget.used == 0
    assert state(supervisor, "b") is State.STOPPED


def test_a_change_of_state_is_published_before_the_event_that_reports_it(
    tmp_path: Path,
) -> None:
    """Whoever reads an event finds the state file already agreeing: a script that
    waits for ``backend_unloaded`` and then reads ``unloaded`` must never see
    ``unloading`` (CI once did, in the window between the two writes)."""
    supervisor, control = make(tmp_path, fields={"load": "on_demand"})
    seen: list[tuple[str, str, str]] = []  # event, state in memory, state in the file
    emit = supervisor.events.emit

    def watching(event: str, **fields: Any) -> dict[str, Any]:
        published = {s.role: s.state for s in read_state(supervisor.settings.state_path)[1]}
        life = supervisor.backends["a"].life if "a" in supervisor.backends else None
        seen.append((event, life.state.value if life else "", published.get("a", "")))
        return emit(event, **fields)

    supervisor.events.emit = watching  # type: ignore[method-assign]

    async def scenario() -> None:
        supervisor.start()
        supervisor.publish()
        supervisor.command(Command("load", "a"))
        await until(supervisor, lambda: state(supervisor) is State.READY, "loaded")
        control.child("a").status = -9
        await until(supervisor, lambda: len(control.children) == 2, "relaunched")
        await until(supervisor, lambda: state(supervisor) is State.READY, "ready again")
        supervisor.command(Command("unload", "a", "idle_ttl"))
        await until(supervisor, lambda: state(supervisor) is State.UNLOADED, "unloaded")

    asyncio.run(scenario())
    lifecycle = [s for s in seen if s[0] != "supervisor_started"]
    assert [s[0] for s in lifecycle] == [
        "backend_loading",
        "backend_loaded",
        "backend_exited",
        "restart_started",
        "restart_succeeded",
        "backend_unloaded",
    ]
    assert [s[2] for s in lifecycle] == [s[1] for s in lifecycle], lifecycle


def test_the_measured_footprint_is_remembered_across_runs(tmp_path: Path) -> None:
    first, control = make(tmp_path, fields={"load": "on_demand"})

    async def load(supervisor: Supervisor, control: FakeControl) -> None:
        supervisor.start()
        supervisor.command(Command("load", "a"))
        await until(supervisor, lambda: bool(control.children), "spawned")
        control.resident[control.child("a").pid] = 654
        await until(supervisor, lambda: state(supervisor) is State.READY, "ready")
        await supervisor.stop_all()

    asyncio.run(load(first, control))
    second, _control = make(tmp_path, fields={"load": "on_demand"})
    second.start()
    assert second.backends["a"].footprint_mb == 654 + PROMPT_CACHE_MB
    with_override, _control = make(tmp_path, fields={"load": "on_demand", "memory_mb": 900})
    with_override.start()
    assert with_override.backends["a"].footprint_mb == 900


def test_commands_for_always_or_unknown_models_are_refused(tmp_path: Path) -> None:
    supervisor, _control = make(tmp_path)

    async def scenario() -> None:
        await serving(supervisor)
        refused = supervisor.command(Command("unload", "a", "api"))
        assert not refused.ok
        assert refused.state == "ready"
        assert "always" in (refused.error or "")
        assert not supervisor.command(Command("load", "zzz")).ok
        assert state(supervisor) is State.READY
        await supervisor.stop_all()

    asyncio.run(scenario())


def test_a_backend_that_outgrows_its_footprint_is_reported_and_remembered(
    tmp_path: Path,
) -> None:
    """Admitted at what it measured when ready plus its prompt cache's size: growth
    within that is the cache filling (nothing changes); beyond it the footprint rises
    to cover it, and beyond it by 5 % it is an event and remembered for the next run."""
    supervisor, control = make(tmp_path)
    admitted = 200 + PROMPT_CACHE_MB

    async def scenario() -> None:
        supervisor.start()
        await until(supervisor, lambda: bool(control.children), "spawned")
        pid = control.child("a").pid
        control.resident[pid] = 200
        await until(supervisor, lambda: state(supervisor) is State.READY, "ready")
        backend = supervisor.backends["a"]
        assert backend.footprint_mb == admitted
        control.resident[pid] = admitted  # the cache full: still within
        supervisor.sweep()
        assert (backend.life.measured_mb, backend.footprint_mb) == (200, admitted)
        assert backend.life.resident_mb == admitted
        control.resident[pid] = admitted + 20  # beyond, by less than 5 %
        supervisor.sweep()
        assert (backend.life.measured_mb, backend.footprint_mb) == (220, admitted + 20)
        assert events(supervisor, "memory_grew") == []
        control.resident[pid] = admitted + 200  # beyond by more than 5 %
        supervisor.sweep()
        assert (backend.life.measured_mb, backend.footprint_mb) == (400, admitted + 200)
        [grew] = events(supervisor, "memory_grew")
        assert grew["resident_mb"] == admitted + 200
        assert grew["admitted_mb"] == admitted + 20
        assert grew["prompt_cache_mb"] == PROMPT_CACHE_MB
        supervisor.sweep()  # the same size again: no second event
        assert len(events(supervisor, "memory_grew")) == 1
        supervisor.publish()
        [snapshot] = read_state(supervisor.settings.state_path)[1]
        assert snapshot.memory_resident_mb == admitted + 200
        assert snapshot.footprint_mb == admitted + 200
        await supervisor.stop_all()

    asyncio.run(scenario())
    again, _control = make(tmp_path)

    async def remembered() -> int | None:
        again.start()  # estimates and reads the store before anything is spawned
        measured = again.backends["a"].life.measured_mb
        await again.stop_all()
        return measured

    assert asyncio.run(remembered()) == 400


def test_the_restart_budget_is_published_with_when_each_restart_was_spent(
    tmp_path: Path,
) -> None:
    supervisor, control = make(tmp_path)

    async def scenario() -> None:
        await serving(supervisor)
        control.child("a").status = -9
        await until(supervisor, lambda: len(control.children) == 2, "relaunched")
        await until(supervisor, lambda: state(supervisor) is State.READY, "ready again")
        supervisor.dirty = True
        supervisor.publish()
        await supervisor.stop_all()

    asyncio.run(scenario())
    [published] = read_state(supervisor.settings.state_path)[1]
    assert published.budget_max == 5
    assert published.budget_window_seconds == 600.0
    assert len(published.budget_spent_at) == 1
    assert abs(published.budget_spent_at[0] - WALL) < 5
    view = budget_view(published, WALL + 1)
    assert (view.used, view.remaining, view.abandoned) == (1, 4, False)
    assert view.frees_at is not None and abs(view.frees_at - (WALL + 600)) < 5
    assert budget_view(published, WALL + 601).used == 0


# -- remotes -----------------------------------------------------------------------------


def make_remote(tmp_path: Path, now: list[float]) -> tuple[Supervisor, FakeControl]:
    """A supervisor of one remote entry, role ``r``, on a clock the test moves."""
    environ = {
        "SLM_ENV_FILE": str(tmp_path / "no.env"),
        "SLM_BACKEND_LOG_DIR": str(tmp_path / "logs"),
        "SLM_CONFIG": str(tmp_path / "models.yaml"),
        "SLM_REMOTE_EJECT_BASE_SECONDS": "10",
        "SLM_REMOTE_EJECT_MAX_SECONDS": "15",
        "REMOTE_KEY": "sk-unit-secret",
    }
    entry = ModelEntry.model_validate(
        {
            "id": "far",
            "backend": "remote",
            "url": "http://10.0.0.5:8080/v1",
            "api_key_env": "REMOTE_KEY",
            "default_timeout": 60,
        }
    )
    registry = RegistryFile(
        path=tmp_path / "models.yaml", models=(ModelSpec(role="r", index=0, entry=entry),)
    )
    control = FakeControl()
    supervisor = Supervisor(
        Settings.from_env(environ),
        registry,
        environ,
        clock=lambda: now[0],
        wall=lambda: WALL,
        control=control,
        tools=TOOLS,
    )
    return supervisor, control


def published(supervisor: Supervisor) -> dict[str, Any]:
    supervisor.dirty = True
    supervisor.publish()
    _pid, backends = read_state(supervisor.settings.state_path)
    (far,) = backends
    return far.__dict__


def trip(supervisor: Supervisor, port: int = 8080, model_id: str = "far") -> None:
    request = RestartRequest("r", model_id, port, "5xx", WALL, "2 consecutive 5xx")
    write_request(supervisor.watchdog.request_dir, request)
    supervisor.sweep()


def test_a_remote_is_started_never_and_published_ready_without_a_pid(tmp_path: Path) -> None:
    supervisor, control = make_remote(tmp_path, [100.0])
    supervisor.start()
    assert supervisor.backends == {} and control.plans == []
    assert supervisor.running()
    far = published(supervisor)
    assert (far["state"], far["pid"], far["backend"], far["port"]) == (
        "ready",
        None,
        "remote",
        8080,
    )
    assert far["url"] == "http://10.0.0.5:8080/v1"
    assert "sk-unit-secret" not in supervisor.settings.state_path.read_text()
    asyncio.run(supervisor.stop_all())
    assert published(supervisor)["state"] == "stopped"


def test_a_request_that_does_not_name_the_remote_is_discarded_unprobed(tmp_path: Path) -> None:
    supervisor, control = make_remote(tmp_path, [100.0])
    supervisor.start()
    trip(supervisor, port=9999)
    trip(supervisor, model_id="other")
    assert control.remote_probes == []
    assert len(events(supervisor, "stale_request_discarded")) == 2


def test_a_trip_the_remote_does_not_confirm_changes_nothing(tmp_path: Path) -> None:
    supervisor, control = make_remote(tmp_path, [100.0])

    async def scenario() -> None:
        supervisor.start()
        trip(supervisor)
        await until(supervisor, lambda: bool(events(supervisor, "restart_not_confirmed")), "judged")

    asyncio.run(scenario())
    assert control.remote_probes == ["far"]
    [refused] = events(supervisor, "restart_not_confirmed")
    assert (refused["rule"], refused["url"]) == ("canary_ok", "http://10.0.0.5:8080/v1")
    assert published(supervisor)["state"] == "ready"
    assert events(supervisor, "remote_ejected") == []


def test_a_confirmed_trip_ejects_a_failed_probe_doubles_and_a_healthy_one_readmits(
    tmp_path: Path,
) -> None:
    now = [100.0]
    supervisor, control = make_remote(tmp_path, now)
    failing = Probe(ProbeReply.FAILED, status=500)
    refused = Probe(ProbeReply.REFUSED, detail="refused")
    control.remote_answers = [(HEALTHY, failing), (refused, Probe(ProbeReply.NOT_RUN))]

    async def scenario() -> None:
        supervisor.start()
        trip(supervisor)
        await until(supervisor, lambda: bool(events(supervisor, "remote_ejected")), "ejected")
        far = published(supervisor)
        assert (far["state"], far["ejected_until"], far["ejections"]) == ("ejected", WALL + 10, 1)
        trip(supervisor)  # while ejected: not even probed
        now[0] = 109.9
        supervisor.turn()
        assert control.remote_probes == ["far"]
        now[0] = 110.0
        await until(supervisor, lambda: len(events(supervisor, "remote_ejected")) == 2, "again")
        now[0] = 125.0  # 15 s: doubled to 20, capped at 15
        await until(supervisor, lambda: bool(events(supervisor, "remote_readmitted")), "back")

    asyncio.run(scenario())
    first, second = events(supervisor, "remote_ejected")
    assert (first["rule"], first["seconds"], first["ejections"]) == ("canary_5xx", 10, 1)
    assert (second["rule"], second["seconds"], second["ejections"]) == (
        "remote_probe_failed",
        15,
        2,
    )
    assert second["reason"].startswith("re-admission probe failed")
    assert control.remote_probes == ["far"] * 3
    assert published(supervisor)["state"] == "ready"
