"""Prompt caches kept across an unload and a load, on the real launcher and router with
fake llama-servers (which save and restore slots as llama-server does, in a small file
format of their own that a restore checks): saved on the way out, restored before the
load is published, private on disk, never trusted when forged or corrupt, bounded, and
never saved for a backend the watchdog stops. With the real llama-server:
``test_slot_cache_real.py``."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from tests import one_shot
from tests.integration.watched import Watched, fake_entry, watched
from tests.processes import ROOT, pid_alive, poll

HELLO = [{"role": "user", "content": "hello, keep this conversation for later"}]


@contextmanager
def gateway(tmp: Path, models: dict[str, Any], **env: str) -> Iterator[Watched]:
    settings = {"SLM_MEMORY_BUDGET_MB": "100000", **env}
    with watched(tmp, models, router=True, wait_ready=True, **settings) as stack:
        yield stack


def lazy(tmp: Path, role: str = "lazy", **fields: Any) -> dict[str, Any]:
    return fake_entry(tmp, role, load="on_demand", **fields)


def chat(stack: Watched, model_id: str) -> httpx.Response:
    body = {"model": model_id, "messages": HELLO}
    return one_shot.post(f"{stack.url}/v1/chat/completions", json=body, timeout=20)


def api(stack: Watched, op: str, model_id: str) -> httpx.Response:
    answer = one_shot.post(f"{stack.url}/v1/models/{op}", json={"model": model_id}, timeout=20)
    assert answer.status_code == 200, answer.text
    return answer


def slot_dir(stack: Watched) -> Path:
    return stack.tmp / "slots"  # tests.processes.start_command's SLM_SLOT_CACHE_DIR


def names(stack: Watched) -> list[str]:
    return sorted(os.listdir(slot_dir(stack)))


def saved_once(stack: Watched, model_id: str, role: str = "lazy") -> dict[str, Any]:
    """Load ``role`` with a request, unload it: its slot is saved (event returned)."""
    assert chat(stack, model_id).status_code == 200
    api(stack, "unload", model_id)
    return stack.wait_event("cache_saved", role=role)


def test_an_unload_saves_the_slots_and_the_next_load_restores_them_before_ready(
    tmp_path: Path,
) -> None:
    models = {"lazy": lazy(tmp_path)}
    with gateway(tmp_path, models) as stack:
        model_id = stack.model_id("lazy")
        assert stack.state("lazy")["slot_cache_tokens"] == 0
        saved = saved_once(stack, model_id)
        assert saved["slots"] == 1 and saved["tokens"] > 0 and saved["bytes"] > 0
        folder = slot_dir(stack)
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        files = names(stack)
        assert len(files) == 2 and files[0].endswith(".json") and files[1].endswith(".bin")
        for name in files:  # a slot holds the text of its prompts
            assert stat.S_IMODE((folder / name).stat().st_mode) == 0o600
        assert stack.state("lazy")["slot_cache_tokens"] == saved["tokens"]
        listed = one_shot.get(f"{stack.url}/v1/models/{model_id}", timeout=5).json()
        assert listed["status"]["slot_cache"] == {"tokens": saved["tokens"], "skip": None}

        api(stack, "load", model_id)
        restored = stack.wait_event("cache_restored", role="lazy")
        assert (restored["slots"], restored["tokens"]) == (1, saved["tokens"])
        # The load is published ready at the supervisor's next turn after the restore:
        # wait for that second backend_loaded before reading the order.
        poll(
            lambda: len(stack.events("backend_loaded")) >= 2,
            15,
            "the second load to be published ready",
        )
        order = [e["event"] for e in stack.events() if e.get("role") == "lazy"]
        assert order.index("cache_restored") < len(order) - 1 - order[::-1].index(
            "backend_loaded"
        ), "restored before the load is published ready"
        assert chat(stack, model_id).status_code == 200
        # The router never lets a client at the slot API.
        forged = one_shot.post(
            f"{stack.url}/slots/0?action=restore", json={"filename": files[1]}, timeout=5
        )
        assert forged.status_code in (404, 405), forged.text


def forge(stack: Watched, how: str) -> None:
    """Spoil the one saved set in a way a restore must refuse."""
    folder = slot_dir(stack)
    [manifest] = [folder / n for n in names(stack) if n.endswith(".json")]
    [slot] = [folder / n for n in names(stack) if n.endswith(".bin")]
    if how == "garbage":  # same size, not a slot: only the server can tell
        slot.write_bytes(b"\x00" * slot.stat().st_size)
    elif how == "truncated":
        slot.write_bytes(slot.read_bytes()[:3])
    elif how == "symlink":
        target = stack.tmp / "elsewhere.bin"
        target.write_bytes(slot.read_bytes())
        slot.unlink()
        slot.symlink_to(target)
    elif how == "other_key":
        data = json.loads(manifest.read_text())
        data["key"] = "0" * len(data["key"])
        manifest.write_text(json.dumps(data))
    elif how == "not_json":
        manifest.write_text("{" * 100_000)
    else:  # a slot this server does not have
        data = json.loads(manifest.read_text())
        data["slots"][0]["slot"] = 7
        manifest.write_text(json.dumps(data))


@pytest.mark.parametrize(
    "how", ["garbage", "truncated", "symlink", "other_key", "not_json", "slot_out_of_range"]
)
def test_a_spoilt_or_forged_set_is_refused_and_the_load_goes_on(tmp_path: Path, how: str) -> None:
    models = {"lazy": lazy(tmp_path)}
    with gateway(tmp_path, models) as stack:
        model_id = stack.model_id("lazy")
        saved_once(stack, model_id)
        forge(stack, how)
        api(stack, "load", model_id)
        rejected = stack.wait_event("cache_rejected", role="lazy")
        assert rejected["reason"]
        assert stack.events("cache_restored") == []
        assert names(stack) == []  # never tried again
        assert stack.state("lazy")["state"] == "ready"
        assert chat(stack, model_id).status_code == 200
        assert stack.events("restart_started") == []


def test_a_backend_the_watchdog_restarts_saves_nothing_and_comes_back_from_the_last_set(
    tmp_path: Path,
) -> None:
    """Killed: nothing to ask. Wedged (SIGSTOP, caught by the stall): its state is
    never saved, and the restart does not wait on it. Each restart restores the set
    the last unload saved."""
    models = {"lazy": lazy(tmp_path, default_timeout=2)}
    with gateway(tmp_path, models) as stack:
        model_id = stack.model_id("lazy")
        saved = saved_once(stack, model_id)
        api(stack, "load", model_id)
        stack.wait_event("cache_restored", role="lazy")

        killed = stack.pid("lazy")
        os.kill(killed, signal.SIGKILL)
        stack.wait_event("restart_succeeded", old_pid=killed)
        assert len(stack.events("cache_restored")) == 2

        stack.past_startup_grace("lazy")
        wedged = stack.pid("lazy")
        os.kill(wedged, signal.SIGSTOP)
        body = {"model": model_id, "messages": HELLO, "stream": True}
        started = time.monotonic()
        with one_shot.stream("POST", f"{stack.url}/v1/chat/completions", json=body, timeout=30):
            pass
        done = stack.wait_event("restart_succeeded", old_pid=wedged)
        assert time.monotonic() - started < 15
        assert not pid_alive(wedged)
        poll(lambda: len(stack.events("cache_restored")) == 3, 5, "the third restore")
        assert stack.events("cache_saved") == [saved]
        assert stack.events("cache_save_failed") == []
        assert done["reason"] == "stall"


def test_the_disk_budget_holds_and_a_model_keeps_one_set(tmp_path: Path) -> None:
    models = {"lazy": lazy(tmp_path), "other": lazy(tmp_path, "other")}
    with gateway(tmp_path, models, SLM_SLOT_CACHE_MB="0") as stack:
        assert chat(stack, stack.model_id("lazy")).status_code == 200
        api(stack, "unload", stack.model_id("lazy"))
        failed = stack.wait_event("cache_save_failed", role="lazy")
        assert "SLM_SLOT_CACHE_MB=0" in failed["reason"]
        assert names(stack) == []
        assert stack.state("lazy")["slot_cache_tokens"] == 0

    (tmp_path / "logs" / "watchdog.jsonl").unlink()
    with gateway(tmp_path, models) as stack:
        first = saved_once(stack, stack.model_id("lazy"))
        other = saved_once(stack, stack.model_id("other"), "other")
        assert len(names(stack)) == 4  # two sets: one per model
        # The same model saved again replaces its set (same launch, same key).
        api(stack, "load", stack.model_id("lazy"))
        api(stack, "unload", stack.model_id("lazy"))
        poll(lambda: len(stack.events("cache_saved")) == 3, 10, "a second save of lazy")
        assert len(names(stack)) == 4
        assert first["tokens"] and other["tokens"]


def test_a_changed_launch_does_not_restore_and_its_first_save_replaces_the_old_set(
    tmp_path: Path,
) -> None:
    models = {"lazy": lazy(tmp_path)}
    with gateway(tmp_path, models) as stack:
        model_id = stack.model_id("lazy")
        saved_once(stack, model_id)
        [old_manifest] = [n for n in names(stack) if n.endswith(".json")]
        changed = {**models, "lazy": {**models["lazy"], "context_length": 2048}}
        (tmp_path / "models.yaml").write_text(json.dumps({"models": changed}))
        reload = one_shot.post(f"{stack.url}/v1/config/reload", json={}, timeout=30)
        assert reload.status_code == 200, reload.text
        assert reload.json()["replaced"] == ["lazy"]
        poll(lambda: stack.state("lazy")["slot_cache_tokens"] == 0, 10, "the new key's count")
        assert chat(stack, model_id).status_code == 200
        assert stack.events("cache_restored") == []  # another layout: not this cache
        api(stack, "unload", model_id)
        second = [e for e in stack.events("cache_saved")]
        poll(lambda: len(stack.events("cache_saved")) == 2, 10, "the new launch's save")
        latest = stack.events("cache_saved")[-1]
        assert latest["dropped"] == [old_manifest.removesuffix(".json")], second
        assert old_manifest not in names(stack) and len(names(stack)) == 2


@pytest.mark.parametrize("how", ["entry", "setting"])
def test_turned_off_per_model_or_for_all_nothing_is_saved(tmp_path: Path, how: str) -> None:
    fields: dict[str, Any] = {"slot_cache": False} if how == "entry" else {}
    env = {"SLM_SLOT_CACHE": "false"} if how == "setting" else {}
    models = {"lazy": lazy(tmp_path, **fields)}
    with gateway(tmp_path, models, **env) as stack:
        model_id = stack.model_id("lazy")
        assert chat(stack, model_id).status_code == 200
        argv = psutil.Process(stack.pid("lazy")).cmdline()
        assert "--slot-save-path" not in argv
        state = stack.state("lazy")
        assert state["slot_cache_tokens"] is None
        assert state["slot_cache_skip"].startswith("turned off")
        api(stack, "unload", model_id)
        assert stack.events("cache_saved") == [] and stack.events("cache_save_failed") == []


def test_clear_slots_removes_every_saved_set(tmp_path: Path) -> None:
    models = {"lazy": lazy(tmp_path)}
    with gateway(tmp_path, models) as stack:
        saved_once(stack, stack.model_id("lazy"))
        (slot_dir(stack) / "notes.txt").write_text("not ours: left alone")
        done = subprocess.run(
            [sys.executable, "-m", "slm_server", "clear-slots"],
            env={**os.environ, **stack.env, "SLM_SLOT_CACHE_DIR": str(slot_dir(stack))},
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert "2 file(s) removed" in done.stdout
        assert names(stack) == ["notes.txt"]
        api(stack, "load", stack.model_id("lazy"))
        assert stack.events("cache_restored") == [] and stack.events("cache_rejected") == []
