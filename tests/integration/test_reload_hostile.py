"""Hostile tests of the registry reload (issue 32) on the real launcher and fake
llama-servers: reloads while backends start, restart, are abandoned, held or draining;
ports moved, swapped and reused; replicas and on-demand models; the launcher stopped
mid-reload; forged ``retired`` commands; a forged snapshot; broken registry files; the
file watch; the restart budget."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import stat
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from slm_server.contracts import applied_registry, commands
from tests.fakes.control import free_ports
from tests.integration.test_reload import reload, stamp, write_registry
from tests.integration.watched import Watched, fake_entry, watched
from tests.processes import pid_alive, poll, start_command

# Retiring backends are stopped only when the test says so (the ``retired`` command)...
LONG_DRAIN = "60"
# ... or at once (there is no router to say they are idle).
QUICK_DRAIN = "1"


# -- helpers ------------------------------------------------------------------------------


def model_file(tmp: Path, name: str, behaviour: dict[str, Any] | None = None) -> str:
    """A model file for the fake llama-server (its behaviour, as JSON), named ``name``."""
    path = tmp / f"{name}.gguf"
    path.write_text(json.dumps(behaviour) if behaviour else "")
    return str(path)


def send(stack: Watched, command: commands.Command) -> commands.Reply:
    """One command on the supervisor's Unix socket, as the router would send it."""
    path = commands.socket_path(stack.log_dir)
    return asyncio.run(commands.send(path, command))


def retired(stack: Watched, role: str, pid: int) -> commands.Reply:
    return send(stack, commands.Command("retired", role, pid=pid))


def state_file(stack: Watched) -> dict[str, Any]:
    data = json.loads((stack.log_dir / "backends.state.json").read_text())
    assert isinstance(data, dict)
    return data


def retiring(stack: Watched) -> dict[int, dict[str, Any]]:
    """The retiring backends published in the state file, by pid."""
    return {r["pid"]: r for r in state_file(stack).get("retiring", [])}


