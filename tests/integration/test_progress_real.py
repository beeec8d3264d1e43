"""Progress is life, on the real llama-server with the default SmolLM2 entry: the
router asks every stream for its prompt progress and keeps the reports from clients
that did not ask (the answer is the one llama-server gives without them); a long prompt
read on one thread, for longer than the silence limit, is answered and never tripped;
a backend stopped mid-stream is caught by the silence rule and its stream ends with the
in-band error, not a hang."""

from __future__ import annotations

import itertools
import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests import one_shot
from tests.integration.real_stack import example_registry, llama_server_bin
from tests.integration.watched import watched
from tests.processes import free_port, pid_alive, poll

# Timing under a busy CPU decides these (a prompt read on one thread, a silence limit
# of seconds): they run alone, after the parallel part of the suite (scripts/test.sh).
pytestmark = [pytest.mark.real_model, pytest.mark.serial]

MODEL = "smollm2-135m-instruct"


def smollm(timeout: int = 120) -> dict[str, dict[str, Any]]:
    registry = example_registry(
        {"standard": free_port(), "gemma": 0, "embeddings": 0}, roles=("standard",)
    )
    models: dict[str, dict[str, Any]] = registry["models"]
    models["standard"]["default_timeout"] = timeout
    return models


def stream(url: str, body: dict[str, Any]) -> list[tuple[float, Any]]:
    """The events of a streamed chat completion, each with the seconds since sending."""
    started = time.monotonic()
    events: list[tuple[float, Any]] = []
    with one_shot.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=300) as answer:
        assert answer.status_code == 200
        for line in answer.iter_lines():
            if line.startswith("data: "):
                data = line[6:]
                events.append(
                    (time.monotonic() - started, data if data == "[DONE]" else json.loads(data))
                )
    return events


def stream_lines(url: str, body: dict[str, Any]) -> list[tuple[float, str]]:
    """Every line of a streamed chat completion that is not empty (comments too), each
    with the seconds since sending."""
    started = time.monotonic()
    lines: list[tuple[float, str]] = []
    with one_shot.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=300) as answer:
        assert answer.status_code == 200
        for line in answer.iter_lines():
            if line:
                lines.append((time.monotonic() - started, line))
    return lines


def request(content: str, max_tokens: int = 12, **extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        **extra,
    }


def shape(event: Any) -> Any:
    """An event without what differs between two runs (id, time, fingerprint)."""
    if not isinstance(event, dict):
        return event
    return {
        k: v
        for k, v in event.items()
        if k not in ("id", "created", "system_fingerprint", "timings")
    }


def test_reports_are_the_routers_alone_and_the_answer_is_llama_servers(tmp_path: Path) -> None:
    with watched(tmp_path, smollm(), llama_server=llama_server_bin()) as stack:
        body = request("Name three colours.")
        direct = [shape(e) for _, e in stream(f"http://127.0.0.1:{stack.port('standard')}", body)]
        routed = [shape(e) for _, e in stream(stack.url, body)]
        assert all("prompt_progress" not in e for e in direct if isinstance(e, dict))
        assert routed == direct
        asked = [
            e for _, e in stream(stack.url, request("Name three colours.", return_progress=True))
        ]
        reports = [e for e in asked if isinstance(e, dict) and "prompt_progress" in e]
        assert reports, "a client that asks gets llama-server's reports"
        assert (
            reports[-1]["prompt_progress"]["processed"] == reports[-1]["prompt_progress"]["total"]
        )
        assert [shape(e) for e in asked if e not in reports] == direct
        assert not stack.events("backend_failure")


