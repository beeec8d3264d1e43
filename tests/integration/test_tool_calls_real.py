"""Forced tool calls on the real llama-server with both default chat models (issue 42):
neither model's template takes tools, so the router writes them into the prompt, and a
``required`` or named ``tool_choice`` is decoded under the tools' own schemas. Through
each API shape (chat completions, Responses, Messages), whole and streamed, each answer
parsed by the official SDK into its typed call: a call to an allowed tool whose
arguments validate. A sample of :mod:`benchmarks.tool_cases` (the benchmark
``benchmarks.tool_calls`` runs all 100 on each); nothing of it counts against the
backends."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import jsonschema
import openai
import pytest

from benchmarks.tool_calls import MODELS, SHAPES, ask, judge
from benchmarks.tool_cases import cases
from tests import one_shot
from tests.integration.real_stack import example_registry, llama_server_bin
from tests.integration.watched import Watched, watched
from tests.processes import free_port

pytestmark = [pytest.mark.real_model, pytest.mark.xdist_group("test_tool_calls_real")]

# One case for each model, shape and mode (required and named in turn): tool sets of 1
# to 12 tools.
SAMPLE = cases(12)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Watched]:
    registry = example_registry(
        {"standard": free_port(), "gemma": free_port(), "embeddings": 0},
        roles=("standard", "gemma"),
    )
    tmp: Path = tmp_path_factory.mktemp("tool-calls-real")
    with watched(tmp, registry["models"], llama_server=llama_server_bin()) as running:
        yield running


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("model", MODELS)
def test_a_required_or_named_call_is_a_valid_call_to_an_offered_tool(
    stack: Watched, model: str, shape: str, stream: bool
) -> None:
    case = SAMPLE[MODELS.index(model) * 6 + SHAPES.index(shape) * 2 + stream]
    oc = openai.OpenAI(base_url=f"{stack.url}/v1", api_key="x", max_retries=0, timeout=120)
    ac = anthropic.Anthropic(base_url=stack.url, api_key="x", max_retries=0, timeout=120)
    name, arguments, _headers = ask(shape, stream, model, case, oc, ac)
    assert judge(case, name, arguments) is None, (case, name, arguments)
    assert not stack.events("backend_failure")


def test_the_templates_take_no_tools_so_the_router_renders_them(stack: Watched) -> None:
    """What ``auto`` chose, as llama-server says it: both templates take no tools."""
    for role in ("standard", "gemma"):
        props = one_shot.get(f"http://127.0.0.1:{stack.port(role)}/props", timeout=10).json()
        assert props["chat_template_caps"]["supports_tools"] is False


def test_gemmas_template_keeps_turns_alternating(stack: Watched) -> None:
    """Gemma's turns alternate: what comes after the user's text on the user's side (a
    later system message, as Claude Code sends its environment; tool results rendered
    as text) joins the user's turn instead of opening one the model would answer in
    the user's place. A conversation that alternates is rendered as before."""
    url = f"http://127.0.0.1:{stack.port('gemma')}/apply-template"

    def prompt(*messages: tuple[str, str]) -> str:
        turns = [{"role": role, "content": content} for role, content in messages]
        found = one_shot.post(url, json={"messages": turns}, timeout=10).json()["prompt"]
        assert isinstance(found, str)
        return found

    assert prompt(("system", "Be brief."), ("user", "Hi"), ("system", "Today is Monday.")) == (
        "<start_of_turn>user\nBe brief.\n\nHi\n\nToday is Monday.<end_of_turn>\n"
        "<start_of_turn>model\n"
    )
    assert prompt(("user", "Hi"), ("assistant", "Hello"), ("user", "a"), ("user", "b")) == (
        "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\nHello<end_of_turn>\n"
        "<start_of_turn>user\na\n\nb<end_of_turn>\n<start_of_turn>model\n"
    )


def test_a_tool_whose_parameters_use_defs_is_forced_on_llama_server(stack: Watched) -> None:
    """Parameters as pydantic writes them (``$defs`` and ``$ref``, as the openai-agents
    SDK sends a model's tools): llama.cpp reads the call's schema from its root, so the
    references are made ones into it, and the call validates."""
    parameters: dict[str, Any] = {
        "$defs": {
            "Person": {
                "type": "object",
                "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                "required": ["name"],
            }
        },
        "type": "object",
        "properties": {"person": {"$ref": "#/$defs/Person"}},
        "required": ["person"],
    }
    oc = openai.OpenAI(base_url=f"{stack.url}/v1", api_key="x", max_retries=0, timeout=120)
    answer = oc.chat.completions.create(
        model="gemma-3-270m",
        messages=[{"role": "user", "content": "Add Ada, who is 36, to the team."}],
        tools=[{"type": "function", "function": {"name": "add_member", "parameters": parameters}}],
        tool_choice="required",
        max_tokens=200,
    )
    calls = answer.choices[0].message.tool_calls or []
    assert len(calls) == 1 and calls[0].type == "function", answer
    assert calls[0].function.name == "add_member"
    jsonschema.validate(json.loads(calls[0].function.arguments), parameters)
