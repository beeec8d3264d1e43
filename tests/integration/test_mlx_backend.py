"""MLX for real, on the CPU: the launcher runs ``mlx-openai-server`` on a tiny Qwen3
model built here from scratch, and the router serves it like any other backend (the
Messages API by translation, through the official ``anthropic`` SDK).

Nothing is mocked: MLX's CPU backend (``mlx[cpu]``) runs on Linux, so the same code
path as on Apple Silicon is exercised, only slower. The model is random, so the tests
assert shapes and protocol, never wording.
"""

from __future__ import annotations

import json
import math
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import psutil
import pytest
from anthropic.types import MessageParam

from tests import one_shot
from tests.anthropic_shapes import sse_events, strict_count, strict_events, strict_message
from tests.integration.watched import Watched, watched
from tests.models.tiny_qwen3 import build
from tests.processes import free_port, pid_alive, poll
from tests.registry_entries import registry_entry

# One worker runs the whole module: its module-scoped stack starts once, not per worker.
pytestmark = [pytest.mark.real_model, pytest.mark.xdist_group("test_mlx_backend")]

MODEL_ID = "tiny-qwen3-mlx"
EMBED_ID = "tiny-qwen3-mlx-embed"
HELLO = [{"role": "user", "content": "Say hello."}]
# mlx-openai-server imports its whole stack (and torch) before it binds: seconds.
START_TIMEOUT = 120.0


def mlx_entry(model_dir: Path, **fields: Any) -> dict[str, Any]:
    written = {"default_timeout": 60, "model_type": "lm", "max_concurrency": 2, **fields}
    return registry_entry(
        MODEL_ID,
        free_port(),
        backend="mlx",
        model_path=str(model_dir),
        quantization="f32",
        **written,
    )


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("tiny-qwen3"))


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Iterator[Watched]:
    tmp = tmp_path_factory.mktemp("mlx-stack")
    models = {
        "tiny": mlx_entry(model_dir),
        "embed": mlx_entry(model_dir, id=EMBED_ID, model_type="embeddings"),
    }
    with watched(
        tmp,
        models,
        wait_ready=False,
        SLM_WATCHDOG_STARTUP_GRACE_SECONDS="2",
        SLM_STOP_TIMEOUT_SECONDS="10",
    ) as running:
        running.wait_ready("tiny", timeout=START_TIMEOUT)
        running.wait_ready("embed", timeout=START_TIMEOUT)
        yield running


def chat(url: str, **extra: Any) -> httpx.Response:
    # Greedy, so the random model's answer is the same on every run.
    body = {"model": MODEL_ID, "messages": HELLO, "max_tokens": 6, "temperature": 0, **extra}
    return one_shot.post(f"{url}/v1/chat/completions", json=body, timeout=60)


def family(pid: int) -> list[int]:
    """``pid`` and every process it started (mlx-openai-server forks a model handler)."""
    try:
        parent = psutil.Process(pid)
        return [pid, *(child.pid for child in parent.children(recursive=True))]
    except psutil.Error:
        return []


def test_launch_line_names_the_model_and_maps_concurrency(stack: Watched) -> None:
    argv = psutil.Process(stack.pid("tiny")).cmdline()
    joined = " ".join(argv)
    assert f"--served-model-name {MODEL_ID}" in joined
    assert "--decode-concurrency 2" in joined
    assert "--no-log-file" in argv
    assert not (stack.tmp / "logs" / "app.log").exists()


def test_chat_completion_through_the_router(stack: Watched) -> None:
    reply = chat(stack.url)
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["object"] == "chat.completion"
    message = body["choices"][0]["message"]
    assert message["role"] == "assistant"
    assert isinstance(message["content"], str)
    assert message["content"]
    assert 1 <= body["usage"]["completion_tokens"] <= 6


def test_streamed_chat_completion_through_the_router(stack: Watched) -> None:
    events: list[dict[str, Any]] = []
    done = False
    body = {"model": MODEL_ID, "messages": HELLO, "max_tokens": 5, "temperature": 0, "stream": True}
    with one_shot.stream(
        "POST", f"{stack.url}/v1/chat/completions", json=body, timeout=60
    ) as response:
        assert response.status_code == 200
        assert "text/event-stream" in response.headers["content-type"]
        for line in response.iter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                done = True
                continue
            events.append(json.loads(data))
    assert done
    assert all(e["object"] == "chat.completion.chunk" for e in events)
    text = "".join(c["delta"].get("content") or "" for e in events for c in e["choices"])
    assert text
    assert any(c.get("finish_reason") for e in events for c in e["choices"])


