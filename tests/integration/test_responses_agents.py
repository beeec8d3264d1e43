"""The Responses API as coding agents use it, through the router on a real socket: the
official ``openai`` SDK (``responses.create``, streamed and not, and
``responses.stream()``) and the openai-agents SDK (an agent run through
``OpenAIResponsesModel``) with a namespace's tool, a custom tool and a hosted tool,
against a fake backend that answers with tool calls, and once against the real
llama-server. Every answer and every event is validated strictly against the openai
package's types; the hosted tool is left out and named in ``x-slm-dropped-tools``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types.responses import (
    ResponseCustomToolCall,
    ResponseFunctionToolCall,
    ToolParam,
)

from tests import one_shot
from tests.fakes.control import FakeBackend
from tests.integration.real_stack import running_backends
from tests.openai_shapes import strict_events, strict_response
from tests.processes import RunningRouter, StartRouter, running_router
from tests.registry_entries import registry_entry

# Its module-scoped stack starts once: one worker runs the whole module.
pytestmark = pytest.mark.xdist_group("test_responses_agents")

FAKE_ROLES = ("agent",)
MODEL = "agent"
PATCH = "*** Begin Patch\n*** Add File: hello.py\n+print('hi')\n*** End Patch"
TOOLS: list[ToolParam] = [
    {
        "type": "function",
        "name": "exec_command",
        "description": "Run a shell command",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
        "strict": False,
    },
    {
        "type": "namespace",
        "name": "crm",
        "description": "The customer database",
        "tools": [
            {
                "type": "function",
                "name": "lookup",
                "description": "Find a customer by name",
                "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
                "strict": False,
            }
        ],
    },
    {"type": "custom", "name": "apply_patch", "description": "Edit files with a patch"},
    {"type": "web_search"},
]
CALLS = [
    {"name": "crm__lookup", "arguments": '{"q": "ACME"}'},
    {"name": "apply_patch", "arguments": json.dumps({"input": PATCH})},
]


@pytest.fixture(scope="module")
def router_process(fakes: dict[str, FakeBackend], start_router: StartRouter) -> RunningRouter:
    return start_router({"agent": registry_entry("agent", fakes["agent"].port)})


@pytest.fixture
def client(router: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{router}/v1", api_key="x", max_retries=0) as sdk:
        yield sdk


def check_calls(output: list[Any]) -> None:
    lookup, patch = output
    assert isinstance(lookup, ResponseFunctionToolCall)
    assert (lookup.namespace, lookup.name, lookup.arguments) == ("crm", "lookup", '{"q": "ACME"}')
    assert isinstance(patch, ResponseCustomToolCall)
    assert (patch.name, patch.input, patch.namespace) == ("apply_patch", PATCH, None)


def test_the_sdk_gets_namespaced_and_custom_calls_and_the_hosted_tool_is_named(
    client: openai.OpenAI, fake: FakeBackend
) -> None:
    fake.script(tool_calls=CALLS)
    raw = client.responses.with_raw_response.create(model=MODEL, input="Look up ACME", tools=TOOLS)
    assert raw.headers["x-slm-dropped-tools"] == "web_search"
    strict_response(json.loads(raw.text))
    response = raw.parse()
    assert response.status == "completed"
    check_calls(response.output)
    [sent] = fake.requests()
    offered = [t["function"]["name"] for t in sent["body"]["tools"]]
    assert offered == ["exec_command", "crm__lookup", "apply_patch"]


@pytest.mark.parametrize("guard", ["on", "off"])
def test_every_streamed_event_is_strictly_typed_and_the_custom_input_streams(
    router: str, client: openai.OpenAI, fake: FakeBackend, guard: str
) -> None:
    """Strictly typed events; the custom tool's input is released once the call is
    checked (in one piece), or as it comes with the guard off for the request."""
    fake.script(tool_calls=CALLS)
    body = {"model": MODEL, "input": "Look up ACME", "tools": TOOLS, "stream": True}
    headers = {"x-slm-tool-guard": guard}
    with one_shot.stream(
        "POST", f"{router}/v1/responses", json=body, headers=headers, timeout=30
    ) as streamed:
        assert streamed.headers["x-slm-dropped-tools"] == "web_search"
        lines = [line[5:] for line in streamed.iter_lines() if line.startswith("data:")]
    events = strict_events([json.loads(line) for line in lines])
    deltas = [e.delta for e in events if e.type == "response.custom_tool_call_input.delta"]
    assert len(deltas) > 3 if guard == "off" else len(deltas) == 1
    assert "".join(deltas) == PATCH
    arguments = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    assert "".join(arguments) == '{"q": "ACME"}'
    final = events[-1]
    assert final.type == "response.completed"
    check_calls(final.response.output)

    sdk_events = list(
        client.responses.create(
            model=MODEL, input="again", tools=TOOLS, stream=True, extra_headers=headers
        )
    )
    assert [e.type for e in sdk_events] == [e.type for e in events]

    with client.responses.stream(
        model=MODEL, input="again", tools=TOOLS, extra_headers=headers
    ) as stream:
        for _event in stream:
            pass
        check_calls(stream.get_final_response().output)


def test_a_history_of_namespaced_and_custom_calls_goes_back_to_the_model(
    client: openai.OpenAI, fake: FakeBackend
) -> None:
    fake.script(reply="Done: ACME is patched.")
    response = client.responses.create(
        model=MODEL,
        tools=TOOLS,
        input=[
            {"role": "developer", "content": "You are in a sandbox."},
            {"role": "user", "content": "Look up ACME and patch"},
            {
                "type": "function_call",
                "call_id": "call_1",
                "namespace": "crm",
                "name": "lookup",
                "arguments": '{"q": "ACME"}',
            },
            {"type": "function_call_output", "call_id": "call_1", "output": "ACME Corp"},
            {
                "type": "custom_tool_call",
                "call_id": "call_2",
                "name": "apply_patch",
                "input": PATCH,
            },
            {"type": "custom_tool_call_output", "call_id": "call_2", "output": "Applied"},
        ],
    )
    assert response.output_text == "Done: ACME is patched."
    [sent] = fake.requests()
    messages = sent["body"]["messages"]
    assert messages[0] == {"role": "system", "content": "You are in a sandbox."}
    assert messages[2]["tool_calls"][0]["function"]["name"] == "crm__lookup"
    patch_call = messages[4]["tool_calls"][0]["function"]
    assert (patch_call["name"], json.loads(patch_call["arguments"])) == (
        "apply_patch",
        {"input": PATCH},
    )
    assert messages[5] == {"role": "tool", "tool_call_id": "call_2", "content": "Applied"}


def test_codex_s_first_request_is_served(http: httpx.Client, fake: FakeBackend) -> None:
    """What Codex CLI sends first over a custom provider (issue 31), as it sends it."""
    body = {
        "model": MODEL,
        "instructions": "You are Codex.",
        "input": [
            {
                "type": "message",
                "role": "developer",
                "content": [{"type": "input_text", "text": "Sandbox"}],
            },
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
        ],
        "tools": [*TOOLS[:3], {"type": "web_search", "external_web_access": False}],
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "reasoning": {"effort": "medium", "summary": "auto"},
        "store": False,
        "stream": True,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "0199a7c4-5a1e-7d2f-9b6c-codex-session",
        "client_metadata": {"x-codex-installation-id": "0199"},
        "text": {"verbosity": "low"},
    }
    response = http.post("/v1/responses", json=body)
    assert response.status_code == 200
    assert response.headers["x-slm-dropped-tools"] == "web_search"
    lines = [line[5:] for line in response.text.splitlines() if line.startswith("data:")]
    assert [e.type for e in strict_events([json.loads(x) for x in lines])][
        -1
    ] == "response.completed"
    [sent] = fake.requests()
    for dropped in ("include", "reasoning", "store", "prompt_cache_key", "client_metadata"):
        assert dropped not in sent["body"]
    assert sent["body"]["parallel_tool_calls"] is False


def test_what_still_cannot_be_served_is_refused_naming_the_field(
    http: httpx.Client, fake: FakeBackend
) -> None:
    body = {"model": MODEL, "input": "hi", "tools": [{"type": "local_shell"}]}
    response = http.post("/v1/responses", json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", "tools[0].type")
    assert fake.requests() == []


@pytest.mark.parametrize("streamed", [False, True])
def test_an_openai_agents_sdk_agent_runs_its_tools_through_the_router(
    router: str, fake: FakeBackend, streamed: bool
) -> None:
    """An agent with a namespaced function tool, a custom tool and the hosted web search,
    run through ``OpenAIResponsesModel`` (``Runner.run``, and ``Runner.run_streamed``
    with every event read): the model's calls reach the right tools, their outputs go
    back, and the run ends with the model's answer."""
    import asyncio

    from agents import (
        Agent,
        CustomTool,
        OpenAIResponsesModel,
        RunConfig,
        Runner,
        WebSearchTool,
        function_tool,
        set_tracing_disabled,
        tool_namespace,
    )

    set_tracing_disabled(True)
    seen: dict[str, str] = {}

    @function_tool
    def lookup(q: str) -> str:
        """Find a customer by name."""
        seen["lookup"] = q
        return f"{q} Corp, since 1907"

    def apply(_context: Any, text: str) -> str:
        seen["apply_patch"] = text
        return "Applied"

    crm = tool_namespace(name="crm", description="The customer database", tools=[lookup])
    patcher = CustomTool(name="apply_patch", description="Edit files", on_invoke_tool=apply)
    fake.script(tool_calls=CALLS, body_lacks="tool_call_id", reply="Done.")

    async def run() -> Any:
        async with openai.AsyncOpenAI(base_url=f"{router}/v1", api_key="x", max_retries=0) as sdk:
            agent = Agent(
                name="clerk",
                instructions="Use the tools.",
                tools=[*crm, patcher, WebSearchTool()],
                model=OpenAIResponsesModel(model=MODEL, openai_client=sdk),
            )
            config = RunConfig(tracing_disabled=True)
            if not streamed:
                return await Runner.run(agent, "Look up ACME and patch", run_config=config)
            running = Runner.run_streamed(agent, "Look up ACME and patch", run_config=config)
            kinds = [event.type async for event in running.stream_events()]
            assert "raw_response_event" in kinds
            return running

    result = asyncio.run(run())
    assert seen == {"lookup": "ACME", "apply_patch": PATCH}
    # The fake's text answer: its reply whole, its chunks streamed.
    assert result.final_output == ("tok " * 8 if streamed else "Done.")
    first, second = fake.requests()
    assert first["body"].get("stream", False) is streamed
    assert [t["function"]["name"] for t in first["body"]["tools"]] == ["crm__lookup", "apply_patch"]
    tool_messages = [m for m in second["body"]["messages"] if m["role"] == "tool"]
    assert [m["content"] for m in tool_messages] == ["ACME Corp, since 1907", "Applied"]


