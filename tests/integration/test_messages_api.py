"""The Anthropic Messages API through the official ``anthropic`` SDK, against a router on a
real socket in front of fake backends (real processes): every answer and every stream
event strictly of the SDK's own types, a tool round trip, token counts, Anthropic-shaped
errors (unknown model, bad body, full queue, a deadline cutting a stream), and keys in
``x-api-key``; nothing the client got wrong reaches a backend or counts against it."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest
from anthropic.types import MessageParam, ToolParam

from tests import one_shot
from tests.anthropic_shapes import (
    sse_events,
    strict_count,
    strict_error,
    strict_events,
    strict_message,
)
from tests.fakes.control import FakeBackend
from tests.processes import RunningRouter, StartRouter
from tests.registry_entries import registry_entry

# Its module-scoped stack starts once: one worker runs the whole module.
pytestmark = pytest.mark.xdist_group("test_messages_api")

FAKE_ROLES = ("claude", "slow")
CHAT = "/v1/chat/completions"
HI: list[MessageParam] = [{"role": "user", "content": "hello there"}]
WEATHER: ToolParam = {
    "name": "get_weather",
    "description": "Weather for a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}


@pytest.fixture(scope="module")
def router_process(fakes: dict[str, FakeBackend], start_router: StartRouter) -> RunningRouter:
    models = {
        "claude": registry_entry("claude", fakes["claude"].port),
        "slow": registry_entry(
            "slow", fakes["slow"].port, default_timeout=1, max_concurrency=1, max_queue=0
        ),
    }
    return start_router(models, SLM_OTEL_ENABLED="false")


@pytest.fixture(scope="module")
def keyed_router(fakes: dict[str, FakeBackend], start_router: StartRouter) -> str:
    models = {"claude": registry_entry("claude", fakes["claude"].port)}
    return start_router(models, SLM_OTEL_ENABLED="false", SLM_API_KEYS="sekrit").url


@pytest.fixture
def client(router: str) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=router, api_key="unused", max_retries=0) as made:
        yield made


def raw_events(response: httpx.Response) -> list[dict[str, Any]]:
    return [data for _, data in sse_events(response.content)]


def test_create_whole_and_streamed_is_strictly_anthropic_shaped(
    client: anthropic.Anthropic, http: httpx.Client, fakes: dict[str, FakeBackend]
) -> None:
    fakes["claude"].script(chunks=3, reply="Hi!")
    message = client.messages.create(model="claude", max_tokens=32, messages=HI)
    assert message.content[0].text == "Hi!"  # type: ignore[union-attr]
    strict_message(message.model_dump(exclude_unset=True))
    raw = http.post(
        "/v1/messages",
        json={"model": "claude", "max_tokens": 32, "messages": HI},
        headers={"anthropic-version": "2023-06-01"},
    )
    strict_message(raw.json())
    streamed = client.messages.create(model="claude", max_tokens=32, messages=HI, stream=True)
    kinds = [event.type for event in streamed]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    body = {"model": "claude", "max_tokens": 32, "messages": HI, "stream": True}
    events = strict_events(raw_events(http.post("/v1/messages", json=body)))
    texts = [e.delta.text for e in events if e.type == "content_block_delta"]
    assert texts == ["tok "] * 3
    assert [r["path"] for r in fakes["claude"].requests()] == [CHAT] * 4


def test_stream_helper_and_get_final_message(
    client: anthropic.Anthropic, fakes: dict[str, FakeBackend]
) -> None:
    fakes["claude"].script(chunks=4, chunk_text="ab", reasoning="Thinking it over.")
    with client.messages.stream(
        model="claude",
        max_tokens=32,
        messages=HI,
        thinking={"type": "enabled", "budget_tokens": 1024},
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "ab" * 4
    assert [block.type for block in final.content] == ["thinking", "text"]
    assert final.content[0].thinking == "Thinking it over."  # type: ignore[union-attr]
    assert final.stop_reason == "end_turn" and final.usage.output_tokens == 4
    sent = fakes["claude"].requests()[0]["body"]
    assert sent["chat_template_kwargs"] == {"enable_thinking": True}


def test_a_tool_round_trip(client: anthropic.Anthropic, fakes: dict[str, FakeBackend]) -> None:
    call = {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    fakes["claude"].script(tool_calls=[call])
    asked: list[MessageParam] = [{"role": "user", "content": "Weather in Paris?"}]
    first = client.messages.create(
        model="claude",
        max_tokens=64,
        messages=asked,
        tools=[WEATHER],
        tool_choice={"type": "any"},
    )
    strict_message(first.model_dump(exclude_unset=True))
    assert first.stop_reason == "tool_use"
    [use] = [block for block in first.content if block.type == "tool_use"]
    assert use.name == "get_weather" and use.input == {"city": "Paris"}
    with client.messages.stream(
        model="claude",
        max_tokens=64,
        messages=asked,
        tools=[WEATHER],
    ) as stream:
        streamed = stream.get_final_message()
    [streamed_use] = [block for block in streamed.content if block.type == "tool_use"]
    assert streamed_use.input == {"city": "Paris"} and streamed.stop_reason == "tool_use"
    fakes["claude"].script(reply="It is sunny in Paris.")
    history: list[Any] = [
        *asked,
        {"role": "assistant", "content": [block.model_dump() for block in first.content]},
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": use.id,
                    "content": [{"type": "text", "text": "Sunny"}, {"type": "text", "text": "20C"}],
                }
            ],
        },
    ]
    answer = client.messages.create(
        model="claude",
        max_tokens=64,
        messages=history,
        tools=[WEATHER],
    )
    assert answer.content[0].text == "It is sunny in Paris."  # type: ignore[union-attr]
    sent = fakes["claude"].requests()[-1]["body"]["messages"]
    assert sent[1]["tool_calls"][0]["id"] == use.id
    assert sent[2] == {"role": "tool", "tool_call_id": use.id, "content": "Sunny\n20C"}


def test_count_tokens_is_estimated_for_a_backend_without_the_route(
    client: anthropic.Anthropic, http: httpx.Client, fakes: dict[str, FakeBackend]
) -> None:
    counted = client.messages.count_tokens(model="claude", messages=HI, system="x" * 40)
    assert counted.input_tokens == (len("hello there") + 40 + 3) // 4 + 2 * 4
    body = {"model": "claude", "messages": HI}
    strict_count(http.post("/v1/messages/count_tokens", json=body).json())
    # The fake has no such route (its 404 records nothing): nothing is generated.
    assert fakes["claude"].requests() == []


def test_client_errors_are_anthropic_shaped_and_never_reach_the_backend(
    client: anthropic.Anthropic, http: httpx.Client, fakes: dict[str, FakeBackend]
) -> None:
    with pytest.raises(anthropic.NotFoundError) as missing:
        client.messages.create(model="nope", max_tokens=8, messages=HI)
    strict_error(missing.value.body, "not_found_error")
    stray: list[MessageParam] = [
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "?"}],
        }
    ]
    with pytest.raises(anthropic.BadRequestError) as bad:
        client.messages.create(model="claude", max_tokens=8, messages=stray)
    strict_error(bad.value.body, "invalid_request_error")
    for raw in (b"{not json", json.dumps({"model": "claude", "messages": HI}).encode()):
        response = http.post(
            "/v1/messages", content=raw, headers={"content-type": "application/json"}
        )
        assert response.status_code == 400
        strict_error(response.json(), "invalid_request_error")
    assert fakes["claude"].requests() == []


def test_a_full_queue_is_a_rate_limit_error(
    client: anthropic.Anthropic, fakes: dict[str, FakeBackend]
) -> None:
    fakes["slow"].script(delay_seconds=0.8, reply="late")
    first = threading.Thread(
        target=client.messages.create,
        kwargs={"model": "slow", "max_tokens": 8, "messages": HI},
    )
    first.start()
    fakes["slow"].wait_for(lambda requests: len(requests) == 1)
    with pytest.raises(anthropic.RateLimitError) as full:
        client.messages.create(model="slow", max_tokens=8, messages=HI)
    assert full.value.response.headers["retry-after"] == "1"
    strict_error(full.value.body, "rate_limit_error")
    first.join()
    assert len(fakes["slow"].requests()) == 1


def test_a_deadline_that_cuts_a_stream_ends_it_with_an_error_event(
    client: anthropic.Anthropic, http: httpx.Client, fakes: dict[str, FakeBackend]
) -> None:
    fakes["slow"].script(chunks=30, chunk_interval_seconds=0.1)
    body = {"model": "slow", "max_tokens": 64, "messages": HI, "stream": True}
    events = raw_events(http.post("/v1/messages", json=body))
    strict_events(events, ends="error")
    assert strict_error(events[-1], "timeout_error")
    with (
        pytest.raises(anthropic.APIStatusError) as cut,
        client.messages.stream(model="slow", max_tokens=64, messages=HI) as stream,
    ):
        stream.get_final_message()
    strict_error(cut.value.body, "timeout_error")


def test_keys_are_accepted_in_x_api_key_and_refused_when_wrong(keyed_router: str) -> None:
    with anthropic.Anthropic(base_url=keyed_router, api_key="sekrit", max_retries=0) as good:
        assert good.messages.create(model="claude", max_tokens=8, messages=HI).content
    with (
        anthropic.Anthropic(base_url=keyed_router, auth_token="sekrit", max_retries=0) as bearer,
    ):
        assert bearer.messages.create(model="claude", max_tokens=8, messages=HI).content
    with (
        anthropic.Anthropic(base_url=keyed_router, api_key="wrong", max_retries=0) as bad,
        pytest.raises(anthropic.AuthenticationError) as refused,
    ):
        bad.messages.create(model="claude", max_tokens=8, messages=HI)
    strict_error(refused.value.body, "authentication_error")
    chat = {"model": "claude", "messages": HI}
    response = one_shot.post(f"{keyed_router}{CHAT}", json=chat, headers={"x-api-key": "sekrit"})
    assert response.status_code == 200  # every route takes x-api-key