def test_responses_api_through_the_router(stack: Watched) -> None:
    reply = one_shot.post(
        f"{stack.url}/v1/responses",
        json={"model": MODEL_ID, "input": "Say hello.", "max_output_tokens": 6, "temperature": 0},
        timeout=60,
    )
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["object"] == "response"
    assert body["status"] == "completed"
    texts = [
        part["text"]
        for item in body["output"]
        if item["type"] == "message"
        for part in item["content"]
        if part["type"] == "output_text"
    ]
    assert texts
    assert texts[0]


def test_messages_api_through_the_anthropic_sdk_translated(stack: Watched) -> None:
    """mlx-openai-server has no Messages API: the router translates, whole and
    streamed, and estimates count_tokens itself; every answer and event strictly of
    the anthropic SDK's types."""
    hello: list[MessageParam] = [{"role": "user", "content": "Say hello."}]
    greedy = {"temperature": 0}
    with anthropic.Anthropic(base_url=stack.url, api_key="x", max_retries=0, timeout=60) as sdk:
        raw = sdk.messages.with_raw_response.create(
            model=MODEL_ID, max_tokens=6, messages=hello, extra_body=greedy
        )
        message = strict_message(json.loads(raw.http_response.text))
        assert message.model == MODEL_ID and message.stop_reason in ("end_turn", "max_tokens")
        assert 1 <= message.usage.output_tokens <= 6
        with sdk.messages.stream(
            model=MODEL_ID, max_tokens=6, messages=hello, extra_body=greedy
        ) as stream:
            text = "".join(stream.text_stream)
            final = stream.get_final_message()
        strict_message(final.model_dump(exclude_unset=True))
        assert text == message.content[0].text  # type: ignore[union-attr]  # greedy
        counted = sdk.messages.count_tokens(model=MODEL_ID, messages=hello)
        assert strict_count(counted.model_dump()).input_tokens >= 1
    body = {"model": MODEL_ID, "max_tokens": 6, "messages": hello, "stream": True, **greedy}
    streamed = one_shot.post(f"{stack.url}/v1/messages", json=body, timeout=60)
    assert streamed.status_code == 200
    strict_events([data for _, data in sse_events(streamed.content)])


def test_models_lists_the_mlx_entry(stack: Watched) -> None:
    listed = one_shot.get(f"{stack.url}/v1/models", timeout=10).json()["data"]
    assert sorted(m["id"] for m in listed) == sorted([MODEL_ID, EMBED_ID])


def test_embeddings_through_the_router(stack: Watched) -> None:
    texts = ["the quick brown fox", "yes", "the quick brown fox"]
    reply = one_shot.post(
        f"{stack.url}/v1/embeddings", json={"model": EMBED_ID, "input": texts}, timeout=60
    )
    assert reply.status_code == 200, reply.text
    data = reply.json()["data"]
    assert [d["index"] for d in data] == [0, 1, 2]
    vectors = [d["embedding"] for d in data]
    assert all(len(v) == 64 for v in vectors)  # the tiny model's hidden size
    assert all(math.isfinite(x) for v in vectors for x in v)
    assert vectors[0] == pytest.approx(vectors[2], abs=1e-5)
    assert vectors[0] != pytest.approx(vectors[1], abs=1e-3)


def test_chat_to_the_embeddings_entry_is_refused_by_the_router(stack: Watched) -> None:
    reply = one_shot.post(
        f"{stack.url}/v1/chat/completions",
        json={"model": EMBED_ID, "messages": HELLO},
        timeout=10,
    )
    assert reply.status_code == 400
    assert reply.json()["error"]["code"] == "unsupported_endpoint"


def test_killed_mlx_backend_is_restarted_and_leaves_nothing_behind(stack: Watched) -> None:
    assert chat(stack.url).status_code == 200
    old_pid = stack.pid("tiny")
    old_family = family(old_pid)
    assert len(old_family) >= 2, "mlx-openai-server runs its model in a child process"
    os.kill(old_pid, signal.SIGKILL)
    stack.wait_event("backend_exited", pid=old_pid)
    # While it is down the router answers at once, never hangs.
    down = chat(stack.url)
    assert down.status_code in (200, 503)
    if down.status_code == 503:
        assert down.headers.get("retry-after")
        assert down.json()["error"]["type"]
    done = stack.wait_event("restart_succeeded", old_pid=old_pid, timeout=START_TIMEOUT)
    assert done["reason"] == "exited"
    # The model handler the killed server had forked does not outlive it.
    poll(lambda: not any(pid_alive(p) for p in old_family), 15, "the old handler to exit")
    poll(lambda: chat(stack.url).status_code == 200, 60, "a chat after the restart")