@pytest.mark.real_model
def test_the_real_llama_server_serves_an_agent_s_turns(tmp_path: Path) -> None:
    """The default chat model on the pinned llama-server, given Codex's tool shapes: the
    first turn streamed and a later one carrying namespaced and custom calls and their
    outputs, each answered 200 and strictly typed, the hosted tool named. (The default
    models' chat templates have no tool support, and the pinned llama-server then
    ignores ``tools``: the model answers in text; the calls' own mapping is proven
    against the fake above.)"""
    with (
        running_backends(tmp_path, roles=("standard",)) as stack,
        running_router(stack.env, tmp_path) as (_router, url),
        openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0) as sdk,
    ):
        model = "smollm2-135m-instruct"
        body = {
            "model": model,
            "instructions": "You are a coding agent.",
            "input": [
                {"role": "developer", "content": "Answer briefly."},
                {"role": "user", "content": "Look up the customer ACME."},
            ],
            "tools": TOOLS,
            "reasoning": {"summary": "auto"},
            "include": ["reasoning.encrypted_content"],
            "store": False,
            "prompt_cache_key": "session-1",
            "max_output_tokens": 16,
            "temperature": 0,
            "stream": True,
        }
        with one_shot.stream("POST", f"{url}/v1/responses", json=body, timeout=120) as streamed:
            assert streamed.status_code == 200
            assert streamed.headers["x-slm-dropped-tools"] == "web_search"
            lines = [line[5:] for line in streamed.iter_lines() if line.startswith("data:")]
        events = strict_events([json.loads(line) for line in lines])
        assert events[-1].type in ("response.completed", "response.incomplete")
        later = sdk.responses.with_raw_response.create(
            model=model,
            tools=TOOLS,
            max_output_tokens=16,
            temperature=0,
            input=[
                {"role": "user", "content": "Look up ACME and add hello.py."},
                {
                    "type": "function_call",
                    "call_id": "call_1",
                    "namespace": "crm",
                    "name": "lookup",
                    "arguments": '{"q": "ACME"}',
                },
                {"type": "function_call_output", "call_id": "call_1", "output": "ACME Corp"},
                {
                    "type": "custom_tool_call",
                    "call_id": "call_2",
                    "name": "apply_patch",
                    "input": PATCH,
                },
                {"type": "custom_tool_call_output", "call_id": "call_2", "output": "Applied"},
            ],
        )
        assert later.headers["x-slm-dropped-tools"] == "web_search"
        response = strict_response(json.loads(later.text))
        assert response.status in ("completed", "incomplete")
        for item in response.output:  # SmolLM2 may well end its turn at once
            assert item.type in ("message", "reasoning", "function_call", "custom_tool_call")
