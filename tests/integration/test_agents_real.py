"""What coding agents send, on the real llama-server with the default models, through
the router: the official ``anthropic`` SDK on the Messages API (``messages.create``
whole and streamed, ``messages.stream()`` with ``get_final_message()``, a tool round
trip, ``count_tokens`` answered by llama-server itself), and one agent-sized request (a
system prompt of about 20k tokens and 20 tools, as Claude Code, Codex CLI and opencode
send) through all three API shapes: chat completions, Responses and Messages. Every
answer and event is validated strictly against the openai and anthropic packages' own
types.

The default Gemma entry's 4096-token context is too short for an agent's prompt; here it
gets its trained 32k (docs/agents.md says the same to the owner). With one slot, the
three shapes' requests share llama-server's prompt cache: the prompt is processed once
(150 s of the test's 215 s on two CPUs already at load 4; Gemma 3 270M processes some
130 tokens a second that deep into its context there), and each later shape reads it
back from the cache, which also proves that the three translations give the model the
same prompt."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any, cast

import anthropic
import httpx
import openai
import pytest
from anthropic.types import MessageParam, ToolParam

from tests import one_shot
from tests.agent_request import (
    AGENT_RULES,
    chat_request,
    messages_tools,
    responses_request,
    system_prompt,
)
from tests.anthropic_shapes import sse_events, strict_count, strict_error, strict_message
from tests.anthropic_shapes import strict_events as strict_message_events
from tests.integration.real_stack import Stack, example_registry, running_registry
from tests.openai_shapes import (
    strict_chat_chunks,
    strict_chat_completion,
    strict_events,
    strict_response,
)
from tests.processes import free_port, running_router

# One worker runs the whole module: its module-scoped stack starts once, not per worker.
# A 20k-token prompt read on two CPUs beside the parallel part overran pytest's 300 s:
# these run alone, after it (scripts/test.sh).
pytestmark = [pytest.mark.real_model, pytest.mark.serial]

CHAT_MODEL = "smollm2-135m-instruct"
AGENT_MODEL = "gemma-3-270m"
AGENT_CONTEXT = 32768
# About 19,800 tokens of system prompt with Gemma's tokenizer (counted below).
SYSTEM = system_prompt(AGENT_RULES)
ASK = "Which tool lists a directory? Answer with its name."
HI: list[MessageParam] = [{"role": "user", "content": "Say hello in one short sentence."}]
GREEDY = {"temperature": 0}  # the SDK's create() no longer names it; the API takes it
AGENT_TOOLS = cast(list[ToolParam], messages_tools())
WEATHER: ToolParam = {
    "name": "get_weather",
    "description": "Weather for a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}
TIMEOUT = 300.0


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, str]]:
    workdir = tmp_path_factory.mktemp("agents")
    ports = {role: free_port() for role in ("standard", "gemma", "embeddings")}
    registry = example_registry(ports, roles=("standard", "gemma"))
    registry["models"]["gemma"]["context_length"] = AGENT_CONTEXT
    registry["models"]["gemma"]["default_timeout"] = TIMEOUT
    with (
        running_registry(workdir, registry) as stack,
        running_router(stack.env, workdir) as (_router, url),
    ):
        yield stack, url


@pytest.fixture(scope="module")
def claude(gateway: tuple[Stack, str]) -> Iterator[anthropic.Anthropic]:
    _stack, url = gateway
    with anthropic.Anthropic(
        base_url=url, api_key="unused", max_retries=0, timeout=TIMEOUT
    ) as client:
        yield client


@pytest.fixture(scope="module")
def gpt(gateway: tuple[Stack, str]) -> Iterator[openai.OpenAI]:
    _stack, url = gateway
    with openai.OpenAI(
        base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=TIMEOUT
    ) as client:
        yield client


def data_lines(response: httpx.Response) -> list[dict[str, Any]]:
    lines = [line[len("data: ") :] for line in response.iter_lines() if line.startswith("data: ")]
    return [json.loads(line) for line in lines if line != "[DONE]"]


# --- the Messages API through the anthropic SDK, on the default chat model ------------


def test_messages_create_whole_and_streamed(
    claude: anthropic.Anthropic, gateway: tuple[Stack, str]
) -> None:
    raw = claude.messages.with_raw_response.create(
        model=CHAT_MODEL, max_tokens=16, extra_body=GREEDY, messages=HI
    )
    message = strict_message(json.loads(raw.http_response.text))
    assert message.model == CHAT_MODEL and message.role == "assistant"
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert 1 <= message.usage.output_tokens <= 16
    assert [block.type for block in message.content] == ["text"]
    _stack, url = gateway
    body = {"model": CHAT_MODEL, "max_tokens": 16, "temperature": 0, "messages": HI, "stream": True}
    with one_shot.stream("POST", f"{url}/v1/messages", json=body, timeout=TIMEOUT) as streamed:
        assert streamed.status_code == 200
        events = strict_message_events([data for _, data in sse_events(streamed.read())])
    text = "".join(e.delta.text for e in events if e.type == "content_block_delta")
    assert text == message.content[0].text  # type: ignore[union-attr]  # greedy: the same


def test_messages_stream_helper_and_final_message(claude: anthropic.Anthropic) -> None:
    with claude.messages.stream(
        model=CHAT_MODEL, max_tokens=16, extra_body=GREEDY, messages=HI
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    strict_message(final.model_dump(exclude_unset=True))
    assert text and final.content[0].text == text  # type: ignore[union-attr]
    assert final.stop_reason in ("end_turn", "max_tokens")


def test_messages_tool_round_trip(claude: anthropic.Anthropic) -> None:
    """SmolLM2's template has no tools (llama-server ignores them and the model answers
    in text); what matters is that a history of tool_use and tool_result is served."""
    history: list[MessageParam] = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": [
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "get_weather",
                    "input": {"city": "Paris"},
                }
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": [{"type": "text", "text": "Sunny"}, {"type": "text", "text": "20C"}],
                }
            ],
        },
    ]
    raw = claude.messages.with_raw_response.create(
        model=CHAT_MODEL, max_tokens=16, extra_body=GREEDY, tools=[WEATHER], messages=history
    )
    answer = strict_message(json.loads(raw.http_response.text))
    assert answer.stop_reason in ("end_turn", "max_tokens", "tool_use")


def test_count_tokens_is_llama_server_s_own(claude: anthropic.Anthropic) -> None:
    """Counted by llama-server with the chat template and the tokenizer: the prompt the
    model reads for the same request, token for token."""
    counted = claude.messages.count_tokens(model=CHAT_MODEL, messages=HI)
    strict_count(counted.model_dump())
    message = claude.messages.create(model=CHAT_MODEL, max_tokens=1, messages=HI)
    usage = message.usage
    assert counted.input_tokens == usage.input_tokens + (usage.cache_read_input_tokens or 0)


def test_an_unknown_model_is_anthropic_shaped(claude: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.NotFoundError) as raised:
        claude.messages.create(model="claude-sonnet-9", max_tokens=8, messages=HI)
    strict_error(raised.value.body, "not_found_error")


# --- one agent-sized request through the three API shapes ---------------------------


@pytest.mark.timeout(600)
def test_an_agent_sized_request_through_all_three_api_shapes(
    gateway: tuple[Stack, str], claude: anthropic.Anthropic, gpt: openai.OpenAI
) -> None:
    _stack, url = gateway
    counted = claude.messages.count_tokens(
        model=AGENT_MODEL,
        system=SYSTEM,
        tools=AGENT_TOOLS,
        messages=[{"role": "user", "content": ASK}],
    )
    assert 18_000 <= counted.input_tokens <= 24_000, counted

    started = time.monotonic()
    chat_body = chat_request(AGENT_MODEL, SYSTEM, ASK, max_tokens=8) | GREEDY
    chat = one_shot.post(f"{url}/v1/chat/completions", json=chat_body, timeout=TIMEOUT)
    assert chat.status_code == 200, chat.text
    completion = strict_chat_completion(chat.json())
    assert completion.usage is not None
    assert completion.usage.prompt_tokens >= 18_000
    first = time.monotonic() - started
    with one_shot.stream(
        "POST", f"{url}/v1/chat/completions", json={**chat_body, "stream": True}, timeout=TIMEOUT
    ) as streamed:
        assert streamed.status_code == 200
        strict_chat_chunks(data_lines(streamed))

    responses_body = responses_request(AGENT_MODEL, SYSTEM, ASK, max_output_tokens=8) | GREEDY
    whole = one_shot.post(f"{url}/v1/responses", json=responses_body, timeout=TIMEOUT)
    assert whole.status_code == 200, whole.text
    response = strict_response(whole.json())
    assert response.status in ("completed", "incomplete")
    assert response.usage is not None and response.usage.input_tokens >= 18_000
    with one_shot.stream(
        "POST", f"{url}/v1/responses", json={**responses_body, "stream": True}, timeout=TIMEOUT
    ) as streamed:
        assert streamed.status_code == 200
        events = strict_events(data_lines(streamed))
    assert events[-1].type in ("response.completed", "response.incomplete")

    message = claude.messages.create(
        model=AGENT_MODEL,
        system=SYSTEM,
        tools=AGENT_TOOLS,
        messages=[{"role": "user", "content": ASK}],
        max_tokens=8,
        extra_body=GREEDY,
    )
    strict_message(message.model_dump(exclude_unset=True))
    usage = message.usage
    assert usage.input_tokens + (usage.cache_read_input_tokens or 0) >= 18_000
    # The same prompt as the chat request's: read back from llama-server's cache.
    assert (usage.cache_read_input_tokens or 0) >= 18_000
    with claude.messages.stream(
        model=AGENT_MODEL,
        system=SYSTEM,
        tools=AGENT_TOOLS,
        messages=[{"role": "user", "content": ASK}],
        max_tokens=8,
        extra_body=GREEDY,
    ) as stream:
        final = stream.get_final_message()
    strict_message(final.model_dump(exclude_unset=True))
    # Every shape after the first is served from the cache: seconds, not another minute.
    assert time.monotonic() - started < first + 60, (first, time.monotonic() - started)
