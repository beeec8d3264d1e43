"""``python -m slm_server add`` against a running gateway (the real launcher and router
on fake llama-servers): the entry is appended, the supervisor reloads, the router serves
the new id (loading it on its first request, ``load: on_demand``), and the model that
was already running keeps its process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from tests import one_shot
from tests.integration.watched import fake_entry, watched
from tests.processes import ROOT, free_port, poll
from tests.unit.discover.stores import tiny_gguf

HELLO = [{"role": "user", "content": "hello"}]


def test_an_added_file_is_served_after_the_reload_and_nothing_else_restarts(
    tmp_path: Path,
) -> None:
    models = {"keep": fake_entry(tmp_path, "keep")}
    with watched(tmp_path, models, SLM_DRAIN_TIMEOUT_SECONDS="1") as stack:
        kept = stack.pid("keep")
        before = Path(stack.env["SLM_CONFIG"]).read_text()
        model = tiny_gguf(tmp_path / "Added-Q4_K_M.gguf", file_type=15)
        port = free_port()

        done = subprocess.run(
            [sys.executable, "-m", "slm_server", "add", str(model), "--port", str(port)],
            env={**os.environ, **stack.env},
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert "reloading the running gateway:" in done.stdout
        assert "  added: added-q4_k_m" in done.stdout and "  unchanged: keep" in done.stdout
        text = Path(stack.env["SLM_CONFIG"]).read_text()
        assert text.startswith(before)
        stack.models = yaml.safe_load(text)["models"]

        stack.wait_state("added-q4_k_m", "unloaded")

        def listed() -> bool:
            answer = one_shot.get(f"{stack.url}/v1/models", timeout=5)
            return "added-q4_k_m" in {m["id"] for m in answer.json()["data"]}

        poll(listed, 15, "the router to list the added model")
        body = {"model": "added-q4_k_m", "messages": HELLO, "max_tokens": 8}
        reply = one_shot.post(f"{stack.url}/v1/chat/completions", json=body, timeout=60)
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"]
        assert stack.state("added-q4_k_m")["port"] == port
        assert stack.state("added-q4_k_m")["state"] == "ready"
        assert stack.pid("keep") == kept
        assert stack.events("restart_started") == []