def fake_processes(tmp: Path) -> list[psutil.Process]:
    """Live fake llama-servers of this test (their model files are under ``tmp``)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info.get("cmdline") or [])
        if "fake_backend" in cmdline and str(tmp) in cmdline and pid_alive(proc.pid):
            found.append(proc)
    return found


def cmdline(pid: int) -> list[str]:
    return psutil.Process(pid).cmdline()


def reloaded(stack: Watched, models: dict[str, dict[str, Any]]) -> dict[str, list[str]]:
    """Write ``models`` and reload; the roles by what the reload did (it must succeed)."""
    write_registry(stack, models)
    done = reload(stack)
    assert done.returncode == 0, done.stderr
    event = stack.events("config_reloaded")[-1]
    return {k: event[k] for k in ("added", "removed", "replaced", "unchanged")}


def refused(stack: Watched) -> str:
    """Reload, which must be refused; its standard error."""
    done = reload(stack)
    assert done.returncode == 1, done.stdout
    assert "reload refused" in done.stderr, done.stderr
    return done.stderr


def held(stack: Watched, role: str) -> bool:
    """Whether ``role`` waits (no process of its own) for a retiring one to drain."""
    state = stack.state(role)
    return state.get("pid") is None and "waiting for the process" in (state.get("reason") or "")


def serving_anew(stack: Watched, role: str, old: int) -> bool:
    """Whether ``role`` is ready with a process other than ``old``."""
    state = stack.state(role)
    return state.get("state") == "ready" and state.get("pid") not in (None, old)


def supervisor_alive(stack: Watched) -> bool:
    return stack.launcher.popen.poll() is None


# -- reloads while a backend starts, restarts, is abandoned -------------------------------


def test_a_starting_backend_is_kept_when_unchanged_and_retired_when_changed(
    tmp_path: Path,
) -> None:
    """Attacks a reload while a backend still loads (/health 503): an unchanged one must
    keep its starting process, a changed one must retire it and start the new launch."""
    models = {
        "slow": fake_entry(tmp_path, "slow", {"health_status": 503}),
        "base": fake_entry(tmp_path, "base"),
    }
    with watched(
        tmp_path, models, router=False, wait_ready=False, SLM_DRAIN_TIMEOUT_SECONDS=QUICK_DRAIN
    ) as stack:
        stack.wait_ready("base")
        poll(lambda: stack.state("slow").get("pid") is not None, 15, "slow to be spawned")
        starting = stack.pid("slow")
        assert stack.state("slow")["state"] == "starting"

        diff = reloaded(stack, {**models, "more": fake_entry(tmp_path, "more")})
        assert diff["unchanged"] == ["slow", "base"]
        stack.wait_ready("more")
        assert stack.pid("slow") == starting and stack.state("slow")["state"] == "starting"

        healthy = {**models["slow"], "model_path": model_file(tmp_path, "slow-fixed")}
        diff = reloaded(stack, {**stack.models, "slow": healthy})
        assert diff["replaced"] == ["slow"]
        stack.wait_ready("slow")
        assert stack.pid("slow") != starting
        poll(lambda: not pid_alive(starting), 15, "the starting process to be retired")
        assert stack.wait_event("backend_retired", role="slow")["pid"] == starting
        assert stack.events("restart_started") == []


def test_reloads_around_a_restarting_backend(tmp_path: Path) -> None:
    """Attacks a reload while a backend crashes at start and waits out its restart
    cooldown: an unchanged reload must not relaunch it (nor spend budget); one that
    fixes its model must replace it at once with a fresh budget."""
    crash = {"exit_at_start": 3}
    models = {
        "crashy": fake_entry(tmp_path, "crashy", crash),
        "base": fake_entry(tmp_path, "base"),
    }
    with watched(
        tmp_path,
        models,
        router=False,
        wait_ready=False,
        SLM_WATCHDOG_RESTART_COOLDOWN_SECONDS="120",
        SLM_WATCHDOG_MAX_RESTARTS="5",
    ) as stack:
        stack.wait_ready("base")
        # The first crash restarts at once; the second waits for the cooldown.
        poll(lambda: len(stack.events("backend_exited")) >= 2, 20, "two crashes")
        stack.wait_state("crashy", "restarting")
        spent = stack.state("crashy")["budget_spent_at"]
        starts = len(stack.events("restart_started"))
        assert starts == 1

        diff = reloaded(stack, {**models, "more": fake_entry(tmp_path, "more")})
        assert diff["unchanged"] == ["crashy", "base"]
        stack.wait_ready("more")
        assert stack.state("crashy")["state"] == "restarting"
        assert stack.state("crashy")["budget_spent_at"] == spent
        assert len(stack.events("restart_started")) == starts

        fixed = {**models["crashy"], "model_path": model_file(tmp_path, "crashy-fixed")}
        diff = reloaded(stack, {**stack.models, "crashy": fixed})
        assert diff["replaced"] == ["crashy"]
        stack.wait_ready("crashy", timeout=10)  # not after the 120 s cooldown
        assert stack.state("crashy")["restarts"] == 0
        assert stack.state("crashy")["budget_spent_at"] == []
        assert len(stack.events("restart_started")) == starts


def test_an_abandoned_backend_stays_abandoned_unless_its_launch_changes(tmp_path: Path) -> None:
    """Attacks a reload around an abandoned backend: unchanged it stays abandoned (no
    launch, no budget); a fixed launch replaces it with a fresh budget."""
    models = {
        "crashy": fake_entry(tmp_path, "crashy", {"exit_at_start": 3}),
        "base": fake_entry(tmp_path, "base"),
    }
    with watched(
        tmp_path, models, router=False, wait_ready=False, SLM_WATCHDOG_MAX_RESTARTS="1"
    ) as stack:
        stack.wait_ready("base")
        # The state file is written before the events that report it: the count is
        # taken once the last of them (backend_abandoned follows backend_exited) is in.
        stack.wait_event("backend_abandoned", role="crashy")
        launches = len(stack.events("backend_exited"))
        assert launches == 2

        diff = reloaded(stack, {**models, "more": fake_entry(tmp_path, "more")})
        assert diff["unchanged"] == ["crashy", "base"]
        stack.wait_ready("more")
        assert stack.state("crashy")["state"] == "abandoned"
        assert len(stack.events("backend_exited")) == launches

        fixed = {**models["crashy"], "model_path": model_file(tmp_path, "crashy-fixed")}
        assert reloaded(stack, {**stack.models, "crashy": fixed})["replaced"] == ["crashy"]
        stack.wait_ready("crashy")
        assert stack.state("crashy")["restarts"] == 0
        # Its budget is fresh: one crash is restarted, not abandoned at once.
        pid = stack.pid("crashy")
        os.kill(pid, signal.SIGKILL)
        stack.wait_event("restart_succeeded", role="crashy", old_pid=pid)
        stack.wait_ready("crashy")


# -- a replaced backend still draining: reload again ---------------------------------------


def test_an_entry_changed_again_while_its_old_process_drains(tmp_path: Path) -> None:
    """Attacks a backend held for its draining old process, changed again by the next
    reload: the reload must be taken, the backend stay held on the same old process,
    and the last launch start once the old one is gone."""
    models = {"a": fake_entry(tmp_path, "a"), "base": fake_entry(tmp_path, "base")}
    with watched(tmp_path, models, router=False, SLM_DRAIN_TIMEOUT_SECONDS=LONG_DRAIN) as stack:
        old = stack.pid("a")
        for context in (2048, 3072):
            diff = reloaded(stack, {**models, "a": {**models["a"], "context_length": context}})
            assert diff["replaced"] == ["a"]
            assert held(stack, "a") and set(retiring(stack)) == {old}
        assert retired(stack, "a", old).ok
        stack.wait_ready("a")
        assert "3072" in cmdline(stack.pid("a"))


def test_the_old_launch_put_back_while_the_old_process_drains(tmp_path: Path) -> None:
    """Attacks a backend held for its draining old process whose next reload puts the
    old launch back: it must stay held on that same process (never two processes),
    and start the launch put back once the old one is gone."""
    models = {"a": fake_entry(tmp_path, "a"), "base": fake_entry(tmp_path, "base")}
    with watched(tmp_path, models, router=False, SLM_DRAIN_TIMEOUT_SECONDS=LONG_DRAIN) as stack:
        old = stack.pid("a")
        old_argv = cmdline(old)
        assert reloaded(stack, {**models, "a": {**models["a"], "context_length": 2048}})[
            "replaced"
        ] == ["a"]
        assert held(stack, "a") and set(retiring(stack)) == {old}
        assert reloaded(stack, models)["replaced"] == ["a"]
        assert held(stack, "a") and set(retiring(stack)) == {old}
        assert len(stack.events("backend_retiring")) == 1
        assert pid_alive(old) and stack.state("base")["state"] == "ready"

        assert retired(stack, "a", old).ok
        stack.wait_ready("a")
        new = stack.pid("a")
        assert new != old and not pid_alive(old)
        assert cmdline(new) == old_argv  # the launch put back, not 2048
        assert "retiring" not in state_file(stack)
        a_model = models["a"]["model_path"]
        assert [p.pid for p in fake_processes(tmp_path) if a_model in p.cmdline()] == [new]
        assert stamp(stack)["generation"] == 3


def test_a_held_backend_removed_before_its_old_process_drained(tmp_path: Path) -> None:
    """Attacks a replaced backend removed by the next reload while its old process
    drains: the old process must still be retired, and nothing start for the role."""
    models = {"a": fake_entry(tmp_path, "a"), "base": fake_entry(tmp_path, "base")}
    with watched(tmp_path, models, router=False, SLM_DRAIN_TIMEOUT_SECONDS=LONG_DRAIN) as stack:
        old = stack.pid("a")
        reloaded(stack, {**models, "a": {**models["a"], "context_length": 2048}})
        assert held(stack, "a")
        assert reloaded(stack, {"base": models["base"]})["removed"] == ["a"]
        assert "a" not in stack.states() and set(retiring(stack)) == {old}
        assert retired(stack, "a", old).ok
        poll(lambda: not pid_alive(old), 15, "the old process to go")
        poll(lambda: "retiring" not in state_file(stack), 5, "no backend left retiring")
        a_model = models["a"]["model_path"]
        assert [p for p in fake_processes(tmp_path) if a_model in p.cmdline()] == []
        assert "a" not in stack.states()


# -- ports: reused, swapped, moved ----------------------------------------------------------


def test_an_entry_added_on_the_port_a_removed_one_still_drains_on(tmp_path: Path) -> None:
    """Attacks reload 1 removing an entry and reload 2 adding another on the port its
    draining process still holds: the port is held by slm_server's own process, so the
    reload must be taken and the new entry held until the old process is gone."""
    models = {"gone": fake_entry(tmp_path, "gone"), "base": fake_entry(tmp_path, "base")}
    with watched(tmp_path, models, router=False, SLM_DRAIN_TIMEOUT_SECONDS=LONG_DRAIN) as stack:
        old = stack.pid("gone")
        assert reloaded(stack, {"base": models["base"]})["removed"] == ["gone"]
        newcomer = fake_entry(tmp_path, "newcomer", port=models["gone"]["port"])
        write_registry(stack, {"base": models["base"], "newcomer": newcomer})
        done = reload(stack)
        assert done.returncode == 0, done.stderr
        assert held(stack, "newcomer")
        assert retired(stack, "gone", old).ok
        stack.wait_ready("newcomer")
        assert stack.state("newcomer")["port"] == models["gone"]["port"]


def test_two_entries_swap_their_ports(tmp_path: Path) -> None:
    """Attacks one reload that swaps the ports of two entries: both are replaced, and
    both must be serving on their new ports once the old processes have drained."""
    models = {"a": fake_entry(tmp_path, "a"), "b": fake_entry(tmp_path, "b")}
    with watched(tmp_path, models, router=False, SLM_DRAIN_TIMEOUT_SECONDS=QUICK_DRAIN) as stack:
        old = {role: stack.pid(role) for role in models}
        swapped = {
            "a": {**models["a"], "port": models["b"]["port"]},
            "b": {**models["b"], "port": models["a"]["port"]},
        }
        assert reloaded(stack, swapped)["replaced"] == ["a", "b"]
        poll(lambda: not any(pid_alive(p) for p in old.values()), 15, "old processes gone")
        stack.wait_ready("a", timeout=10)
        stack.wait_ready("b", timeout=10)
        assert stack.state("a")["port"] == models["b"]["port"]


def test_an_entry_moved_onto_the_port_of_one_removed_in_the_same_reload(tmp_path: Path) -> None:
    """Attacks one reload that removes an entry and moves another onto its port; the
    moved entry's own old process drains first, the removed one's second. The moved
    entry must start once both are gone."""
    models = {"a": fake_entry(tmp_path, "a"), "gone": fake_entry(tmp_path, "gone")}
    with watched(tmp_path, models, router=False, SLM_DRAIN_TIMEOUT_SECONDS=LONG_DRAIN) as stack:
        old_a, old_gone = stack.pid("a"), stack.pid("gone")
        moved = {"a": {**models["a"], "port": models["gone"]["port"]}}
        diff = reloaded(stack, moved)
        assert (diff["replaced"], diff["removed"]) == (["a"], ["gone"])
        assert retired(stack, "a", old_a).ok
        stack.wait_event("backend_retired", pid=old_a)
        assert held(stack, "a")  # the port is still taken
        assert retired(stack, "gone", old_gone).ok
        stack.wait_event("backend_retired", pid=old_gone)
        stack.wait_ready("a", timeout=10)
        assert stack.state("a")["port"] == models["gone"]["port"]


def test_an_entry_moved_onto_a_removed_port_when_the_removed_one_drains_first(
    tmp_path: Path,
) -> None:
    """The same move as above with the other order of drains (removed one first): the
    moved entry starts on the freed port only after its own old process is gone."""
    models = {"a": fake_entry(tmp_path, "a"), "gone": fake_entry(tmp_path, "gone")}
    with watched(tmp_path, models, router=False, SLM_DRAIN_TIMEOUT_SECONDS=LONG_DRAIN) as stack:
        old_a, old_gone = stack.pid("a"), stack.pid("gone")
        reloaded(stack, {"a": {**models["a"], "port": models["gone"]["port"]}})
        assert retired(stack, "gone", old_gone).ok
        stack.wait_event("backend_retired", pid=old_gone)
        assert held(stack, "a") and pid_alive(old_a)
        assert retired(stack, "a", old_a).ok
        stack.wait_ready("a", timeout=10)
        assert stack.state("a")["port"] == models["gone"]["port"]


def test_a_role_renamed_and_another_moved_onto_a_freed_port(tmp_path: Path) -> None:
    """Attacks one reload that renames a role (same entry, new YAML key, same port) and
    moves another entry to a new port while a third is added on the port it leaves:
    every new backend waits for the process on its port, then serves."""
    models = {"a": fake_entry(tmp_path, "a"), "m": fake_entry(tmp_path, "m")}
    with watched(tmp_path, models, router=False, SLM_DRAIN_TIMEOUT_SECONDS=QUICK_DRAIN) as stack:
        old = {stack.pid("a"), stack.pid("m")}
        moved = fake_entry(tmp_path, "m2")["port"]
        new = {
            "z": models["a"],
            "m": {**models["m"], "port": moved},
            "n": fake_entry(tmp_path, "n", port=models["m"]["port"]),
        }
        diff = reloaded(stack, new)
        assert diff == {"added": ["z", "n"], "removed": ["a"], "replaced": ["m"], "unchanged": []}
        for role in new:
            stack.wait_ready(role)
        assert not any(pid_alive(p) for p in old)
        assert {r: stack.state(r)["port"] for r in new} == {r: e["port"] for r, e in new.items()}


def test_replicas_shifted_by_one_port(tmp_path: Path) -> None:
    """Attacks an entry of two replicas moved up by one port (replica 1 onto replica
    2's old port): once the old processes are gone, both replicas must serve."""
    # Three ports in a row (the replicas' and the one they move or grow onto), none of
    # them another worker's: a replica on a port some other test holds never starts.
    a = fake_entry(tmp_path, "a", port=free_ports(3), replicas=2)
    models = {"a": a, "base": fake_entry(tmp_path, "base")}
    port = models["a"]["port"]
    with watched(tmp_path, models, router=False, SLM_DRAIN_TIMEOUT_SECONDS=LONG_DRAIN) as stack:
        stack.wait_ready("a.2")
        old1, old2 = stack.pid("a"), stack.pid("a.2")
        diff = reloaded(stack, {**models, "a": {**models["a"], "port": port + 1}})
        assert diff["replaced"] == ["a", "a.2"]
        assert retired(stack, "a", old1).ok
        stack.wait_event("backend_retired", pid=old1)
        assert retired(stack, "a.2", old2).ok
        stack.wait_event("backend_retired", pid=old2)
        stack.wait_ready("a.2", timeout=10)
        stack.wait_ready("a", timeout=10)
        assert (stack.state("a")["port"], stack.state("a.2")["port"]) == (port + 1, port + 2)


# -- replicas and on-demand models ----------------------------------------------------------


def test_replicas_two_to_three_and_back(tmp_path: Path) -> None:
    """Attacks ``replicas`` changed 2 -> 3 -> 2: the first two replicas must keep their
    processes; the third is added on the next port, then retired."""
    # Three ports in a row (the replicas' and the one they move or grow onto), none of
    # them another worker's: a replica on a port some other test holds never starts.
    a = fake_entry(tmp_path, "a", port=free_ports(3), replicas=2)
    models = {"a": a, "base": fake_entry(tmp_path, "base")}
    base_port = models["a"]["port"]
    with watched(tmp_path, models, router=False, SLM_DRAIN_TIMEOUT_SECONDS=QUICK_DRAIN) as stack:
        stack.wait_ready("a.2")
        kept = {role: stack.pid(role) for role in ("a", "a.2")}
        diff = reloaded(stack, {**models, "a": {**models["a"], "replicas": 3}})
        assert diff["added"] == ["a.3"] and diff["replaced"] == []
        stack.wait_ready("a.3")
        assert stack.state("a.3")["port"] == base_port + 2
        third = stack.pid("a.3")
        assert {role: stack.pid(role) for role in kept} == kept

        diff = reloaded(stack, models)
        assert diff["removed"] == ["a.3"] and diff["replaced"] == []
        poll(lambda: not pid_alive(third), 15, "the third replica to go")
        assert "a.3" not in stack.states()
        assert {role: stack.pid(role) for role in kept} == kept
        assert stack.events("restart_started") == []


def test_a_loaded_on_demand_model_replaced_then_removed(tmp_path: Path) -> None:
    """Attacks an on-demand model that is loaded when a reload replaces it (it must be
    published unloading while the old process drains, then unloaded, and load the new
    launch on request), then loaded again and removed."""
    lazy = fake_entry(tmp_path, "lazy", load="on_demand")
    models = {"lazy": lazy, "base": fake_entry(tmp_path, "base")}
    with watched(tmp_path, models, router=False, SLM_DRAIN_TIMEOUT_SECONDS=LONG_DRAIN) as stack:
        assert send(stack, commands.Command("load", "lazy")).ok
        stack.wait_ready("lazy")
        old = stack.pid("lazy")

        changed = {**models, "lazy": {**lazy, "context_length": 2048}}
        assert reloaded(stack, changed)["replaced"] == ["lazy"]
        assert stack.state("lazy")["state"] == "unloading" and set(retiring(stack)) == {old}
        refused_load = send(stack, commands.Command("load", "lazy"))
        assert not refused_load.ok  # no second process while the old one drains
        assert retired(stack, "lazy", old).ok
        stack.wait_state("lazy", "unloaded")
        assert not pid_alive(old)

        assert send(stack, commands.Command("load", "lazy")).ok
        stack.wait_ready("lazy")
        new = stack.pid("lazy")
        assert "2048" in cmdline(new)

        assert reloaded(stack, {"base": models["base"]})["removed"] == ["lazy"]
        assert set(retiring(stack)) == {new}
        assert not send(stack, commands.Command("load", "lazy")).ok
        assert retired(stack, "lazy", new).ok
        poll(lambda: not pid_alive(new), 15, "the removed model's process to go")
        assert "lazy" not in stack.states()


# -- the launcher stopped while backends retire or are held ---------------------------------


def assert_clean_shutdown(stack: Watched, tmp: Path) -> None:
    """The launcher exited 0, left no fake backend of this test alive, and left a final
    state file and an empty pidfile."""
    assert stack.launcher.stop() == 0, stack.launcher.text()
    poll(lambda: not fake_processes(tmp), 10, "no fake backend left")
    final = state_file(stack)
    assert "retiring" not in final
    states = {b["role"]: b["state"] for b in final["backends"]}
    assert set(states.values()) <= {"stopped", "disabled", "abandoned", "failed"}, states
    pidfile = stack.log_dir / "backends.pids.json"
    if pidfile.exists():
        assert json.loads(pidfile.read_text())["processes"] == []
    assert stack.events("supervisor_stopped")[-1]["exit_status"] == 0


def test_sigterm_while_a_stubborn_backend_retires_and_another_is_held(tmp_path: Path) -> None:
    """Attacks the launcher stopped (SIGTERM) while a replaced backend that ignores
    SIGTERM drains and its replacement is held, plus a removed one draining: nothing of
    the test may survive, and the state file must be final."""
    stubborn = {"ignore_sigterm": True}
    models = {
        "a": fake_entry(tmp_path, "a", stubborn),
        "gone": fake_entry(tmp_path, "gone", stubborn),
        "base": fake_entry(tmp_path, "base"),
    }
    with watched(tmp_path, models, router=False, SLM_DRAIN_TIMEOUT_SECONDS=LONG_DRAIN) as stack:
        old = {stack.pid("a"), stack.pid("gone")}
        diff = reloaded(
            stack, {"a": {**models["a"], "context_length": 2048}, "base": models["base"]}
        )
        assert (diff["replaced"], diff["removed"]) == (["a"], ["gone"])
        assert held(stack, "a") and set(retiring(stack)) == old
        assert_clean_shutdown(stack, tmp_path)
        assert not any(pid_alive(p) for p in old)


def test_sigterm_while_a_retirement_is_stopping_a_stubborn_process(tmp_path: Path) -> None:
    """Attacks the launcher stopped while a retirement's own stop is under way (the
    process ignores SIGTERM, so the stop waits for its SIGKILL): the cancelled
    retirement must not leave the process behind."""
    models = {
        "a": fake_entry(tmp_path, "a", {"ignore_sigterm": True}),
        "base": fake_entry(tmp_path, "base"),
    }
    with watched(
        tmp_path,
        models,
        router=False,
        SLM_DRAIN_TIMEOUT_SECONDS=LONG_DRAIN,
        SLM_STOP_TIMEOUT_SECONDS="5",
    ) as stack:
        old = stack.pid("a")
        reloaded(stack, {**models, "a": {**models["a"], "context_length": 2048}})
        assert retired(stack, "a", old).ok
        assert_clean_shutdown(stack, tmp_path)
        assert not pid_alive(old)
        assert stack.events("process_unkillable") == []


def test_the_launcher_killed_while_backends_retire_then_started_again(tmp_path: Path) -> None:
    """Attacks a launcher killed with SIGKILL while a replaced backend drains and its
    replacement is held: the retiring process must be in the pidfile and must not
    outlive the launcher (the parent-death signal), and the next launcher must serve
    the registry on disk with the new launch."""
    models = {"a": fake_entry(tmp_path, "a"), "base": fake_entry(tmp_path, "base")}
    with watched(tmp_path, models, router=False, SLM_DRAIN_TIMEOUT_SECONDS=LONG_DRAIN) as stack:
        old = stack.pid("a")
        changed = {**models, "a": {**models["a"], "context_length": 2048}}
        reloaded(stack, changed)
        assert held(stack, "a")
        pids = json.loads((stack.log_dir / "backends.pids.json").read_text())["processes"]
        assert old in {p["pid"] for p in pids}
        stack.launcher.stop(signal.SIGKILL)
        poll(lambda: not fake_processes(tmp_path), 10, "no backend to outlive the launcher")

        again = start_command("backends", stack.env, tmp_path / "backends2.out")
        try:
            poll(lambda: serving_anew(stack, "a", old), 20, "a to be served again")
            assert "2048" in cmdline(stack.pid("a"))
        finally:
            again.stop()
        poll(lambda: not fake_processes(tmp_path), 10, "no fake backend left")


# -- retiring backends that misbehave -------------------------------------------------------


def test_a_retiring_backend_that_ignores_sigterm_is_killed(tmp_path: Path) -> None:
    """Attacks a replaced backend that ignores SIGTERM: at its deadline it must be
    killed (SIGKILL after the stop timeout), and the replacement start."""
    models = {"a": fake_entry(tmp_path, "a", {"ignore_sigterm": True})}
    with watched(tmp_path, models, router=False, SLM_DRAIN_TIMEOUT_SECONDS=QUICK_DRAIN) as stack:
        old = stack.pid("a")
        reloaded(stack, {"a": {**models["a"], "context_length": 2048}})
        event = stack.wait_event("backend_retired", pid=old)
        assert event["ended"] == "deadline" and not pid_alive(old)
        stack.wait_ready("a")
        assert stack.events("process_unkillable") == []
        assert stack.state("a")["restarts"] == 0


def test_a_retiring_backend_that_dies_by_itself(tmp_path: Path) -> None:
    """Attacks a draining backend that ends on its own (SIGKILL from outside): it must be
    reported ``exited`` at once (not at the deadline), the held replacement start, and
    no restart be spent on it."""
    models = {"a": fake_entry(tmp_path, "a"), "base": fake_entry(tmp_path, "base")}
    with watched(tmp_path, models, router=False, SLM_DRAIN_TIMEOUT_SECONDS=LONG_DRAIN) as stack:
        old = stack.pid("a")
        reloaded(stack, {**models, "a": {**models["a"], "context_length": 2048}})
        assert held(stack, "a")
        os.kill(old, signal.SIGKILL)
        assert stack.wait_event("backend_retired", pid=old)["ended"] == "exited"
        stack.wait_ready("a", timeout=10)
        assert stack.events("restart_started") == [] and stack.events("backend_exited") == []


def test_forged_retired_commands_never_stop_a_serving_backend(tmp_path: Path) -> None:
    """Attacks the ``retired`` command forged on the socket: for a serving backend (its
    own role and pid), a retiring pid under another role, a retiring role with a serving
    pid, an unknown pid, and the replacement's pid. Every one must be refused and stop
    nothing; only the genuine one retires."""
    models = {"a": fake_entry(tmp_path, "a"), "c": fake_entry(tmp_path, "c")}
    with watched(tmp_path, models, router=False, SLM_DRAIN_TIMEOUT_SECONDS=LONG_DRAIN) as stack:
        a = stack.pid("a")
        assert not retired(stack, "a", a).ok
        assert not retired(stack, "a", os.getpid()).ok
        old_c = stack.pid("c")
        reloaded(stack, {**models, "c": {**models["c"], "context_length": 2048}})
        for role, pid in (("a", old_c), ("c", a), ("c", 2**22 + 17), ("base", old_c)):
            reply = retired(stack, role, pid)
            assert not reply.ok and reply.error, (role, pid)
        assert retired(stack, "c", old_c).ok
        stack.wait_event("backend_retired", pid=old_c)
        stack.wait_ready("c")
        new_c = stack.pid("c")
        assert not retired(stack, "c", new_c).ok
        assert not retired(stack, "c", old_c).ok  # already gone
        # The next retirement is a barrier: had a forged one been taken, it would have
        # been stopped by then.
        reloaded(stack, {**stack.models, "c": {**models["c"], "context_length": 3072}})
        assert retired(stack, "c", new_c).ok
        stack.wait_event("backend_retired", pid=new_c)
        stack.wait_ready("c")
        assert stack.pid("a") == a and pid_alive(a) and stack.state("a")["state"] == "ready"
        assert [e["pid"] for e in stack.events("backend_retired")] == [old_c, new_c]


# -- the snapshot and the registry file -----------------------------------------------------


def test_a_forged_snapshot_is_overwritten_and_a_planted_symlink_not_followed(
    tmp_path: Path,
) -> None:
    """Attacks ``logs/registry.applied.yaml``: forged before the launcher starts, then
    replaced by a symlink to another file while it runs. The snapshot must hold the
    exact text applied (mode 0600, the published version), and the symlink's target
    must not be written."""
    logs = tmp_path / "logs"
    logs.mkdir()
    snapshot = applied_registry.snapshot_path(logs)
    snapshot.write_text("models: {forged: {id: x}}\n")
    models = {"a": fake_entry(tmp_path, "a")}
    with watched(tmp_path, models, router=False) as stack:
        config = Path(stack.env["SLM_CONFIG"])
        assert snapshot.read_text() == config.read_text()
        assert applied_registry.version_of(snapshot.read_text()) == stamp(stack)["version"]
        assert stat.S_IMODE(snapshot.stat().st_mode) == 0o600

        target = tmp_path / "elsewhere.txt"
        target.write_text("untouched\n")
        snapshot.unlink()
        snapshot.symlink_to(target)
        reloaded(stack, {**models, "b": fake_entry(tmp_path, "b")})
        assert target.read_text() == "untouched\n"
        assert not snapshot.is_symlink()
        assert snapshot.read_text() == config.read_text()
        assert applied_registry.version_of(config.read_text()) == stamp(stack)["version"]
        assert stat.S_IMODE(snapshot.stat().st_mode) == 0o600


def test_a_snapshot_that_cannot_be_written(tmp_path: Path) -> None:
    """Attacks a snapshot path made unwritable (a directory in its place): the registry
    the supervisor applies and the version it reports and publishes must agree (either
    the reload is refused, or the new version is published)."""
    models = {"a": fake_entry(tmp_path, "a")}
    with watched(tmp_path, models, router=False) as stack:
        old_version = stamp(stack)["version"]
        snapshot = applied_registry.snapshot_path(stack.log_dir)
        snapshot.unlink()
        snapshot.mkdir()
        write_registry(stack, {**models, "b": fake_entry(tmp_path, "b")})
        done = reload(stack)
        text = Path(stack.env["SLM_CONFIG"]).read_text()
        if done.returncode == 0:
            event = stack.wait_event("config_reloaded")
            assert event["version"] == applied_registry.version_of(text)
            assert stamp(stack)["version"] == applied_registry.version_of(text)
        else:
            assert "b" not in stack.states() and stamp(stack)["version"] == old_version


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   \n# nothing\n",
        "models:\n",
        "models: [\n",
        "models: {a: {id: x}\n",
        "models: 42\n",
        "- just\n- a list\n",
        "models: {}\nextra: 1\n",
    ],
    ids=["empty", "comment", "null-models", "bad-yaml", "unclosed", "scalar", "list", "extra"],
)
def test_a_broken_registry_file_is_refused_and_changes_nothing(tmp_path: Path, text: str) -> None:
    """Attacks reload with an empty or invalid YAML registry: refused (the command exits
    1 naming the problem), the registry in force and every process unchanged."""
    models = {"a": fake_entry(tmp_path, "a")}
    with watched(tmp_path, models, router=False) as stack:
        pid, version = stack.pid("a"), stamp(stack)["version"]
        Path(stack.env["SLM_CONFIG"]).write_text(text)
        refused(stack)
        assert stack.wait_event("config_reload_refused")["refused"] == "invalid"
        assert supervisor_alive(stack)
        assert stack.pid("a") == pid and stamp(stack)["version"] == version