def whole(url: str, body: dict[str, Any]) -> dict[str, Any]:
    answer = one_shot.post(f"{url}/v1/chat/completions", json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    found: dict[str, Any] = answer.json()
    return found


def test_a_whole_answer_gathered_from_the_stream_is_llama_servers_own(tmp_path: Path) -> None:
    """A request that does not stream is streamed from llama-server (for its progress)
    and its whole answer gathered: the same fields and values as llama-server's own
    whole answer (what differs between two runs aside: id, time, timings' values)."""
    with watched(tmp_path, smollm(), llama_server=llama_server_bin()) as stack:
        fresh = {"stream": False, "cache_prompt": False}  # each read whole: 0 cached
        no_stream_field = request("Count to five.", max_tokens=3)
        del no_stream_field["stream"]
        for body in (
            {**request("Name three colours."), **fresh},
            {**request("Say hi.", max_tokens=40), "stop": ["!"], **fresh},
            {**no_stream_field, "cache_prompt": False},
        ):
            direct = whole(f"http://127.0.0.1:{stack.port('standard')}", body)
            routed = whole(stack.url, body)
            assert shape(routed) == shape(direct)
            assert set(routed) == set(direct)
            assert set(routed["timings"]) == set(direct["timings"])
            assert routed["id"].startswith("chatcmpl-")
        # It was streamed: llama-server was asked for its progress on every request.
        assert not stack.events("backend_failure")


def test_a_whole_answer_stranded_by_a_frozen_backend_is_gathered_again(tmp_path: Path) -> None:
    """A backend stopped while it writes a whole answer: the silence rule catches it
    (the request never had a byte of a whole answer to wait for before), the watchdog
    restarts it, and the request is sent again, once, and answered."""
    with watched(
        tmp_path, smollm(), llama_server=llama_server_bin(), SLM_WATCHDOG_SILENCE_SECONDS="2"
    ) as stack:
        poll(lambda: time.time() > stack.state("standard")["started_at"] + 0.6, 5, "the grace")
        old_pid = stack.pid("standard")
        body = {**request("Count from one to one hundred.", max_tokens=400), "stream": False}
        body["ignore_eos"] = True
        direct = f"http://127.0.0.1:{stack.port('standard')}"
        answered: list[Any] = []
        worker = threading.Thread(target=lambda: answered.append(whole(stack.url, body)))
        worker.start()
        try:
            poll(lambda: _decoding(direct), 30, "the answer under way")
            os.kill(old_pid, signal.SIGSTOP)
            worker.join(timeout=100)
        finally:
            if pid_alive(old_pid):
                os.kill(old_pid, signal.SIGCONT)
        assert not worker.is_alive()
        [answer] = answered
        assert answer["choices"][0]["finish_reason"] == "length"
        assert answer["usage"]["completion_tokens"] == 400
        [stall] = [e for e in stack.events("backend_failure") if e["reason"] == "stall"]
        assert "no prompt progress, no token" in stall["detail"]
        [retried] = stack.events("request_retried")
        assert retried["model_id"] == MODEL
        assert stack.wait_event("restart_succeeded", old_pid=old_pid, timeout=5)


def _decoding(url: str) -> bool:
    """Whether llama-server's one slot is writing an answer (tokens decoded already)."""
    slots = one_shot.get(f"{url}/slots", timeout=5).json()
    return any(s.get("is_processing") and s["next_token"][0]["n_decoded"] > 5 for s in slots)


# About 5,000 tokens: Gemma 3 270M (one slot of 32,768) reads them in about 20 s on
# one thread of this machine; its reports come every 2.5 s (benchmarks/progress_gaps.py).
LONG_PROMPT = "Summarise this. " + "The keeper climbed the stairs to light the lamp again. " * 380
SILENCE = 8.0


def test_a_long_prompt_read_on_one_thread_is_answered_and_never_tripped(tmp_path: Path) -> None:
    """Read for longer than the silence limit: its reports keep it alive, and its
    client hears them only as the stream's head and, at last, the answer."""
    registry = example_registry(
        {"standard": 0, "gemma": free_port(), "embeddings": 0}, roles=("gemma",)
    )
    with watched(
        tmp_path,
        registry["models"],
        llama_server=llama_server_bin(),
        SLM_WATCHDOG_SILENCE_SECONDS=str(SILENCE),
        LLAMA_ARG_THREADS="1",
        LLAMA_ARG_THREADS_BATCH="1",
    ) as stack:
        body = request(LONG_PROMPT, max_tokens=4)
        body["model"] = "gemma-3-270m"
        lines = stream_lines(stack.url, body)
        events = [
            (t, line[6:] if line == "data: [DONE]" else json.loads(line[6:]))
            for t, line in lines
            if line.startswith("data: ")
        ]
        first = next(t for t, e in events if isinstance(e, dict) and e["choices"])
        assert events[-1][1] == "[DONE]"
        assert all("prompt_progress" not in e for _, e in events if isinstance(e, dict))
        assert not stack.events("backend_failure"), stack.events("backend_failure")
        assert not stack.events("restart_requested")
        # No silent wait: the client heard something at least every 15 s (keep-alives,
        # every SLM_KEEPALIVE_SECONDS of 10 s by default, while the prompt was read).
        heard = [0.0, *(t for t, _ in lines)]
        longest = max(b - a for a, b in itertools.pairwise(heard))
        assert longest < 15, f"{longest:.1f}s without a byte"
        if first > 12:
            assert any(line == ": keep-alive" for _, line in lines)
        print(
            f"first token after {first:.1f}s with a silence limit of {SILENCE:g}s; "
            f"the client's longest wait for a byte {longest:.1f}s"
        )


def test_a_backend_stopped_mid_stream_is_caught_by_the_silence_rule(tmp_path: Path) -> None:
    with watched(
        tmp_path, smollm(), llama_server=llama_server_bin(), SLM_WATCHDOG_SILENCE_SECONDS="2"
    ) as stack:
        poll(lambda: time.time() > stack.state("standard")["started_at"] + 0.6, 5, "the grace")
        old_pid = stack.pid("standard")
        body = request("Count from one to one thousand.", max_tokens=2000)
        body["ignore_eos"] = True
        started = time.monotonic()
        lines: list[str] = []
        try:
            with one_shot.stream(
                "POST", f"{stack.url}/v1/chat/completions", json=body, timeout=60
            ) as answer:
                for line in answer.iter_lines():
                    lines.append(line)
                    if len(lines) == 10:  # tokens flow: freeze the backend mid-answer
                        os.kill(old_pid, signal.SIGSTOP)
                        stopped = time.monotonic()
            took = time.monotonic() - stopped
        finally:
            if pid_alive(old_pid):
                os.kill(old_pid, signal.SIGCONT)
        [stall] = [e for e in stack.events("backend_failure") if e["reason"] == "stall"]
        assert "no prompt progress, no token" in stall["detail"]
        errors = [json.loads(x[6:]) for x in lines if x.startswith("data: {") and '"error"' in x]
        assert errors and errors[-1]["error"]["message"], lines[-3:]
        assert took < 30, f"the stream ended {took:.1f}s after the stop"
        done = stack.wait_event("restart_succeeded", old_pid=old_pid, timeout=60)
        assert done["reason"] == "stall"
        assert time.monotonic() - started < 60
        answer = one_shot.post(
            f"{stack.url}/v1/chat/completions", json={**request("Hi"), "stream": False}, timeout=60
        )
        assert answer.status_code == 200
