"""``./start.sh``, the README's first command, end to end: it brings up the backends and
the router, every default model answers through the router, and Ctrl-C leaves no
backend process behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import httpx
import pytest
import yaml

from tests import one_shot
from tests.integration.real_stack import example_registry, llama_server_bin
from tests.processes import ROOT, free_port, pid_alive, poll

pytestmark = pytest.mark.real_model


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_start_sh_serves_every_default_model_and_ctrl_c_stops_everything(
    tmp_path: Path,
) -> None:
    data = yaml.safe_load((ROOT / "config" / "models.yaml.example").read_text())
    registry = example_registry({role: free_port() for role in data["models"]})
    config = tmp_path / "models.yaml"
    config.write_text(yaml.safe_dump(registry, sort_keys=False))
    router_port = free_port()
    env = {
        **os.environ,
        "SLM_CONFIG": str(config),
        "SLM_ROUTER_PORT": str(router_port),
        "SLM_BACKEND_LOG_DIR": str(tmp_path / "logs"),
        "SLM_ENV_FILE": str(tmp_path / "env"),
        "SLM_LLAMA_SERVER_BIN": llama_server_bin(),
        "SLM_SLOT_CACHE_DIR": str(tmp_path / "slots"),  # not the home's, shared by runs
    }
    output = tmp_path / "start.out"
    with output.open("wb") as sink:
        start = subprocess.Popen(
            ["bash", "start.sh"],
            cwd=ROOT,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            # A terminal's Ctrl-C finds SIGINT at its default. Started from a shell's
            # background job, pytest (and so start.sh) would inherit it ignored, and
            # bash cannot trap a signal ignored on entry: its INT trap would never run.
            preexec_fn=_default_sigint,
        )
    try:
        poll(
            lambda: "[start] press Ctrl-C" in output.read_text() or start.poll() is not None,
            300,
            "start.sh to report ready",
        )
        text = output.read_text()
        assert start.poll() is None, text
        url = f"http://127.0.0.1:{router_port}"
        for model in registry["models"].values():
            assert f"model {model['id']}" in text
            if model.get("model_type") == "embeddings":
                body = {"model": model["id"], "input": "hello"}
                reply = one_shot.post(f"{url}/v1/embeddings", json=body, timeout=60).json()
                assert reply["data"][0]["embedding"]
            else:
                body = {
                    "model": model["id"],
                    "messages": [{"role": "user", "content": "Hi"}],
                    "max_tokens": 12,
                }
                reply = one_shot.post(f"{url}/v1/chat/completions", json=body, timeout=60).json()
                assert reply["choices"][0]["message"]["content"]
        state = json.loads((tmp_path / "logs" / "backends.state.json").read_text())
        pids = [b["pid"] for b in state["backends"]]
        assert len(pids) == 3
        assert all(pid_alive(pid) for pid in pids)
        assert (tmp_path / "logs" / "start.out").read_text().count("[start] ready:") == 1
    finally:
        # Ctrl-C in a terminal signals the whole foreground process group.
        os.killpg(start.pid, signal.SIGINT)
        try:
            status = start.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(start.pid, signal.SIGKILL)  # the failure leaves nothing running
            start.wait()
            raise
    assert status == 130, output.read_text()[-3000:]
    poll(lambda: not any(pid_alive(pid) for pid in pids), 15, "every backend to exit")
    with pytest.raises(httpx.ConnectError):
        one_shot.get(f"{url}/health", timeout=2)
    assert "[start] stopped" in output.read_text()


def test_start_sh_exits_non_zero_when_nothing_can_start(tmp_path: Path) -> None:
    registry = example_registry(
        {"standard": free_port(), "gemma": 0, "embeddings": 0}, roles=("standard",)
    )
    registry["models"]["standard"]["model_path"] = str(tmp_path / "gone.gguf")
    config = tmp_path / "models.yaml"
    config.write_text(yaml.safe_dump(registry, sort_keys=False))
    env = {
        **os.environ,
        "SLM_CONFIG": str(config),
        "SLM_ROUTER_PORT": str(free_port()),
        "SLM_BACKEND_LOG_DIR": str(tmp_path / "logs"),
        "SLM_ENV_FILE": str(tmp_path / "env"),
        "SLM_LLAMA_SERVER_BIN": llama_server_bin(),
    }
    result = subprocess.run(
        ["bash", "start.sh"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=300,
        check=False,
    )
    assert result.returncode == 1
    assert "gone.gguf does not exist" in result.stdout
    assert "model_path_missing" in result.stdout
    assert "no backend could start" in result.stdout