def test_a_registry_path_that_is_a_directory_or_missing_is_refused(tmp_path: Path) -> None:
    """Attacks reload with the registry file gone, then a directory in its place."""
    models = {"a": fake_entry(tmp_path, "a")}
    with watched(tmp_path, models, router=False) as stack:
        pid = stack.pid("a")
        config = Path(stack.env["SLM_CONFIG"])
        config.unlink()
        assert "file not found" in refused(stack)
        config.mkdir()
        assert "cannot read" in refused(stack)
        assert supervisor_alive(stack) and stack.pid("a") == pid


def test_a_registry_that_is_not_utf8_is_refused_by_the_command(tmp_path: Path) -> None:
    """Attacks reload with a registry file that is not UTF-8 text (binary garbage): the
    command must be answered with a refusal, not a dropped connection."""
    models = {"a": fake_entry(tmp_path, "a")}
    with watched(tmp_path, models, router=False) as stack:
        pid = stack.pid("a")
        Path(stack.env["SLM_CONFIG"]).write_bytes(b"models:\n  \xff\xfe: {}\n")
        refused(stack)
        assert stack.wait_event("config_reload_refused")["refused"] == "invalid"
        assert supervisor_alive(stack) and stack.pid("a") == pid


def test_a_deeply_nested_registry_is_refused_by_the_command(tmp_path: Path) -> None:
    """Attacks reload with valid-looking YAML nested 5000 levels deep."""
    models = {"a": fake_entry(tmp_path, "a")}
    with watched(tmp_path, models, router=False) as stack:
        pid = stack.pid("a")
        Path(stack.env["SLM_CONFIG"]).write_text("models: " + "[" * 5000 + "]" * 5000 + "\n")
        refused(stack)
        assert supervisor_alive(stack) and stack.pid("a") == pid


