"""Tool-call mistakes are the client's: every tool-call input found to make the pinned
llama-server answer 5xx (and an image or audio sent to a model without a projector) is
answered 5xx by the backend when sent to it directly, and 400 naming the field by the
gateway, which sends nothing to the backend and counts
nothing against it (no failure in the watchdog's log or counters, no restart).

Real processes: the launcher running llama-server on the default SmolLM2 GGUF twice,
once with its own chat template (no tools: llama-server's message and tool parser alone
fails) and once with Qwen3-Coder's (``tests/models/qwen3-coder-chat-template.jinja``,
copied unchanged from llama.cpp's ``models/templates/Qwen3-Coder.jinja``; the template
is Qwen's, published with the Apache-2.0-licensed Qwen3-Coder models): a template
that calls tools parses each call's arguments and builds a parser from each tool's
schema, and fails on more. The router in front of both.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests import one_shot
from tests.integration.real_stack import Stack, example_registry, running_registry
from tests.processes import ROOT, free_port, poll, running_router

# One worker runs the whole module: its module-scoped stack starts once.
pytestmark = [pytest.mark.real_model, pytest.mark.xdist_group("test_tool_call_refusals")]

PLAIN = "standard"  # SmolLM2's own template
CODER = "coder"  # SmolLM2 with Qwen3-Coder's template, which calls tools
MODEL_IDS = {PLAIN: "smollm2-135m-instruct", CODER: "smollm2-qwen3-coder-template"}
TEMPLATE = ROOT / "tests" / "models" / "qwen3-coder-chat-template.jinja"
CHAT, RESPONSES, MESSAGES = "/v1/chat/completions", "/v1/responses", "/v1/messages"

USER = {"role": "user", "content": "Weather in Paris?"}
CALL: dict[str, Any] = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": "{}"},
}
RESULT = {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}
# A 1x1 PNG, and a few bytes of audio: llama-server refuses both before decoding them.
PNG = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AA"
    "AAMBAQDJ/pLvAAAAAElFTkSuQmCC"
)
IMAGE = {"type": "image_url", "image_url": {"url": PNG}}
AUDIO = {"data": "UklGRiQAAABXQVZF", "format": "wav"}


def call(**fields: Any) -> dict[str, Any]:
    made: dict[str, Any] = {**CALL, "function": dict(CALL["function"])}
    for key, value in fields.items():
        target = made["function"] if key in ("name", "arguments") else made
        if value is ...:
            target.pop(key)
        else:
            target[key] = value
    return made


def round_trip(made: Any, result: dict[str, Any] = RESULT) -> dict[str, Any]:
    return {"messages": [USER, {"role": "assistant", "content": "", "tool_calls": made}, result]}


def tool(**function: Any) -> dict[str, Any]:
    return {
        "messages": [USER],
        "tools": [{"type": "function", "function": {"name": "f", **function}}],
    }


@dataclass(frozen=True)
class Finding:
    """An input, the backend it was found on, the route, and the field the gateway names."""

    role: str
    path: str
    body: dict[str, Any]
    param: str


FINDINGS: dict[str, Finding] = {
    # llama-server's message and tool parser: a 500 on any template.
    "arguments missing": Finding(
        PLAIN,
        CHAT,
        round_trip([call(arguments=...)]),
        "messages[1].tool_calls[0].function.arguments",
    ),
    "function missing": Finding(
        PLAIN, CHAT, round_trip([call(function=...)]), "messages[1].tool_calls[0].function"
    ),
    "function name a number": Finding(
        PLAIN, CHAT, round_trip([call(name=5)]), "messages[1].tool_calls[0].function.name"
    ),
    "call type missing": Finding(
        PLAIN, CHAT, round_trip([call(type=...)]), "messages[1].tool_calls[0].type"
    ),
    "call type custom": Finding(
        PLAIN, CHAT, round_trip([call(type="custom")]), "messages[1].tool_calls[0].type"
    ),
    "call id null": Finding(
        PLAIN, CHAT, round_trip([call(id=None)]), "messages[1].tool_calls[0].id"
    ),
    "tool_calls a string": Finding(PLAIN, CHAT, round_trip("x"), "messages[1].tool_calls"),
    "tool_calls item a string": Finding(
        PLAIN, CHAT, round_trip(["x"]), "messages[1].tool_calls[0]"
    ),
    "tool_call_id a number": Finding(
        PLAIN, CHAT, round_trip([call()], {**RESULT, "tool_call_id": 5}), "messages[2].tool_call_id"
    ),
    "tool message name a number": Finding(
        PLAIN, CHAT, round_trip([call()], {**RESULT, "name": 5}), "messages[2].name"
    ),
    "tool result text part without text": Finding(
        PLAIN,
        CHAT,
        round_trip([call()], {**RESULT, "content": [{"type": "text"}]}),
        "messages[2].content[0].text",
    ),
    "reasoning_content null": Finding(
        PLAIN,
        CHAT,
        {
            "messages": [
                USER,
                {"role": "assistant", "content": "x", "reasoning_content": None},
                USER,
            ]
        },
        "messages[1].reasoning_content",
    ),
    "role missing": Finding(PLAIN, CHAT, {"messages": [{"content": "hi"}]}, "messages[0].role"),
    "tools an object": Finding(PLAIN, CHAT, {"messages": [USER], "tools": {}}, "tools"),
    "tool type missing": Finding(
        PLAIN, CHAT, {"messages": [USER], "tools": [{"function": {"name": "f"}}]}, "tools[0].type"
    ),
    "tool in the Responses shape": Finding(
        PLAIN,
        CHAT,
        {"messages": [USER], "tools": [{"type": "function", "name": "f", "parameters": {}}]},
        "tools[0].function",
    ),
    "tool name a number": Finding(PLAIN, CHAT, tool(name=5), "tools[0].function.name"),
    "tool description null": Finding(
        PLAIN, CHAT, tool(description=None), "tools[0].function.description"
    ),
    # A template that calls tools: arguments parsed as JSON and iterated, schemas built.
    "arguments not JSON": Finding(
        CODER,
        CHAT,
        round_trip([call(arguments="{oops")]),
        "messages[1].tool_calls[0].function.arguments",
    ),
    "arguments empty": Finding(
        CODER,
        CHAT,
        round_trip([call(arguments="")]),
        "messages[1].tool_calls[0].function.arguments",
    ),
    "arguments a JSON array": Finding(
        CODER,
        CHAT,
        round_trip([call(arguments="[1]")]),
        "messages[1].tool_calls[0].function.arguments",
    ),
    "parameters a string": Finding(
        CODER, CHAT, tool(parameters="x"), "tools[0].function.parameters"
    ),
    "parameters with a $ref to nothing": Finding(
        CODER,
        CHAT,
        tool(parameters={"type": "object", "properties": {"a": {"$ref": "#/$defs/nope"}}}),
        "tools[0].function.parameters",
    ),
    "parameters with a boolean property": Finding(
        CODER,
        CHAT,
        tool(parameters={"type": "object", "properties": {"a": True}}),
        "tools[0].function.parameters",
    ),
    # The Responses API (llama-server's own /v1/responses fails on each too).
    "responses: function_call arguments not JSON": Finding(
        CODER,
        RESPONSES,
        {
            "input": [
                USER,
                {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{oops"},
                {"type": "function_call_output", "call_id": "c", "output": "x"},
            ]
        },
        "input[1].arguments",
    ),
    "responses: function tool description a number": Finding(
        PLAIN,
        RESPONSES,
        {"input": "hi", "tools": [{"type": "function", "name": "f", "description": 5}]},
        "tools[0].description",
    ),
    "responses: function tool parameters a string": Finding(
        CODER,
        RESPONSES,
        {"input": "hi", "tools": [{"type": "function", "name": "f", "parameters": "x"}]},
        "tools[0].parameters",
    ),
    # The Messages API (llama-server's own /v1/messages fails on each too).
    "messages: tool input_schema with a boolean property": Finding(
        CODER,
        MESSAGES,
        {
            "messages": [USER],
            "tools": [{"name": "f", "input_schema": {"type": "object", "properties": {"a": True}}}],
        },
        "tools[0].input_schema",
    ),
    "messages: tool input_schema with a $ref to nothing": Finding(
        CODER,
        MESSAGES,
        {
            "messages": [USER],
            "tools": [{"name": "f", "input_schema": {"properties": {"a": {"$ref": "#/nope"}}}}],
        },
        "tools[0].input_schema",
    ),
    # Media for a model that reads text only (llama-server without --mmproj).
    "an image part": Finding(
        PLAIN,
        CHAT,
        {
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "What is it?"}, IMAGE]}
            ]
        },
        "messages[0].content[1]",
    ),
    "an audio part": Finding(
        PLAIN,
        CHAT,
        {
            "messages": [
                USER,
                {"role": "assistant", "content": "Sunny."},
                {"role": "user", "content": [{"type": "input_audio", "input_audio": AUDIO}]},
            ]
        },
        "messages[2].content[0]",
    ),
    "responses: an input_image": Finding(
        PLAIN,
        RESPONSES,
        {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": PNG}]}]},
        "input[0].content[0]",
    ),
}


@dataclass
class Gateway:
    stack: Stack
    url: str

    def direct(self, role: str) -> str:
        return f"http://127.0.0.1:{self.stack.ports[role]}"

    def backend_log(self, role: str) -> Path:
        [state] = [s for s in self.stack.state() if s["role"] == role]
        return Path(state["log_path"])

    def exceptions(self, role: str) -> int:
        """Requests the backend failed on so far (llama-server logs each one)."""
        return self.backend_log(role).read_text(errors="replace").count("got exception:")

    def watchdog_events(self) -> list[str]:
        path = self.stack.workdir / "logs" / "watchdog.jsonl"
        text = path.read_text() if path.exists() else ""
        return re.findall(r'"event": ?"(backend_failure|restart_requested|restart_started)"', text)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    workdir: Path = tmp_path_factory.mktemp("toolcalls")
    ports = {role: free_port() for role in ("standard", "gemma", "embeddings", CODER)}
    registry = example_registry(ports, roles=("standard",))
    registry["models"][CODER] = {
        **registry["models"]["standard"],
        "id": MODEL_IDS[CODER],
        "port": ports[CODER],
        "chat_template_file": str(TEMPLATE),
    }
    with (
        running_registry(workdir, registry) as stack,
        running_router(stack.env, workdir) as (_router, url),
    ):
        yield Gateway(stack, url)


def body_for(finding: Finding) -> dict[str, Any]:
    bound = "max_tokens" if finding.path != RESPONSES else "max_output_tokens"
    return {"model": MODEL_IDS[finding.role], bound: 4, **finding.body}


@pytest.mark.parametrize("name", list(FINDINGS))
def test_the_backend_answers_it_5xx_and_the_gateway_400_counting_nothing(
    gateway: Gateway, name: str
) -> None:
    finding = FINDINGS[name]
    body = body_for(finding)
    failed_before = gateway.exceptions(finding.role)

    refused = one_shot.post(f"{gateway.url}{finding.path}", json=body, timeout=60)
    assert refused.status_code == 400, refused.text
    if finding.path == MESSAGES:
        assert refused.json()["type"] == "error"
        error = refused.json()["error"]
        assert error["type"] == "invalid_request_error"
        assert f"`{finding.param}`" in error["message"]
    else:
        error = refused.json()["error"]
        assert error["type"] == "invalid_request_error"
        assert error["param"] == finding.param, error

    direct = one_shot.post(f"{gateway.direct(finding.role)}{finding.path}", json=body, timeout=60)
    assert direct.status_code >= 500, direct.text[:300]

    # llama-server logs every request it fails on, in order: the direct one's line is
    # the only new one, so the gateway sent it nothing.
    poll(lambda: gateway.exceptions(finding.role) > failed_before, 10, "the backend's log line")
    assert gateway.exceptions(finding.role) == failed_before + 1
    assert gateway.watchdog_events() == []
    health = one_shot.get(f"{gateway.url}/v1/backends/health", timeout=10).json()
    assert health[finding.role]["failure_streak"] == 0
    assert health[finding.role]["restarts"] == 0


def test_a_tool_round_trip_still_reaches_both_backends(gateway: Gateway) -> None:
    for role in (PLAIN, CODER):
        body = {
            "model": MODEL_IDS[role],
            "max_tokens": 4,
            **round_trip([call(arguments='{"city": "Paris"}')]),
            "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}],
        }
        answer = one_shot.post(f"{gateway.url}{CHAT}", json=body, timeout=60)
        assert answer.status_code == 200, answer.text


def test_nothing_was_counted_against_either_backend(gateway: Gateway) -> None:
    metrics = one_shot.get(f"{gateway.url}/metrics", timeout=10).text
    failures = [
        line
        for line in metrics.splitlines()
        if line.startswith("slm_watchdog_failures_total") and not line.endswith(" 0.0")
    ]
    assert failures == []
    assert gateway.watchdog_events() == []
    assert all(s["state"] == "ready" and s["restarts"] == 0 for s in gateway.stack.state())
