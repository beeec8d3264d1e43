"""A raw-socket backend (:mod:`tests.fakes.raw_backend`) with the real router in front
of it, for tests of hostile backends."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from tests.processes import ROOT, free_port, http_ok, poll, registry_env, running_router
from tests.registry_entries import registry_entry

# The head of a chunked event stream, as a backend sends it.
SSE_HEAD = (
    "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
)


def delta(model: str, text: str) -> str:
    """One chat-completion chunk carrying ``text``, as an SSE event."""
    chunk = {
        "id": "c1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": model,
        "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}],
    }
    return f"data: {json.dumps(chunk)}\n\n"


def repeated_stream(model: str, events: int) -> list[dict[str, Any]]:
    """The script of a stream of ``events`` one-token chunks, then ``[DONE]``."""
    piece = delta(model, "x")
    return [
        {"send": SSE_HEAD},
        {"repeat": f"{len(piece):x}\r\n{piece}\r\n", "times": events},
        {"chunk": "data: [DONE]\n\n"},
        {"chunk": ""},
    ]


@dataclass
class Raw:
    """The raw backend process, the router in front of it, and the router's pid."""

    script_path: Path
    url: str
    router_pid: int
    backend_port: int = 0

    def script(
        self, *steps: dict[str, Any], by_path: dict[str, list[dict[str, Any]]] | None = None
    ) -> None:
        staged = self.script_path.with_suffix(".tmp")
        staged.write_text(json.dumps({"steps": list(steps), "by_path": by_path or {}}))
        staged.replace(self.script_path)

    def rss_mb(self) -> float:
        return float(psutil.Process(self.router_pid).memory_info().rss) / 1e6

    def healthy_within(self, seconds: float = 1.0) -> bool:
        started = time.monotonic()
        ok = http_ok(f"{self.url}/health")
        return ok and time.monotonic() - started < seconds


@contextmanager
def raw_stack(
    tmp: Path,
    model: str,
    *,
    answer_limit_mb: float,
    event_limit_mb: float,
    settings: Mapping[str, str] | None = None,
) -> Iterator[Raw]:
    """The raw backend serving ``model`` and a router in front of it, with these limits
    (SLM_MAX_ANSWER_MB, SLM_MAX_SSE_EVENT_MB) and any other ``settings`` (``SLM_*``)."""
    port = free_port()
    script = tmp / "script.json"
    log = (tmp / "raw.out").open("wb")
    command = [sys.executable, "-m", "tests.fakes.raw_backend"]
    backend = subprocess.Popen(
        [*command, "--port", str(port), "--script", str(script)],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        poll(lambda: http_ok(f"http://127.0.0.1:{port}/health"), 15, "the raw backend")
        env = registry_env(
            tmp,
            {"raw": registry_entry(model, port)},
            SLM_MAX_ANSWER_MB=str(answer_limit_mb),
            SLM_MAX_SSE_EVENT_MB=str(event_limit_mb),
            **(settings or {}),
        )
        with running_router(env, tmp) as (router, url):
            yield Raw(script, url, router.pid, port)
    finally:
        backend.terminate()
        backend.wait(10)
        log.close()