@pytest.mark.parametrize("way", ["watch", "sighup"])
def test_a_file_or_sighup_reload_survives_a_file_that_is_not_utf8(tmp_path: Path, way: str) -> None:
    """Attacks the file watch, and SIGHUP, with a save of binary garbage, then a valid
    registry: the supervisor must refuse the first and apply the second, its backend
    untouched."""
    models = {"a": fake_entry(tmp_path, "a")}
    with watched(
        tmp_path,
        models,
        router=False,
        SLM_CONFIG_WATCH="true" if way == "watch" else "false",
        SLM_CONFIG_WATCH_SETTLE_SECONDS="0.3",
    ) as stack:
        pid = stack.pid("a")
        Path(stack.env["SLM_CONFIG"]).write_bytes(b"\xff\xfe\x00garbage")
        if way == "sighup":
            os.kill(stack.launcher.pid, signal.SIGHUP)
        poll(
            lambda: bool(stack.events("config_reload_refused")) or not supervisor_alive(stack),
            15,
            "the supervisor to react",
        )
        assert supervisor_alive(stack), stack.launcher.text()[-2000:]
        write_registry(stack, {**models, "b": fake_entry(tmp_path, "b")})
        if way == "sighup":
            os.kill(stack.launcher.pid, signal.SIGHUP)
        stack.wait_event("config_reloaded")
        stack.wait_ready("b")
        assert stack.pid("a") == pid


