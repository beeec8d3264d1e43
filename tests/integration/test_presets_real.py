"""A capped model on the real llama-server never generates past its cap, whatever the
client asks: no bound, ``null``, ``-1``, a huge one, under any of the names llama-server
reads (``max_tokens``, ``max_completion_tokens``, ``n_predict``), on chat completions,
completions and the Responses API, streamed and not; by the model's id (its entry's
cap) and by an alias with a lower cap of its own, served by the same process."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests import one_shot
from tests.integration.real_stack import Stack, example_registry, running_registry
from tests.processes import free_port, running_router

pytestmark = [pytest.mark.real_model, pytest.mark.xdist_group("test_presets_real")]

MODEL = "smollm2-135m-instruct"
ALIAS = "smollm2-terse"
CAPS = {MODEL: 12, ALIAS: 5}
# A prompt the model answers at length: every answer here is cut by a bound.
STORY = "Write a very long story about a dragon who learns to cook. Use many details."
# What clients send as the output bound: nothing, null, "no limit", far too much, and
# each of the names llama-server reads, alone or beside a small max_tokens.
BOUNDS: dict[str, dict[str, Any]] = {
    "absent": {},
    "null": {"max_tokens": None},
    "minus-one": {"max_tokens": -1},
    "huge": {"max_tokens": 1_000_000},
    "max_completion_tokens": {"max_completion_tokens": 100_000},
    "n_predict-beside-a-small-max_tokens": {"max_tokens": 2, "n_predict": 100_000},
}
# Every bound against the alias's cap; the entry's cap (by the id) with the two that
# matter most, nothing and far too much.
CHAT_CASES = [(ALIAS, bound) for bound in BOUNDS] + [(MODEL, "absent"), (MODEL, "huge")]
COMPLETIONS_CASES = [
    (ALIAS, bound)
    for bound in ("absent", "minus-one", "huge", "n_predict-beside-a-small-max_tokens")
]
RESPONSES_BOUNDS: dict[str, dict[str, Any]] = {
    "absent": {},
    "null": {"max_output_tokens": None},
    "huge": {"max_output_tokens": 1_000_000},
    "n_predict-forwarded": {"max_output_tokens": 3, "n_predict": 100_000},
}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, str]]:
    workdir: Path = tmp_path_factory.mktemp("presets")
    ports = {role: free_port() for role in ("standard", "gemma", "embeddings")}
    registry = example_registry(ports, roles=("standard",))
    entry = registry["models"]["standard"]
    entry["preset"] = {"max_output_tokens": CAPS[MODEL], "set": {"temperature": 0.0}}
    entry["aliases"] = [{"name": ALIAS, "preset": {"max_output_tokens": CAPS[ALIAS]}}]
    with (
        running_registry(workdir, registry) as stack,
        running_router(stack.env, workdir) as (_router, url),
    ):
        yield stack, url


def post(url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return one_shot.post(f"{url}{path}", json=body, timeout=120)


def streamed(url: str, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The events of a streamed answer, ``[DONE]`` left out."""
    events: list[dict[str, Any]] = []
    with one_shot.stream("POST", f"{url}{path}", json=body, timeout=120) as answer:
        assert answer.status_code == 200, answer.read()
        for line in answer.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[len("data: ") :]))
    return events


def stream_usage(events: list[dict[str, Any]]) -> dict[str, Any]:
    [usage] = [e["usage"] for e in events if e.get("usage")]
    assert isinstance(usage, dict)
    return usage


@pytest.mark.parametrize(("model", "bound"), CHAT_CASES)
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_chat_never_generates_past_the_cap(
    gateway: tuple[Stack, str], model: str, bound: str, stream: bool
) -> None:
    _stack, url = gateway
    body = {"model": model, "messages": [{"role": "user", "content": STORY}], **BOUNDS[bound]}
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
        events = streamed(url, "/v1/chat/completions", body)
        usage = stream_usage(events)
        reasons = [c["finish_reason"] for e in events for c in e["choices"] if c["finish_reason"]]
    else:
        answer = post(url, "/v1/chat/completions", body)
        assert answer.status_code == 200, answer.text
        usage = answer.json()["usage"]
        reasons = [c["finish_reason"] for c in answer.json()["choices"]]
    assert 0 < usage["completion_tokens"] <= CAPS[model]
    assert reasons == ["length"]


@pytest.mark.parametrize(("model", "bound"), COMPLETIONS_CASES)
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_completions_never_generate_past_the_cap(
    gateway: tuple[Stack, str], model: str, bound: str, stream: bool
) -> None:
    _stack, url = gateway
    body = {"model": model, "prompt": f"{STORY}\n\nOnce upon a time", **BOUNDS[bound]}
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
        usage = stream_usage(streamed(url, "/v1/completions", body))
    else:
        answer = post(url, "/v1/completions", body)
        assert answer.status_code == 200, answer.text
        usage = answer.json()["usage"]
    assert 0 < usage["completion_tokens"] <= CAPS[model]


@pytest.mark.parametrize(
    ("model", "bound"), [(ALIAS, bound) for bound in RESPONSES_BOUNDS] + [(MODEL, "absent")]
)
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_responses_never_generate_past_the_cap(
    gateway: tuple[Stack, str], model: str, bound: str, stream: bool
) -> None:
    _stack, url = gateway
    body = {"model": model, "input": STORY, **RESPONSES_BOUNDS[bound]}
    # The client's own bound (3 tokens, under the cap) cutting the answer is a cut; the
    # cap cutting an answer the client wanted longer is a finished turn (docs/api.md).
    status = "incomplete" if bound == "n_predict-forwarded" else "completed"
    if stream:
        events = streamed(url, "/v1/responses", {**body, "stream": True})
        [response] = [e["response"] for e in events if e["type"] == f"response.{status}"]
    else:
        answer = post(url, "/v1/responses", body)
        assert answer.status_code == 200, answer.text
        response = answer.json()
    assert response["status"] == status
    reason = {"reason": "max_output_tokens"} if status == "incomplete" else None
    assert response["incomplete_details"] == reason
    assert 0 < response["usage"]["output_tokens"] <= CAPS[model]
    assert response["max_output_tokens"] <= CAPS[model]


def test_several_choices_are_each_capped(gateway: tuple[Stack, str]) -> None:
    """``n`` choices: the cap bounds each, as max_tokens does (the entry runs two
    slots, so llama-server takes n up to 2)."""
    _stack, url = gateway
    body = {
        "model": ALIAS,
        "messages": [{"role": "user", "content": STORY}],
        "n": 2,
        "max_tokens": 100_000,
    }
    answer = post(url, "/v1/chat/completions", body)
    assert answer.status_code == 200, answer.text
    choices = answer.json()["choices"]
    assert [c["finish_reason"] for c in choices] == ["length", "length"]
    assert 0 < answer.json()["usage"]["completion_tokens"] <= 2 * CAPS[ALIAS]


def test_the_alias_and_the_id_are_one_process(gateway: tuple[Stack, str]) -> None:
    stack, url = gateway
    assert len(stack.pids()) == 1
    listed = one_shot.get(f"{url}/v1/models", timeout=5).json()["data"]
    assert [(m["id"], m.get("alias_of")) for m in listed] == [(MODEL, None), (ALIAS, MODEL)]
    answer = post(
        url,
        "/v1/chat/completions",
        {"model": ALIAS, "messages": [{"role": "user", "content": "hi"}]},
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["model"] == MODEL  # the answer names the model that served it
