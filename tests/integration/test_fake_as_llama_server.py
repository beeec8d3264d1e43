"""tests/fakes/fake-llama-server stands in for llama-server: it takes llama-server's
command line, scripts its start from the --model file, and runs under the launcher."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import yaml

from slm_server.launch.llama_argv import ModelFiles, native_argv
from tests import one_shot
from tests.processes import ROOT, free_port, pid_alive, poll, start_command
from tests.registry_entries import model_entry, registry_entry

FAKE_LLAMA_SERVER = ROOT / "tests" / "fakes" / "fake-llama-server"
HOST = "127.0.0.1"
CHAT = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
FAKE_ENV = {"FAKE_BACKEND_PYTHON": sys.executable}


@dataclass
class FakeProcess:
    popen: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def health(self) -> httpx.Response | None:
        """GET /health if this process answers on the port, else None."""
        try:
            response = one_shot.get(f"{self.url}/health", timeout=1.0)
        except httpx.TransportError:
            return None
        if response.headers.get("x-fake-pid") != str(self.popen.pid):
            raise AssertionError(f"port {self.port} is served by another process")
        return response

    def wait_serving(self, timeout: float = 15.0) -> httpx.Response:
        """The first /health answer (any status); fails if the process exits first."""
        answers: list[httpx.Response] = []

        def answered() -> bool:
            if self.popen.poll() is not None:
                raise AssertionError(f"fake exited with {self.popen.returncode}:\n{self.output()}")
            response = self.health()
            if response is not None:
                answers.append(response)
            return bool(answers)

        poll(answered, timeout, f"the fake to listen on port {self.port}")
        return answers[0]

    def wait_exit(self, timeout: float = 15.0) -> int:
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"fake still running after {timeout}s:\n{self.output()}") from None


def model_file(tmp_path: Path, content: Any = None, name: str = "model.gguf") -> Path:
    """A model file: empty (``None``), JSON (a dict) or raw bytes."""
    path = tmp_path / name
    if content is None:
        path.write_bytes(b"")
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(json.dumps(content))
    return path


@contextmanager
def fake_llama_server(
    tmp_path: Path, argv: list[str], port: int | None = None
) -> Iterator[FakeProcess]:
    """Run the fake-llama-server script with ``argv`` (own process group); always reaped."""
    port = free_port() if port is None else port
    log = tmp_path / f"fake-{port}.log"
    command = [str(FAKE_LLAMA_SERVER), *argv, "--host", HOST, "--port", str(port)]
    with log.open("wb") as handle:
        popen = subprocess.Popen(
            command,
            cwd=tmp_path,
            stdin=subprocess.DEVNULL,
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **FAKE_ENV},
        )
    try:
        yield FakeProcess(popen, port, log)
    finally:
        if popen.poll() is None:
            with suppress(ProcessLookupError):
                os.killpg(popen.pid, signal.SIGTERM)
            try:
                popen.wait(10)
            except subprocess.TimeoutExpired:
                with suppress(ProcessLookupError):
                    os.killpg(popen.pid, signal.SIGKILL)
                popen.wait()


def chat(url: str) -> httpx.Response:
    return one_shot.post(f"{url}/v1/chat/completions", json=CHAT, timeout=5.0)


def test_the_script_is_an_executable_shell_script() -> None:
    assert os.access(FAKE_LLAMA_SERVER, os.X_OK)
    assert FAKE_LLAMA_SERVER.read_text().startswith("#!/bin/sh\n")


def test_a_normal_start_serves_health_and_chat_under_the_alias(tmp_path: Path) -> None:
    model = model_file(tmp_path)
    with fake_llama_server(tmp_path, ["--model", str(model), "--alias", "fake-a"]) as fake:
        assert fake.wait_serving().status_code == 200
        response = chat(fake.url)
        assert response.status_code == 200
        assert response.json()["model"] == "fake-a"
        assert response.json()["choices"][0]["message"]["content"].startswith("fake reply")
        assert f"fake llama-server fake-a listening on {HOST}:{fake.port} pid {fake.popen.pid}" in (
            fake.output()
        )
        os.killpg(fake.popen.pid, signal.SIGTERM)
        assert fake.wait_exit() == 0


def test_every_flag_the_launcher_passes_is_accepted(tmp_path: Path) -> None:
    """The launcher's own argv for an entry using every llama.cpp option."""
    model = model_file(tmp_path, b"GGUF\x03\x00\x00\x00 not json \xff\xfe")
    entry = model_entry(
        "every-flag",
        1,  # the port, replaced below: the fixture appends --host/--port, last one wins
        model_path=str(model),
        default_timeout=5.0,
        quantization="Q8_0",
        model_type="embeddings",
        context_length=4096,
        max_concurrency=2,
        pooling="mean",
        chat_template_kwargs={"enable_thinking": False},
        temp=0.7,
        top_p=0.8,
        top_k=20,
        min_p=0.0,
        presence_penalty=-0.5,
        repetition_penalty=1.05,
        n_predict=-1,
        ubatch_size=512,
        cache_ram=-1,
        kv_offload=False,
        flash_attn=True,
        kv_unified=True,
        fit=False,
        cont_batching=True,
        cache_prompt=False,
        spec_type="ngram-simple",
        spec_draft_n_max=8,
        verbose=True,
    )
    files = ModelFiles(
        model=str(model),
        chat_template_file=str(tmp_path / "template.jinja"),
        mmproj=str(tmp_path / "mmproj.gguf"),
        draft_model=str(tmp_path / "draft.gguf"),
    )
    argv = native_argv(str(FAKE_LLAMA_SERVER), entry, files)[1:]
    assert {"--parallel", "--embedding", "--jinja", "--flash-attn", "--temp"} <= set(argv)
    with fake_llama_server(tmp_path, argv) as fake:
        assert fake.wait_serving().status_code == 200
        response = chat(fake.url)
        assert response.status_code == 200
        assert response.json()["model"] == "every-flag"
        assert "--chat-template-kwargs" in fake.output()  # listed among the ignored flags


