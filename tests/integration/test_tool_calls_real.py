"""Forced tool calls on the real llama-server with both default chat models (issue 42):
neither model's template takes tools, so the router writes them into the prompt, and a
``required`` or named ``tool_choice`` is decoded under the tools' own schemas. Through
each API shape (chat completions, Responses, Messages), whole and streamed, each answer
parsed by the official SDK into its typed call: a call to an allowed tool whose
arguments validate. A sample of :mod:`benchmarks.tool_cases` (the benchmark
``benchmarks.tool_calls`` runs all 100 on each); nothing of it counts against the
backends."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anthropic
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