def test_a_registry_that_is_a_fifo_does_not_freeze_supervision(tmp_path: Path) -> None:
    """Attacks SIGHUP with a named pipe in place of the registry file (a read that never
    ends): the supervisor must go on supervising (a backend killed with SIGKILL is
    restarted) and refuse the file."""
    models = {"a": fake_entry(tmp_path, "a")}
    with watched(tmp_path, models, router=False) as stack:
        config = Path(stack.env["SLM_CONFIG"])
        config.unlink()
        os.mkfifo(config)
        pid = stack.pid("a")
        try:
            os.kill(stack.launcher.pid, signal.SIGHUP)
            os.kill(pid, signal.SIGKILL)
            poll(lambda: serving_anew(stack, "a", pid), 10, "a restarted (registry a FIFO)")
            assert stack.events("config_reload_refused")
        finally:
            # Let a reader blocked on the pipe see its end, so the launcher can stop.
            with contextlib.suppress(OSError):
                os.close(os.open(config, os.O_WRONLY | os.O_NONBLOCK))


def test_a_huge_registry_is_refused_or_published_readable(tmp_path: Path) -> None:
    """Attacks reload with a valid registry padded past 4 MiB with a comment: either it
    is refused, or the snapshot of the version it publishes can be read back."""
    models = {"a": fake_entry(tmp_path, "a")}
    with watched(tmp_path, models, router=False) as stack:
        pid = stack.pid("a")
        padding = ("# " + "x" * 1022 + "\n") * (4 * 1024 + 64)
        text = yaml.safe_dump({"models": {**models, "b": fake_entry(tmp_path, "b")}}) + padding
        Path(stack.env["SLM_CONFIG"]).write_text(text)
        done = reload(stack)
        assert supervisor_alive(stack) and stack.pid("a") == pid
        if done.returncode == 0:
            version = stamp(stack)["version"]
            assert applied_registry.read_snapshot(stack.log_dir, version) == text
        else:
            assert "b" not in stack.states()