def test_exit_at_start_exits_with_that_code_without_binding(tmp_path: Path) -> None:
    model = model_file(tmp_path, {"exit_at_start": 7})
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        # Holding the port: a fake that tried to bind would fail with exit code 1, not 7.
        holder.bind((HOST, 0))
        holder.listen()
        port = holder.getsockname()[1]
        with fake_llama_server(tmp_path, ["--model", str(model)], port=port) as fake:
            assert fake.wait_exit() == 7
    output = fake.output()
    assert "fake: exiting at start with code 7" in output
    assert "listening" not in output


def test_health_status_503_answers_503_until_scripted_otherwise(tmp_path: Path) -> None:
    model = model_file(tmp_path, {"health_status": 503})
    with fake_llama_server(tmp_path, ["--model", str(model), "--alias", "loading"]) as fake:
        assert fake.wait_serving().status_code == 503
        second = fake.health()
        assert second is not None and second.status_code == 503
        one_shot.post(f"{fake.url}/_control", json={}).raise_for_status()
        healthy = fake.health()
        assert healthy is not None and healthy.status_code == 200


def test_the_script_key_is_the_initial_script(tmp_path: Path) -> None:
    model = model_file(tmp_path, {"script": {"status": 500}})
    with fake_llama_server(tmp_path, ["--model", str(model)]) as fake:
        assert fake.wait_serving().status_code == 200
        assert chat(fake.url).status_code == 500


def test_exit_after_seconds_counts_from_the_first_healthy_answer(tmp_path: Path) -> None:
    model = model_file(tmp_path, {"exit_after_seconds": 0.3})
    with fake_llama_server(tmp_path, ["--model", str(model)]) as fake:
        assert fake.wait_serving().status_code == 200
        assert fake.wait_exit() == 1
    assert "fake: exiting 0.3s after becoming healthy with code 1" in fake.output()


def test_footprint_mb_is_resident_while_serving(tmp_path: Path) -> None:
    model = model_file(tmp_path, {"footprint_mb": 120})
    with fake_llama_server(tmp_path, ["--model", str(model)]) as fake:
        assert fake.wait_serving().status_code == 200
        resident = psutil.Process(fake.popen.pid).memory_info().rss >> 20
    assert resident >= 120, resident


