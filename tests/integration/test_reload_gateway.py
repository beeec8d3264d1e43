"""Reloading the registry (issue 32) end to end: the real launcher and the real router
on fake llama-servers (and once on the real llama-server with the default models).
Requests run throughout; every one must end as it should, and what the reload did is
checked by pid, port and ``/v1/models``."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import yaml

from tests import one_shot
from tests.integration.real_stack import example_registry, llama_server_bin
from tests.integration.watched import Watched, fake_entry, watched
from tests.processes import free_port, pid_alive, poll

HELLO = [{"role": "user", "content": "hello"}]


def write_registry(stack: Watched, models: dict[str, dict[str, Any]]) -> None:
    Path(stack.env["SLM_CONFIG"]).write_text(yaml.safe_dump({"models": models}, sort_keys=False))
    stack.models = models


def reload(stack: Watched) -> httpx.Response:
    return one_shot.post(f"{stack.url}/v1/config/reload", timeout=60)


def model_ids(stack: Watched) -> set[str]:
    data = one_shot.get(f"{stack.url}/v1/models", timeout=10).json()["data"]
    return {m["id"] for m in data}


def chat(stack: Watched, model: str, timeout: float = 30.0) -> httpx.Response:
    body = {"model": model, "messages": HELLO, "max_tokens": 8}
    return one_shot.post(f"{stack.url}/v1/chat/completions", json=body, timeout=timeout)


@contextmanager
def load(stack: Watched, models: list[str]) -> Iterator[list[str]]:
    """One client per model sending requests back to back until the block ends; yields
    the failures (each a line), which stay empty when every request succeeded."""
    failures: list[str] = []
    sent = [0]
    stop = threading.Event()

    def client(model: str) -> None:
        with httpx.Client(trust_env=False, timeout=30) as http:
            while not stop.is_set():
                body = {"model": model, "messages": HELLO, "max_tokens": 8}
                try:
                    reply = http.post(f"{stack.url}/v1/chat/completions", json=body)
                    if reply.status_code != 200:
                        failures.append(f"{model}: {reply.status_code} {reply.text[:200]}")
                except httpx.HTTPError as exc:
                    failures.append(f"{model}: {exc!r}")
                sent[0] += 1

    threads = [threading.Thread(target=client, args=(m,), daemon=True) for m in models]
    for thread in threads:
        thread.start()
    try:
        poll(lambda: sent[0] >= 2 * len(models), 20, "the load to run")
        yield failures
        seen = sent[0]
        poll(lambda: sent[0] >= seen + 2 * len(models), 20, "the load to go on after")
    finally:
        stop.set()
        for thread in threads:
            thread.join(40)


def test_a_reload_under_load_loses_no_request_and_restarts_only_what_changed(
    tmp_path: Path,
) -> None:
    models = {
        "keep": fake_entry(tmp_path, "keep"),
        "change": fake_entry(tmp_path, "change"),
        "drop": fake_entry(tmp_path, "drop"),
    }
    with watched(tmp_path, models, router=True, SLM_DRAIN_TIMEOUT_SECONDS="20") as stack:
        keep, change = stack.model_id("keep"), stack.model_id("change")
        kept, old = stack.pid("keep"), stack.pid("change")
        new = {
            "keep": {**models["keep"], "max_queue": 32, "default_timeout": 9},  # router only
            "change": {**models["change"], "context_length": 1024},
            "add": fake_entry(tmp_path, "add"),
        }
        with load(stack, [keep, change]) as failures:
            write_registry(stack, new)
            answer = reload(stack)
            assert answer.status_code == 200, answer.text
            body = answer.json()
            assert body["object"] == "registry.reload"
            assert (body["added"], body["removed"], body["replaced"], body["unchanged"]) == (
                ["add"],
                ["drop"],
                ["change"],
                ["keep"],
            )
            # Routed by the new registry as soon as the reload answered: the added model
            # is waited for, not refused, and the removed one is gone.
            assert chat(stack, stack.model_id("add")).status_code == 200
            assert model_ids(stack) >= {keep, change, stack.model_id("add")}
            assert "fake-drop" not in model_ids(stack)
            assert chat(stack, "fake-drop").status_code == 404
            stack.wait_ready("change")
        assert failures == []
        assert stack.pid("keep") == kept
        assert stack.pid("change") != old
        assert stack.state("change")["port"] == models["change"]["port"]
        poll(lambda: not pid_alive(old), 20, "the replaced process to stop")
        retired = {e["role"]: e["ended"] for e in stack.events("backend_retired")}
        assert retired == {"change": "drained", "drop": "drained"}
        health = one_shot.get(f"{stack.url}/v1/backends/health", timeout=10)
        assert health.headers["x-registry-generation"] == "2"
        assert "keep" in health.json() and "drop" not in health.json()
        registry = one_shot.get(f"{stack.url}/health", timeout=10).json()["registry"]
        assert registry["generation"] == 2
        assert registry["version"] == health.headers["x-registry-version"]
        assert stack.events("restart_started") == []


def test_streams_in_flight_on_removed_and_replaced_entries_complete(tmp_path: Path) -> None:
    models = {"change": fake_entry(tmp_path, "change"), "drop": fake_entry(tmp_path, "drop")}
    with watched(tmp_path, models, router=True, SLM_DRAIN_TIMEOUT_SECONDS="30") as stack:
        for role in models:
            stack.control(role, chunks=12, chunk_interval_seconds=0.25)
        bodies: dict[str, list[str]] = {}

        def stream(role: str) -> None:
            body = {"model": stack.model_id(role), "messages": HELLO, "stream": True}
            with (
                httpx.Client(trust_env=False, timeout=60) as http,
                http.stream("POST", f"{stack.url}/v1/chat/completions", json=body) as reply,
            ):
                bodies[role] = [str(reply.status_code), *reply.iter_lines()]

        threads = [threading.Thread(target=stream, args=(r,)) for r in models]
        for thread in threads:
            thread.start()
        old = {role: stack.pid(role) for role in models}

        def received(role: str) -> bool:
            url = f"http://127.0.0.1:{stack.port(role)}/_requests"
            return bool(one_shot.get(url, timeout=5).json())

        # Both streams are running on the old processes when the reload comes.
        poll(lambda: all(received(r) for r in models), 10, "both streams to start")
        write_registry(stack, {"change": {**models["change"], "context_length": 1024}})
        assert reload(stack).status_code == 200
        for thread in threads:
            thread.join(60)
        for role in models:
            lines = bodies[role]
            assert lines[0] == "200" and "data: [DONE]" in lines, lines[-3:]
            content = [x for x in lines if '"content":"tok "' in x]
            assert len(content) == 12, lines
        # The router told the supervisor once each stream ended: no one waited 30 s.
        for role in models:
            event = stack.wait_event("backend_retired", role=role)
            assert event["ended"] == "drained" and event["seconds"] < 20, event
            assert not pid_alive(old[role])
        stack.wait_ready("change")
        assert chat(stack, stack.model_id("change")).status_code == 200


def test_the_endpoint_refuses_an_invalid_registry_and_changes_nothing(tmp_path: Path) -> None:
    models = {"a": fake_entry(tmp_path, "a")}
    with watched(tmp_path, models, router=True) as stack:
        pid = stack.pid("a")
        bad = {
            "a": {**models["a"], "colour": "blue"},
            "b": fake_entry(tmp_path, "b", port=models["a"]["port"]),
        }
        write_registry(stack, bad)
        answer = reload(stack)
        assert answer.status_code == 400
        error = answer.json()["error"]
        assert error["code"] == "registry_invalid" and error["type"] == "invalid_request_error"
        problems = error["problems"]
        assert any("colour" in p for p in problems) and any("port" in p for p in problems)
        assert model_ids(stack) == {"fake-a"}
        assert chat(stack, "fake-a").status_code == 200 and stack.pid("a") == pid
        state = json.loads((stack.log_dir / "backends.state.json").read_text())
        assert state["registry"]["generation"] == 1


@pytest.mark.real_model
def test_the_real_llama_server_is_replaced_and_the_other_keeps_its_process(
    tmp_path: Path,
) -> None:
    ports = {"standard": free_port(), "gemma": free_port(), "embeddings": 0}
    models: dict[str, dict[str, Any]] = example_registry(ports, ("standard", "gemma"))["models"]
    with watched(tmp_path, models, router=True, llama_server=llama_server_bin()) as stack:
        small, gemma = stack.model_id("standard"), stack.model_id("gemma")
        kept, old = stack.pid("standard"), stack.pid("gemma")
        with load(stack, [small]) as failures:
            changed = {**models, "gemma": {**models["gemma"], "context_length": 2048}}
            write_registry(stack, changed)
            answer = reload(stack)
            assert answer.status_code == 200, answer.text
            assert answer.json()["replaced"] == ["gemma"]
            reply = chat(stack, gemma, timeout=120)  # waits for the new process
            assert reply.status_code == 200, reply.text
            assert reply.json()["choices"][0]["message"]["content"]
        assert failures == []
        assert stack.pid("standard") == kept
        assert stack.pid("gemma") != old
        argv = psutil.Process(stack.pid("gemma")).cmdline()
        assert argv[argv.index("--ctx-size") + 1] == "2048"