def test_a_reload_that_disables_every_entry(tmp_path: Path) -> None:
    """Attacks a reload that disables every entry (valid for ``check``): the supervisor
    must either refuse it or keep running, listing the entries ``disabled`` and
    draining the retiring process until its deadline."""
    models = {"a": fake_entry(tmp_path, "a")}
    with watched(tmp_path, models, router=False, SLM_DRAIN_TIMEOUT_SECONDS=LONG_DRAIN) as stack:
        pid = stack.pid("a")
        write_registry(stack, {"a": {**models["a"], "enabled": False}})
        done = reload(stack)
        if done.returncode == 0:
            stack.wait_state("a", "disabled")
            assert retired(stack, "a", pid).ok  # it was still draining
            poll(lambda: not pid_alive(pid), 15, "the drained process to go")
            assert supervisor_alive(stack)
        else:
            assert stack.pid("a") == pid and supervisor_alive(stack)


def test_a_reload_that_disables_one_entry(tmp_path: Path) -> None:
    """Attacks ``enabled: false`` on one of two entries: its process retires, the entry
    stays listed ``disabled`` with no process, the other keeps its process."""
    models = {"a": fake_entry(tmp_path, "a"), "base": fake_entry(tmp_path, "base")}
    with watched(tmp_path, models, router=False, SLM_DRAIN_TIMEOUT_SECONDS=QUICK_DRAIN) as stack:
        pid, base = stack.pid("a"), stack.pid("base")
        reloaded(stack, {**models, "a": {**models["a"], "enabled": False}})
        stack.wait_state("a", "disabled")
        assert stack.wait_event("backend_retired", pid=pid)["ended"] == "deadline"
        poll(lambda: not pid_alive(pid), 10, "the disabled entry's process to go")
        assert stack.state("a")["pid"] is None and stack.pid("base") == base
        a_model = models["a"]["model_path"]
        assert [p for p in fake_processes(tmp_path) if a_model in p.cmdline()] == []