def test_start_delay_seconds_comes_before_exit_at_start(tmp_path: Path) -> None:
    model = model_file(tmp_path, {"start_delay_seconds": 0.5, "exit_at_start": 7})
    started = time.monotonic()
    with fake_llama_server(tmp_path, ["--model", str(model)]) as fake:
        assert fake.wait_exit() == 7
    assert time.monotonic() - started >= 0.5


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ({"exit_at_start": 1, "typo": 2}, "unknown key(s) typo"),
        ({"script": {"no_such_field": 1}}, "bad script: unknown script field 'no_such_field'"),
        ({"exit_after_seconds": "soon"}, "'exit_after_seconds' must be a number >= 0"),
        ({"start_delay_seconds": -1}, "'start_delay_seconds' must be a number >= 0"),
        ({"footprint_mb": 1.5}, "'footprint_mb' must be an integer from 0 to 4096"),
        ({"footprint_mb": 5000}, "'footprint_mb' must be an integer from 0 to 4096"),
    ],
)
def test_a_bad_behaviour_file_exits_2(tmp_path: Path, content: Any, message: str) -> None:
    model = model_file(tmp_path, content)
    with fake_llama_server(tmp_path, ["--model", str(model)]) as fake:
        assert fake.wait_exit() == 2
    assert message in fake.output()


def test_a_missing_model_file_exits_1(tmp_path: Path) -> None:
    missing = tmp_path / "missing.gguf"
    with fake_llama_server(tmp_path, ["--model", str(missing)]) as fake:
        assert fake.wait_exit() == 1
    assert f"failed to load model '{missing}'" in fake.output()


def test_no_model_flag_is_a_usage_error(tmp_path: Path) -> None:
    with fake_llama_server(tmp_path, ["--alias", "x"]) as fake:
        assert fake.wait_exit() == 2
    assert "the following arguments are required: --model" in fake.output()


def test_the_launcher_runs_the_fake_as_its_llama_server(tmp_path: Path) -> None:
    port = free_port()
    model = model_file(tmp_path, name="a.gguf")
    registry = {
        "models": {
            "standard": registry_entry("fake-a", port, model_path=str(model), default_timeout=5)
        }
    }
    config = tmp_path / "models.yaml"
    config.write_text(yaml.safe_dump(registry, sort_keys=False))
    logs = tmp_path / "logs"
    env = {
        **FAKE_ENV,
        "SLM_CONFIG": str(config),
        "SLM_BACKEND_LOG_DIR": str(logs),
        "SLM_LLAMA_SERVER_BIN": str(FAKE_LLAMA_SERVER),
        "SLM_ENV_FILE": str(tmp_path / "none"),
        "SLM_STOP_TIMEOUT_SECONDS": "5",
    }
    launcher = start_command("backends", env, tmp_path / "backends.out")

    def backend() -> dict[str, Any]:
        try:
            data = json.loads((logs / "backends.state.json").read_text())
        except (OSError, ValueError):
            return {}
        found: list[dict[str, Any]] = data.get("backends", [])
        return found[0] if found else {}

    try:
        poll(
            lambda: (
                backend().get("state") in ("ready", "failed") or launcher.popen.poll() is not None
            ),
            30,
            "the fake backend to be ready",
        )
        state = backend()
        assert state.get("state") == "ready", f"{state}\n{launcher.text()}"
        pid = state["pid"]
        assert pid_alive(pid)
        response = chat(f"http://{HOST}:{port}")
        assert response.status_code == 200
        assert response.json()["model"] == "fake-a"
        log = Path(state["log_path"]).read_text()
        assert f"fake llama-server fake-a listening on {HOST}:{port} pid {pid}" in log
    finally:
        code = launcher.stop(signal.SIGTERM)
    assert code == 0, launcher.text()
    poll(lambda: not pid_alive(pid), 15, "the fake backend to exit")
    assert backend().get("state") == "stopped"
