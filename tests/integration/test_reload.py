"""Reloading the registry (issue 32) on the real launcher: fake llama-servers, and
``python -m slm_server reload``, SIGHUP and the file watch as the ways in. What a
reload changes is checked by pid and port in the state file and by the events in
``logs/watchdog.jsonl``; the router's half is in ``test_reload_router.py``."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from slm_server.cli import commands as cli
from slm_server.settings import Settings
from tests.integration.watched import Watched, fake_entry, watched
from tests.processes import ROOT, free_port, pid_alive, poll

# With no router to say a retiring backend is idle, it is stopped at its deadline.
QUICK_DRAIN = "1"


def write_registry(stack: Watched, models: dict[str, dict[str, Any]]) -> None:
    """Replace the registry file (as an editor that saves in place)."""
    config = Path(stack.env["SLM_CONFIG"])
    config.write_text(yaml.safe_dump({"models": models}, sort_keys=False))
    stack.models = models


def reload(stack: Watched) -> subprocess.CompletedProcess[str]:
    """``python -m slm_server reload`` against the stack's supervisor, run in this
    process (the command's own code, without a new interpreter's start-up: the attacks
    in ``test_reload_hostile.py`` reload some hundred times); :func:`reload_command`
    runs the real command line."""
    out, err = io.StringIO(), io.StringIO()
    settings = Settings.from_env({**os.environ, **stack.env})
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.cmd_reload(settings)
    return subprocess.CompletedProcess(["reload"], code, out.getvalue(), err.getvalue())


def reload_command(stack: Watched) -> subprocess.CompletedProcess[str]:
    """``python -m slm_server reload`` against the stack's supervisor."""
    return subprocess.run(
        [sys.executable, "-m", "slm_server", "reload"],
        env={**os.environ, **stack.env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def stamp(stack: Watched) -> dict[str, Any]:
    data = json.loads((stack.log_dir / "backends.state.json").read_text())
    registry = data.get("registry")
    assert isinstance(registry, dict), data
    return registry


def test_a_reload_applies_only_the_difference(tmp_path: Path) -> None:
    models = {
        "keep": fake_entry(tmp_path, "keep"),
        "drop": fake_entry(tmp_path, "drop"),
        "change": fake_entry(tmp_path, "change"),
    }
    with watched(tmp_path, models, router=False, SLM_DRAIN_TIMEOUT_SECONDS=QUICK_DRAIN) as stack:
        first = stamp(stack)
        assert first["generation"] == 1
        kept, dropped, changed = stack.pid("keep"), stack.pid("drop"), stack.pid("change")
        new = dict(models)
        del new["drop"]
        new["keep"] = {**models["keep"], "default_timeout": 7, "max_queue": 3}  # router only
        new["change"] = {**models["change"], "context_length": 2048}  # a new launch
        new["add"] = fake_entry(tmp_path, "add")
        write_registry(stack, new)

        done = reload_command(stack)
        assert done.returncode == 0, done.stderr
        assert "added: add" in done.stdout and "replaced: change" in done.stdout

        event = stack.wait_event("config_reloaded")
        assert (event["added"], event["removed"], event["replaced"], event["unchanged"]) == (
            ["add"],
            ["drop"],
            ["change"],
            ["keep"],
        )
        second = stamp(stack)
        assert second["generation"] == 2 and second["version"] != first["version"]

        stack.wait_ready("add")
        stack.wait_ready("change")
        assert stack.pid("keep") == kept  # unchanged: the same process
        assert stack.pid("change") != changed
        assert stack.state("change")["port"] == models["change"]["port"]
        poll(lambda: not pid_alive(dropped) and not pid_alive(changed), 15, "old processes gone")
        assert "drop" not in stack.states()
        retired = {e["role"]: e for e in stack.events("backend_retired")}
        assert set(retired) == {"drop", "change"}
        assert {e["ended"] for e in retired.values()} == {"deadline"}
        # Reloads spend no restart budget; the replacing backend's is fresh.
        assert stack.events("restart_started") == []
        assert all(s["restarts"] == 0 for s in stack.states().values())


def test_an_invalid_registry_changes_nothing_and_names_every_problem(tmp_path: Path) -> None:
    models = {"a": fake_entry(tmp_path, "a"), "b": fake_entry(tmp_path, "b")}
    with watched(tmp_path, models, router=False, SLM_DRAIN_TIMEOUT_SECONDS=QUICK_DRAIN) as stack:
        before = {role: stack.pid(role) for role in models}
        version = stamp(stack)["version"]
        bad = {
            "a": {**models["a"], "colour": "blue"},  # an unknown field
            "b": {**models["b"], "port": models["a"]["port"]},  # a port clash
            "c": {**fake_entry(tmp_path, "c"), "max_queue": -1},  # a bad value
        }
        write_registry(stack, bad)
        done = reload_command(stack)
        assert done.returncode == 1
        assert "reload refused (invalid)" in done.stderr
        for needle in ("colour", "port", "max_queue"):
            assert needle in done.stderr, done.stderr
        refused = stack.wait_event("config_reload_refused")
        assert refused["refused"] == "invalid" and len(refused["problems"]) >= 3
        assert stamp(stack)["version"] == version
        assert {role: stack.pid(role) for role in models} == before
        assert set(stack.states()) == {"a", "b"}


def test_a_reload_whose_always_models_do_not_fit_is_refused(tmp_path: Path) -> None:
    models = {"a": fake_entry(tmp_path, "a", memory_mb=100)}
    with watched(tmp_path, models, router=False, SLM_MEMORY_BUDGET_MB="250") as stack:
        pid = stack.pid("a")
        grown = {**models, "b": fake_entry(tmp_path, "b", memory_mb=200)}
        write_registry(stack, grown)
        done = reload(stack)
        assert done.returncode == 1 and "reload refused (conflict)" in done.stderr
        assert "300 MiB" in done.stderr and "250 MiB" in done.stderr
        assert stack.wait_event("config_reload_refused")["refused"] == "conflict"
        assert set(stack.states()) == {"a"} and stack.pid("a") == pid


def test_a_reload_onto_a_port_another_program_holds_is_refused(tmp_path: Path) -> None:
    models = {"a": fake_entry(tmp_path, "a")}
    with socket.socket() as holder, watched(tmp_path, models, router=False) as stack:
        port = free_port()
        holder.bind(("127.0.0.1", port))
        holder.listen()
        write_registry(stack, {**models, "b": fake_entry(tmp_path, "b", port=port)})
        done = reload(stack)
        assert done.returncode == 1 and f"port: {port} is in use" in done.stderr
        assert set(stack.states()) == {"a"}


def test_sighup_reloads_instead_of_stopping(tmp_path: Path) -> None:
    models = {"a": fake_entry(tmp_path, "a")}
    with watched(tmp_path, models, router=False) as stack:
        pid = stack.pid("a")
        write_registry(stack, {**models, "b": fake_entry(tmp_path, "b")})
        os.kill(stack.launcher.pid, signal.SIGHUP)
        event = stack.wait_event("config_reloaded")
        assert event["source"] == "signal" and event["added"] == ["b"]
        stack.wait_ready("b")
        assert stack.launcher.popen.poll() is None and stack.pid("a") == pid


def test_the_file_watch_reloads_once_per_settled_change(tmp_path: Path) -> None:
    models = {"a": fake_entry(tmp_path, "a")}
    with watched(
        tmp_path,
        models,
        router=False,
        SLM_CONFIG_WATCH="true",
        SLM_CONFIG_WATCH_SETTLE_SECONDS="0.5",
    ) as stack:
        # Three saves in quick succession settle into one reload.
        b = fake_entry(tmp_path, "b")
        for timeout in (6, 7, 8):
            write_registry(stack, {**models, "b": {**b, "default_timeout": timeout}})
        stack.wait_event("config_reloaded")
        stack.wait_ready("b")
        # A later change is another reload; nothing else comes without a change.
        write_registry(stack, models)
        poll(lambda: len(stack.events("config_reloaded")) == 2, 10, "the second reload")
        reloads = stack.events("config_reloaded")
        assert [e["source"] for e in reloads] == ["file", "file"]
        assert reloads[1]["removed"] == ["b"]
        assert len(stack.events("config_reload_requested")) == 2


def test_two_reloads_at_once_end_in_one_consistent_state(tmp_path: Path) -> None:
    models = {"a": fake_entry(tmp_path, "a")}
    with watched(tmp_path, models, router=False, SLM_DRAIN_TIMEOUT_SECONDS=QUICK_DRAIN) as stack:
        write_registry(stack, {**models, "b": fake_entry(tmp_path, "b")})
        with ThreadPoolExecutor(2) as pool:
            results = list(pool.map(lambda _i: reload(stack), range(2)))
        assert [r.returncode for r in results] == [0, 0], [r.stderr for r in results]
        reloads = stack.events("config_reloaded")
        assert len(reloads) == 2
        assert [e["generation"] for e in reloads] == [2, 3]
        assert reloads[0]["added"] == ["b"] and reloads[1]["unchanged"] == ["a", "b"]
        stack.wait_ready("b")
        assert stamp(stack)["generation"] == 3
        assert len([p for p in (stack.pid("a"), stack.pid("b")) if pid_alive(p)]) == 2


def test_reload_without_a_supervisor_says_so(tmp_path: Path) -> None:
    env = {"SLM_BACKEND_LOG_DIR": str(tmp_path / "logs"), "SLM_ENV_FILE": str(tmp_path / "no")}
    done = subprocess.run(
        [sys.executable, "-m", "slm_server", "reload"],
        env={**os.environ, **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1 and "is `backends` running?" in done.stderr
