"""Remote engines on real processes: a ``backend: remote`` entry pointing at a fake
backend the test starts itself (the supervisor starts nothing for it), another
slm_server router, and a real llama-server. Each is served with its key and its own
model name; the fake is ejected after confirmed failures and never after 400s or a
forged request, re-admitted once it answers again; a model with a local replica and
a remote one keeps serving from the local one meanwhile."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from slm_server.contracts.restart_requests import RestartRequest, write_request
from tests import one_shot
from tests.fakes.control import FakeBackend
from tests.integration.real_stack import example_registry, llama_server_bin
from tests.integration.watched import Watched, fake_entry, watched
from tests.processes import ROOT, free_port, http_ok, poll

KEY_ENV = "SLM_TEST_REMOTE_KEY"
KEY = "sk-test-3f9a1c7e-never-logged"
FAST_EJECTION = {
    KEY_ENV: KEY,
    "SLM_REMOTE_EJECT_BASE_SECONDS": "1",
    "SLM_REMOTE_EJECT_MAX_SECONDS": "4",
    "SLM_WATCHDOG_CONFIRM_SECONDS": "3",
}


def remote_entry(url: str, **fields: Any) -> dict[str, Any]:
    return {
        "id": "far-chat",
        "backend": "remote",
        "url": f"{url}/v1",
        "api_key_env": KEY_ENV,
        "remote_model": "upstream-name",
        "default_timeout": 5,
        **fields,
    }


@pytest.fixture
def far() -> Iterator[FakeBackend]:
    with FakeBackend.start(model_id="upstream-name") as fake:
        yield fake


def chat(stack: Watched, model: str = "far-chat") -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    return one_shot.post(f"{stack.url}/v1/chat/completions", json=body, timeout=15)


def chats(fake: FakeBackend) -> list[dict[str, Any]]:
    return [r for r in fake.requests() if r["path"] == "/v1/chat/completions"]


def assert_key_never_logged(stack: Watched) -> None:
    for path in [*stack.tmp.rglob("*.out"), *stack.log_dir.rglob("*")]:
        if path.is_file():
            assert KEY not in path.read_text(errors="replace"), path


@contextmanager
def remote_stack(tmp: Path, models: dict[str, dict[str, Any]], **env: str) -> Iterator[Watched]:
    with watched(tmp, models, router=True, wait_ready=True, **{**FAST_EJECTION, **env}) as stack:
        yield stack
        assert_key_never_logged(stack)


def test_a_remote_is_served_with_its_key_and_its_own_model_name(
    tmp_path: Path, far: FakeBackend
) -> None:
    with remote_stack(tmp_path, {"far": remote_entry(far.url)}) as stack:
        answer = chat(stack)
        assert answer.status_code == 200, answer.text
        (sent,) = chats(far)
        assert sent["headers"]["authorization"] == f"Bearer {KEY}"
        assert sent["body"]["model"] == "upstream-name"
        state = stack.state("far")
        assert (state["state"], state["pid"], state["url"]) == ("ready", None, f"{far.url}/v1")
        listed = one_shot.get(f"{stack.url}/v1/models", timeout=5).json()["data"]
        assert [(m["id"], m["backend"], m["port"]) for m in listed] == [
            ("far-chat", "remote", None)
        ]
        status = listed[0]["status"]
        assert (status["state"], status["url"], status["ejected_until"]) == (
            "ready",
            f"{far.url}/v1",
            None,
        )
        health = one_shot.get(f"{stack.url}/v1/backends/health", timeout=5).json()["far"]
        assert (health["status"], health["state"], health["url"]) == (
            "healthy",
            "ready",
            f"{far.url}/v1",
        )
        assert "pid" not in health and "restart_budget" not in health
        probes = [r for r in far.requests() if r["path"] == "/v1/models"]
        assert probes and probes[-1]["headers"]["authorization"] == f"Bearer {KEY}"
        metrics = one_shot.get(f"{stack.url}/metrics", timeout=5).text
        assert 'slm_backend_state{model="far-chat",replica="1",role="far",state="ready"} 1.0' in (
            metrics
        )
        table = subprocess.run(
            [sys.executable, "-m", "slm_server", "status"],
            env={**os.environ, **stack.env},
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert f"{far.url}/v1" in table.stdout and "ready" in table.stdout, table.stdout


def test_400s_never_eject_a_remote_and_confirmed_5xx_do_until_it_answers_again(
    tmp_path: Path, far: FakeBackend
) -> None:
    with remote_stack(tmp_path, {"far": remote_entry(far.url)}) as stack:
        far.script(status=400, paths=["/v1/chat/completions"])
        for _ in range(6):
            assert chat(stack).status_code == 400
        assert stack.events("backend_failure") == stack.events("restart_requested") == []
        far.script(status=500, paths=["/v1/chat/completions"])
        poll(
            lambda: chat(stack).status_code == 503 and stack.state("far")["state"] == "ejected",
            15,
            "the remote to be ejected",
        )
        ejected = stack.wait_event("remote_ejected", role="far")
        assert (ejected["rule"], ejected["seconds"], ejected["ejections"]) == ("canary_5xx", 1, 1)
        refused = chat(stack)
        assert refused.status_code == 503
        assert float(refused.headers["retry-after"]) >= 1
        assert refused.json()["error"]["code"] == "backend_ejected"
        health = one_shot.get(f"{stack.url}/v1/backends/health", timeout=5).json()["far"]
        assert health["state"] == "ejected" and health["ejected_until"] > 0
        metrics = one_shot.get(f"{stack.url}/metrics", timeout=5).text
        ejected_line = 'slm_backend_state{model="far-chat",replica="1",role="far",state="ejected"}'
        assert f"{ejected_line} 1.0" in metrics
        # Still failing when the second wait is over: ejected again, for twice as long.
        again = stack.wait_event("remote_ejected", ejections=2)
        assert again["seconds"] == 2 and again["reason"].startswith("re-admission probe failed")
        far.script()
        readmitted = stack.wait_event("remote_readmitted", timeout=20)
        assert readmitted["role"] == "far"
        poll(lambda: chat(stack).status_code == 200, 10, "the remote to serve again")


def test_a_forged_request_never_ejects_a_healthy_remote(tmp_path: Path, far: FakeBackend) -> None:
    with remote_stack(tmp_path, {"far": remote_entry(far.url)}) as stack:
        entry = stack.state("far")
        forged = RestartRequest(
            role="far",
            model_id="far-chat",
            port=entry["port"],
            reason="5xx",
            requested_at=2e9,
            detail="forged",
        )
        write_request(tmp_path / "logs" / "watchdog-requests", forged)
        refused = stack.wait_event("restart_not_confirmed", role="far")
        assert refused["rule"] == "canary_ok"
        assert stack.events("remote_ejected") == []
        assert stack.state("far")["state"] == "ready"
        assert chat(stack).status_code == 200


def test_a_mixed_model_serves_from_its_local_replica_while_the_remote_is_ejected(
    tmp_path: Path, far: FakeBackend
) -> None:
    local = fake_entry(tmp_path, "chat")
    models = {"chat": local, "far": remote_entry(far.url, id="fake-chat", replica_of="chat")}
    # Ejected for a minute, longer than the test: with the fast one-second ejection, six
    # requests on a loaded machine outlasted it and the trial request after it reached
    # the remote again, as it should.
    with remote_stack(tmp_path, models, SLM_REMOTE_EJECT_BASE_SECONDS="60") as stack:
        replicas = one_shot.get(f"{stack.url}/v1/models", timeout=5).json()["data"]
        assert [r["role"] for r in replicas[0]["status"]["replicas"]] == ["chat", "far"]
        for _ in range(4):
            assert chat(stack, "fake-chat").status_code == 200
        assert chats(far), "the remote replica had its share"
        far.script(status=500, paths=["/v1/chat/completions"])
        poll(
            lambda: (
                chat(stack, "fake-chat") is not None
                and stack.state("far").get("state") == "ejected"
            ),
            20,
            "the remote replica to be ejected",
        )
        # The router reads the state file at most every 20 ms: a request sent before it
        # sees the ejection still goes to the remote.
        stack.wait_state("far", "ejected")
        before = len(chats(far))
        answers = [chat(stack, "fake-chat").status_code for _ in range(6)]
        assert answers == [200] * 6
        assert len(chats(far)) == before


def test_another_slm_server_is_a_remote_and_gets_the_key_its_door_asks_for(
    tmp_path: Path,
) -> None:
    (tmp_path / "far").mkdir()
    (tmp_path / "near").mkdir()
    far_models = {"chat": fake_entry(tmp_path / "far", "chat")}
    with watched(tmp_path / "far", far_models, SLM_API_KEYS=KEY) as far:
        body = {"model": "fake-chat", "messages": [{"role": "user", "content": "hi"}]}
        keyless = one_shot.post(f"{far.url}/v1/chat/completions", json=body, timeout=10)
        assert keyless.status_code == 401
        near_models = {
            "far": remote_entry(far.url, remote_model="fake-chat"),
            "wrong": remote_entry(far.url, id="far-wrong", remote_model="no-such-model"),
        }
        with remote_stack(tmp_path / "near", near_models) as near:
            answer = chat(near)
            assert answer.status_code == 200, answer.text
            assert answer.json()["model"] == "fake-chat"
            health = one_shot.get(f"{near.url}/v1/backends/health", timeout=5).json()["far"]
            assert (health["status"], health["state"]) == ("healthy", "ready")
            # The far gateway's own 404 (a model it does not know) is a client error
            # here too: it never counts, so it never ejects.
            for _ in range(4):
                assert chat(near, "far-wrong").status_code == 404
            assert near.events("backend_failure") == near.events("remote_ejected") == []
            assert chat(near).status_code == 200
        assert_key_never_logged(far)


@contextmanager
def real_llama_server(port: int, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A llama-server on ``port``, asking for the key, started by the test."""
    registry = example_registry({"standard": 0, "gemma": 0, "embeddings": 0}, roles=("standard",))
    model = str(ROOT / registry["models"]["standard"]["model_path"])
    command = [llama_server_bin(), "-m", model, "--host", "127.0.0.1", "--port", str(port)]
    command += ["--api-key", KEY, "--ctx-size", "2048", "--parallel", "1"]
    with log.open("ab") as out:
        server = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    try:
        poll(
            lambda: http_ok(f"http://127.0.0.1:{port}/health") or server.poll() is not None,
            60,
            "llama-server to load",
        )
        assert server.poll() is None, log.read_text(errors="replace")
        yield server
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(15)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait(5)


@pytest.mark.real_model
def test_a_real_llama_server_elsewhere_is_served_ejected_when_gone_and_readmitted(
    tmp_path: Path,
) -> None:
    port = free_port()
    log = tmp_path / "llama-server.log"
    url = f"http://127.0.0.1:{port}"
    models = {"far": remote_entry(url, remote_model="anything", default_timeout=60)}
    with real_llama_server(port, log) as server:
        keyless = one_shot.get(f"{url}/v1/models", timeout=10)
        assert keyless.status_code == 401  # so a 200 below means the key arrived
        with remote_stack(tmp_path, models) as stack:
            answer = chat(stack)
            assert answer.status_code == 200, answer.text
            server.send_signal(signal.SIGKILL)
            server.wait(10)
            poll(
                lambda: chat(stack).status_code == 503 and stack.state("far")["state"] == "ejected",
                20,
                "the gone llama-server to be ejected",
            )
            ejected = stack.wait_event("remote_ejected", role="far")
            assert ejected["rule"] == "remote_probe_failed"
            with real_llama_server(port, log):
                stack.wait_event("remote_readmitted", timeout=30)
                poll(lambda: chat(stack).status_code == 200, 30, "an answer after re-admission")