@pytest.mark.parametrize("change", [False, True], ids=["unchanged", "changed"])
def test_a_reload_right_after_a_kill_9(tmp_path: Path, change: bool) -> None:
    """Attacks a reload that lands while the watchdog restarts a backend killed with
    SIGKILL, whatever the interleaving: unchanged, it ends with exactly one process and
    the one restart spent; changed, with exactly one process of the new launch and a
    fresh budget."""
    models = {"a": fake_entry(tmp_path, "a"), "base": fake_entry(tmp_path, "base")}
    with watched(tmp_path, models, router=False, SLM_DRAIN_TIMEOUT_SECONDS=QUICK_DRAIN) as stack:
        first = stack.pid("a")
        a = {**models["a"], "context_length": 2048} if change else models["a"]
        write_registry(stack, {**models, "a": a, "more": fake_entry(tmp_path, "more")})
        os.kill(first, signal.SIGKILL)
        done = reload(stack)
        assert done.returncode == 0, done.stderr
        stack.wait_ready("more")
        poll(lambda: serving_anew(stack, "a", first), 20, "a to be ready again")
        poll(lambda: "retiring" not in state_file(stack), 10, "nothing left retiring")
        a_model = models["a"]["model_path"]
        live = [p.pid for p in fake_processes(tmp_path) if a_model in p.cmdline()]
        assert live == [stack.pid("a")] and first not in live
        if change:
            assert "2048" in cmdline(stack.pid("a"))
            assert stack.state("a")["restarts"] == 0
            assert stack.state("a")["budget_spent_at"] == []
        else:
            assert stack.state("a")["restarts"] == 1


