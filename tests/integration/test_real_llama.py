"""The default models on the real llama-server, launched by slm_server, through the
router: every endpoint, the official client, and greedy output identical to direct."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam
from prometheus_client.parser import text_string_to_metric_families

from tests import one_shot
from tests.integration.real_stack import Stack, running_gateway
from tests.openai_shapes import strict_events, strict_response
from tests.processes import poll

# One worker runs the whole module: its module-scoped stack starts once, not per worker.
pytestmark = [pytest.mark.real_model, pytest.mark.xdist_group("test_real_llama")]

CHAT_MODEL = "smollm2-135m-instruct"
GEMMA_MODEL = "gemma-3-270m"
AGENT_ALIAS = "gemma-3-270m-agent"  # the coding agents' recipes name it (docs/agents.md)
AGENT_CAP = 256
EMBED_MODEL = "gemma-3-270m-embed"
HELLO: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "Say hello in one short sentence."}
]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, str]]:
    workdir: Path = tmp_path_factory.mktemp("real")
    with running_gateway(workdir) as running:
        yield running


@pytest.fixture(scope="module")
def client(gateway: tuple[Stack, str]) -> Iterator[openai.OpenAI]:
    _stack, url = gateway
    with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as sdk:
        yield sdk


def test_every_default_model_is_listed_and_healthy(gateway: tuple[Stack, str]) -> None:
    _stack, url = gateway
    models = one_shot.get(f"{url}/v1/models").json()
    listed = [(m["id"], m.get("alias_of")) for m in models["data"]]
    assert listed == [
        (CHAT_MODEL, None),
        (GEMMA_MODEL, None),
        (AGENT_ALIAS, GEMMA_MODEL),
        (EMBED_MODEL, None),
    ]
    health = one_shot.get(f"{url}/v1/backends/health").json()
    assert {role: item["status"] for role, item in health.items()} == {
        "standard": "healthy",
        "gemma": "healthy",
        "embeddings": "healthy",
    }
    assert all(item["state"] == "ready" for item in health.values())


@pytest.mark.parametrize("model", [CHAT_MODEL, GEMMA_MODEL])
def test_chat_completion_answers_with_text(client: openai.OpenAI, model: str) -> None:
    reply = client.chat.completions.create(model=model, messages=HELLO, max_tokens=24)
    assert reply.model == model
    assert reply.choices[0].message.content
    assert reply.usage is not None and reply.usage.completion_tokens > 0


def test_chat_completion_streams_through_the_official_client(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=CHAT_MODEL, messages=HELLO, max_tokens=24, stream=True
    )
    deltas = [
        c.choices[0].delta.content for c in stream if c.choices and c.choices[0].delta.content
    ]
    assert len(deltas) >= 2
    assert "".join(deltas).strip()


def test_the_agents_alias_has_gemma_s_whole_context_and_caps_each_answer(
    gateway: tuple[Stack, str],
) -> None:
    stack, url = gateway
    backend = f"http://127.0.0.1:{stack.ports['gemma']}"
    props = one_shot.get(f"{backend}/props", timeout=10).json()
    assert props["default_generation_settings"]["n_ctx"] == 32768
    body = {
        "model": AGENT_ALIAS,
        "max_tokens": 32000,  # what the agents ask for
        "temperature": 0,
        # A word is enough: the bound the backend was sent is read from its slot below.
        "stop_sequences": [" ", "\n", ".", "!", ","],
        "messages": [{"role": "user", "content": "Say hello."}],
    }
    answer = one_shot.post(f"{url}/v1/messages", json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    assert 0 < answer.json()["usage"]["output_tokens"] <= AGENT_CAP
    [slot] = one_shot.get(f"{backend}/slots", timeout=10).json()  # one slot: max_concurrency 1
    assert slot["params"]["n_predict"] == AGENT_CAP


def test_completions(gateway: tuple[Stack, str]) -> None:
    _stack, url = gateway
    body = {"model": GEMMA_MODEL, "prompt": "The capital of France is", "max_tokens": 8}
    response = one_shot.post(f"{url}/v1/completions", json=body, timeout=60)
    assert response.status_code == 200
    assert response.json()["choices"][0]["text"]


def test_embeddings_have_640_dimensions(client: openai.OpenAI) -> None:
    result = client.embeddings.create(model=EMBED_MODEL, input=["hello world", "goodbye"])
    assert [len(item.embedding) for item in result.data] == [640, 640]
    assert result.data[0].embedding != result.data[1].embedding


def test_responses_api(client: openai.OpenAI) -> None:
    response = client.responses.create(model=CHAT_MODEL, input="Say hi.", max_output_tokens=24)
    assert response.output_text.strip()


def test_responses_api_streaming(client: openai.OpenAI) -> None:
    events = list(
        client.responses.create(
            model=CHAT_MODEL, input="Say hi.", max_output_tokens=24, stream=True
        )
    )
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert deltas and "".join(deltas).strip()
    assert events[-1].type in ("response.completed", "response.incomplete")


def test_greedy_output_through_the_router_equals_direct(gateway: tuple[Stack, str]) -> None:
    stack, url = gateway
    body = {
        "model": CHAT_MODEL,
        "messages": [{"role": "user", "content": "List three colours."}],
        "max_tokens": 32,
        "temperature": 0,
        "seed": 7,
    }
    direct_url = f"http://127.0.0.1:{stack.ports['standard']}/v1/chat/completions"
    direct = one_shot.post(direct_url, json=body, timeout=60).json()
    routed = one_shot.post(f"{url}/v1/chat/completions", json=body, timeout=60).json()
    text = direct["choices"][0]["message"]["content"]
    assert text
    assert routed["choices"][0]["message"]["content"] == text


def test_wrong_endpoint_for_the_model_type_is_a_clear_400(gateway: tuple[Stack, str]) -> None:
    _stack, url = gateway
    response = one_shot.post(f"{url}/v1/embeddings", json={"model": CHAT_MODEL, "input": "x"})
    assert response.status_code == 400
    assert "model_type 'lm'" in response.json()["error"]["message"]


def test_a_client_leaving_mid_stream_stops_generation(gateway: tuple[Stack, str]) -> None:
    stack, url = gateway
    slots_url = f"http://127.0.0.1:{stack.ports['standard']}/slots"

    def busy_slots() -> int:
        return sum(1 for slot in one_shot.get(slots_url, timeout=5).json() if slot["is_processing"])

    body = {
        "model": CHAT_MODEL,
        "messages": [{"role": "user", "content": "Write a very long story about the sea."}],
        "max_tokens": 4000,
        "stream": True,
        "ignore_eos": True,
    }
    with one_shot.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60) as response:
        lines = response.iter_lines()
        received = [line for line, _ in zip(lines, range(12), strict=False)]
        assert any(line.startswith("data: {") for line in received)
        assert busy_slots() == 1, "the backend is generating for us"
    left = time.monotonic()
    poll(lambda: busy_slots() == 0, 5, "llama-server to stop generating")
    assert time.monotonic() - left < 2
    health = one_shot.get(f"{url}/v1/backends/health", timeout=5).json()["standard"]
    assert health["in_flight"] == 0


def sse_events(text: str) -> list[dict[str, Any]]:
    return [
        json.loads(line[5:])
        for line in text.splitlines()
        if line.startswith("data:") and line.strip() != "data: [DONE]"
    ]


@pytest.mark.parametrize("max_output_tokens", [4, 256])
def test_responses_are_strictly_openai_shaped(
    gateway: tuple[Stack, str], max_output_tokens: int
) -> None:
    """On llama.cpp the router translates (llama-server's own /v1/responses is not
    OpenAI-shaped): every answer and event validates strictly; a cut answer is
    ``incomplete`` with its reason, and its stream ends in ``response.incomplete``."""
    _stack, url = gateway
    body = {
        "model": CHAT_MODEL,
        "input": "Count to twenty.",
        "max_output_tokens": max_output_tokens,
        # Greedy: a sampled answer could end by itself within four tokens.
        "temperature": 0,
    }
    raw = one_shot.post(f"{url}/v1/responses", json=body, timeout=60).json()
    response = strict_response(raw)
    streamed = one_shot.post(f"{url}/v1/responses", json={**body, "stream": True}, timeout=60)
    events = strict_events(sse_events(streamed.text))
    final = events[-1]
    assert final.type in ("response.completed", "response.incomplete")
    if max_output_tokens == 4:
        assert response.status == "incomplete"
        assert response.incomplete_details is not None
        assert response.incomplete_details.reason == "max_output_tokens"
        assert final.type == "response.incomplete", streamed.text
    assert response.output_text.strip()


def test_the_sdk_responses_stream_helper_on_the_real_llama_server(client: openai.OpenAI) -> None:
    # Room to finish: the SDK's helper insists on response.completed, and a cut answer
    # ends, as OpenAI's do, in response.incomplete.
    with client.responses.stream(
        model=CHAT_MODEL, input="Say hi.", max_output_tokens=512, temperature=0
    ) as stream:
        deltas = [event.delta for event in stream if event.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert deltas
    assert final.output_text == "".join(deltas)
    assert final.status == "completed"


def test_llama_server_s_own_responses_api_is_not_openai_shaped(
    gateway: tuple[Stack, str],
) -> None:
    """Why the router translates for llama.cpp: asked directly, the pinned llama-server's
    /v1/responses stream fails the same strict checks. Should a new pin pass them, this
    test fails, and the router could pass the backend's own answer through again."""
    stack, _url = gateway
    direct = f"http://127.0.0.1:{stack.ports['standard']}/v1/responses"
    body = {"model": CHAT_MODEL, "input": "Say hi.", "max_output_tokens": 8, "stream": True}
    reply = one_shot.post(direct, json=body, timeout=60)
    assert reply.status_code == 200
    with pytest.raises((AssertionError, ValueError)):
        strict_events(sse_events(reply.text))


def test_each_llama_server_s_own_metrics_are_in_the_router_s(gateway: tuple[Stack, str]) -> None:
    _stack, url = gateway
    assert one_shot.post(
        f"{url}/v1/chat/completions",
        json={"model": CHAT_MODEL, "messages": HELLO, "max_tokens": 4},
        timeout=60,
    ).is_success
    text = one_shot.get(f"{url}/metrics", timeout=10).text
    engine = {
        f.name: f for f in text_string_to_metric_families(text) if f.name.startswith("llamacpp:")
    }
    assert "llamacpp:prompt_tokens" in engine, sorted(engine)
    roles = {s.labels["role"] for s in engine["llamacpp:prompt_tokens"].samples}
    assert roles == {"standard", "gemma", "embeddings"}
    chat = [s for s in engine["llamacpp:prompt_tokens"].samples if s.labels["role"] == "standard"]
    assert chat[0].labels["model"] == CHAT_MODEL and chat[0].value > 0
