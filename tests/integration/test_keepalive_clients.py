"""Keep-alives as the official SDKs read them: a router on a real socket in front of a
fake backend (a real process) that holds its answer's head back for several keep-alive
intervals, so that every streamed answer here begins with the router's keep-alives (SSE
comments; the Messages API's ``ping`` events), progress lines where asked — and each
SDK still parses the answer into its own types, with exactly the backend's text.

The raw bytes are read alongside, to show the keep-alives were there: a test that passes
without them proves nothing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
from anthropic.types import MessageParam
from openai.types.chat import ChatCompletionMessageParam

from tests.anthropic_shapes import sse_events
from tests.anthropic_shapes import strict_events as strict_message_events
from tests.fakes.control import FakeBackend
from tests.openai_shapes import strict_chat_chunks, strict_events
from tests.processes import RunningRouter, StartRouter
from tests.registry_entries import registry_entry

# Its module-scoped stack starts once: one worker runs the whole module.
pytestmark = pytest.mark.xdist_group("test_keepalive_clients")

FAKE_ROLES = ("slow",)
BEAT = 0.2
WAIT = 1.0  # the backend's delay before its head: five beats
HI: list[MessageParam] = [{"role": "user", "content": "hello there"}]
CHAT_HI: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello there"}]
COMMENT = b": keep-alive\n\n"
PING = b"event: ping\n"


@pytest.fixture(scope="module")
def router_process(fakes: dict[str, FakeBackend], start_router: StartRouter) -> RunningRouter:
    models = {"slow": registry_entry("slow", fakes["slow"].port)}
    return start_router(models, SLM_OTEL_ENABLED="false", SLM_KEEPALIVE_SECONDS=str(BEAT))


@pytest.fixture(autouse=True)
def _slow(fake: FakeBackend) -> None:
    fake.script(chunks=3, chunk_text="ab ", delay_seconds=WAIT)


@pytest.fixture
def gpt(router: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{router}/v1", api_key="unused", max_retries=0) as made:
        yield made


@pytest.fixture
def claude(router: str) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=router, api_key="unused", max_retries=0) as made:
        yield made


def data_objects(body: bytes) -> list[dict[str, Any]]:
    """Every event's JSON data (comments and ``[DONE]`` aside)."""
    found = []
    for line in body.decode().splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            found.append(json.loads(line[len("data: ") :]))
    return found


def test_chat_completions_with_keepalives_parse_in_the_sdk(
    gpt: openai.OpenAI, http: httpx.Client
) -> None:
    body = {"model": "slow", "stream": True, "messages": HI}
    raw = http.post("/v1/chat/completions", json=body, timeout=30)
    assert raw.status_code == 200
    assert raw.content.count(COMMENT) >= 3
    strict_chat_chunks(data_objects(raw.content))
    stream = gpt.chat.completions.create(model="slow", messages=CHAT_HI, stream=True)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert text == "ab " * 3


def test_progress_lines_leave_the_sdk_unmoved(gpt: openai.OpenAI, http: httpx.Client) -> None:
    body = {"model": "slow", "stream": True, "messages": HI}
    headers = {"x-slm-progress": "1"}
    raw = http.post("/v1/chat/completions", json=body, headers=headers, timeout=30)
    assert b': slm-progress {"stage":"sent"' in raw.content
    stream = gpt.chat.completions.create(
        model="slow",
        messages=CHAT_HI,
        stream=True,
        extra_headers=headers,
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert text == "ab " * 3


def test_responses_with_keepalives_parse_in_the_sdk(gpt: openai.OpenAI, http: httpx.Client) -> None:
    body = {"model": "slow", "stream": True, "input": "hello"}
    raw = http.post("/v1/responses", json=body, timeout=30)
    assert raw.content.count(COMMENT) >= 3
    events = strict_events(data_objects(raw.content))
    assert events[-1].type == "response.completed"
    with gpt.responses.stream(model="slow", input="hello") as stream:
        final = stream.get_final_response()
    assert final.output_text == "ab " * 3


def test_messages_with_pings_parse_in_the_sdk(
    claude: anthropic.Anthropic, http: httpx.Client
) -> None:
    body = {"model": "slow", "max_tokens": 32, "messages": HI, "stream": True}
    raw = http.post("/v1/messages", json=body, timeout=30)
    assert raw.content.count(PING) >= 3
    assert raw.content.startswith(PING)  # before message_start: the head waited
    strict_message_events([data for _, data in sse_events(raw.content)])
    with claude.messages.stream(model="slow", max_tokens=32, messages=HI) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "ab " * 3
    assert final.stop_reason == "end_turn"
    streamed = claude.messages.create(model="slow", max_tokens=32, messages=HI, stream=True)
    kinds = [event.type for event in streamed]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