# -- the file watch -------------------------------------------------------------------------


def test_the_file_watch_with_rapid_edits_and_a_file_deleted_then_recreated(
    tmp_path: Path,
) -> None:
    """Attacks the file watch: a burst of saves (one reload for all), the file deleted
    (one refusal, nothing changed), then recreated (one reload)."""
    models = {"a": fake_entry(tmp_path, "a")}
    with watched(
        tmp_path,
        models,
        router=False,
        SLM_CONFIG_WATCH="true",
        SLM_CONFIG_WATCH_SETTLE_SECONDS="0.3",
        SLM_DRAIN_TIMEOUT_SECONDS=QUICK_DRAIN,
    ) as stack:
        pid = stack.pid("a")
        b = fake_entry(tmp_path, "b")
        for timeout in range(5, 25):
            write_registry(stack, {**models, "b": {**b, "default_timeout": timeout}})
        first = stack.wait_event("config_reloaded")
        assert first["added"] == ["b"] and first["source"] == "file"
        stack.wait_ready("b")

        config = Path(stack.env["SLM_CONFIG"])
        config.unlink()
        refusal = stack.wait_event("config_reload_refused")
        assert refusal["source"] == "file" and "file not found" in refusal["problems"][0]
        assert stack.state("b")["state"] == "ready" and stack.pid("a") == pid

        write_registry(stack, models)
        poll(lambda: len(stack.events("config_reloaded")) == 2, 10, "the second reload")
        assert stack.events("config_reloaded")[1]["removed"] == ["b"]
        assert len(stack.events("config_reload_requested")) == 3
        assert stack.pid("a") == pid

        # An editor's atomic save: a new file renamed over the old one.
        saved = config.with_name("models.yaml.swp")
        c = fake_entry(tmp_path, "c")
        saved.write_text(yaml.safe_dump({"models": {**models, "c": c}}, sort_keys=False))
        os.replace(saved, config)
        stack.models = {**models, "c": c}
        poll(lambda: len(stack.events("config_reloaded")) == 3, 10, "the third reload")
        assert stack.events("config_reloaded")[2]["added"] == ["c"]
        stack.wait_ready("c")


# -- the restart budget ---------------------------------------------------------------------


def test_reloads_never_spend_budget_and_keep_a_watchdog_restarted_process(
    tmp_path: Path,
) -> None:
    """Attacks the restart budget across reloads: a backend restarted by the watchdog
    (kill -9) before three reloads keeps that very process and the budget it spent;
    a replaced one starts with a fresh budget (a crash is restarted, not abandoned)."""
    models = {"a": fake_entry(tmp_path, "a"), "b": fake_entry(tmp_path, "b")}
    with watched(
        tmp_path,
        models,
        router=False,
        SLM_WATCHDOG_MAX_RESTARTS="1",
        SLM_DRAIN_TIMEOUT_SECONDS=QUICK_DRAIN,
    ) as stack:
        for role in ("a", "b"):
            first = stack.pid(role)
            os.kill(first, signal.SIGKILL)
            stack.wait_event("restart_succeeded", role=role, old_pid=first)
            stack.wait_ready(role)
        restarted_b = stack.pid("b")
        spent_b = stack.state("b")["budget_spent_at"]
        assert len(spent_b) == 1

        extra = fake_entry(tmp_path, "extra")
        reloaded(stack, {**models, "extra": extra})
        reloaded(stack, {**models, "extra": {**extra, "default_timeout": 9}})
        diff = reloaded(stack, {**models, "a": {**models["a"], "context_length": 2048}})
        assert diff["replaced"] == ["a"] and diff["unchanged"] == ["b"]
        stack.wait_ready("a")
        assert stack.pid("b") == restarted_b
        assert stack.state("b")["budget_spent_at"] == spent_b
        assert stack.state("b")["restarts"] == 1
        assert stack.state("a")["restarts"] == 0 and stack.state("a")["budget_spent_at"] == []
        assert len(stack.events("restart_started")) == 2

        new_a = stack.pid("a")
        os.kill(new_a, signal.SIGKILL)
        stack.wait_event("restart_succeeded", role="a", old_pid=new_a)
        stack.wait_ready("a")
        assert stack.events("backend_abandoned") == []
