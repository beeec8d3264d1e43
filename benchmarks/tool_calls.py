"""Forced tool calls on the real models (issue 42): every case of
:mod:`benchmarks.tool_cases` (100: tool sets of 1 to 20 tools, nested schemas, enums,
arrays; half ``required``, half a named tool) on each default chat model on the pinned
llama-server, through each API shape (chat completions, Responses, Messages), whole
and streamed, each answer parsed by the official SDK (``openai``, ``anthropic``) into
its typed call and its arguments validated against the tool's schema. Counted: the
answers that are a call to an allowed tool with valid arguments, the retries and
repairs the router made (whole answers name them in ``x-slm-tool-repairs``), and the
seconds per answer.

Then what the check costs: a fake llama-server answering a valid call, asked through
the router with the guard on and off (``x-slm-tool-guard``), side by side — the added
time beside the real model's median answer time — and the retry: an unrepairable call
answered again under the constraint.

    uv run python -m benchmarks.tool_calls            # about 25 minutes here
    uv run python -m benchmarks.tool_calls --cases 10 # a quick look; writes nothing
    uv run python -m benchmarks.tool_calls --cases 40 # 40 of them: about 20 minutes
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import anthropic
import httpx
import openai
from jsonschema import Draft202012Validator

from benchmarks.machine import ROOT
from benchmarks.tool_cases import Case, cases
from tests.integration.real_stack import example_registry, llama_server_bin
from tests.integration.watched import fake_entry, watched
from tests.processes import free_port

MODELS = ("smollm2-135m-instruct", "gemma-3-270m")
SHAPES = ("chat", "responses", "messages")
MAX_TOKENS = 400
SLOW_SECONDS = 30.0  # an answer this slow is named as it comes
RESULTS = ROOT / "benchmarks" / "results"


def ask(
    shape: str, stream: bool, model: str, case: Case, oc: openai.OpenAI, ac: anthropic.Anthropic
) -> tuple[str | None, str, dict[str, str]]:
    """The call the answer makes (name, arguments as JSON text) and the answer's headers
    (whole answers)."""
    content = case.prompt
    if shape == "chat":
        kwargs: dict[str, Any] = {
            "model": model,
            "messages": [{"role": "user", "content": content}],
            "tools": case.chat_tools(),
            "tool_choice": case.chat_choice(),
            "max_tokens": MAX_TOKENS,
        }
        if stream:
            name, arguments = None, ""
            for chunk in oc.chat.completions.create(**kwargs, stream=True):
                for call in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                    if call.function is not None:
                        name = name or call.function.name
                        arguments += call.function.arguments or ""
            return name, arguments, {}
        raw = oc.chat.completions.with_raw_response.create(**kwargs)
        message = raw.parse().choices[0].message
        calls = message.tool_calls or []
        if not calls or calls[0].type != "function":
            return None, message.content or "", dict(raw.headers)
        return calls[0].function.name, calls[0].function.arguments, dict(raw.headers)
    if shape == "responses":
        tools = [{"type": "function", **t["function"]} for t in case.chat_tools()]
        choice: Any = {"type": "function", "name": case.target} if case.named else "required"
        rkwargs: dict[str, Any] = {
            "model": model,
            "input": content,
            "tools": tools,
            "tool_choice": choice,
            "max_output_tokens": MAX_TOKENS,
        }
        if stream:
            with oc.responses.stream(**rkwargs) as events:
                response = events.get_final_response()
            headers: dict[str, str] = {}
        else:
            raw_r = oc.responses.with_raw_response.create(**rkwargs)
            response, headers = raw_r.parse(), dict(raw_r.headers)
        for item in response.output:
            if item.type == "function_call":
                return item.name, item.arguments, headers
        return None, "", headers
    atools = [
        {
            "name": t["function"]["name"],
            "description": t["function"]["description"],
            "input_schema": t["function"]["parameters"],
        }
        for t in case.chat_tools()
    ]
    achoice: Any = {"type": "tool", "name": case.target} if case.named else {"type": "any"}
    akwargs: dict[str, Any] = {
        "model": model,
        "max_tokens": MAX_TOKENS,
        "tools": atools,
        "tool_choice": achoice,
        "messages": [{"role": "user", "content": content}],
    }
    if stream:
        with ac.messages.stream(**akwargs) as events:
            message_a = events.get_final_message()
        headers = {}
    else:
        raw_a = ac.messages.with_raw_response.create(**akwargs)
        message_a, headers = raw_a.parse(), dict(raw_a.headers)
    for block in message_a.content:
        if block.type == "tool_use":
            return block.name, json.dumps(block.input), headers
    return None, "", headers


def judge(case: Case, name: str | None, arguments: str) -> str | None:
    """Why the answer is not a valid forced call; None when it is."""
    if name is None:
        return "no call"
    if name not in case.tools or (case.named and name != case.target):
        return f"called {name!r}"
    try:
        value = json.loads(arguments)
    except ValueError:
        return "arguments not JSON"
    errors = list(Draft202012Validator(case.schemas()[name]).iter_errors(value))
    return f"invalid: {errors[0].message}" if errors else None


def run_real(count: int, workdir: Path, say: Callable[[str], None]) -> list[dict[str, Any]]:
    registry = example_registry(
        {"standard": free_port(), "gemma": free_port(), "embeddings": 0},
        roles=("standard", "gemma"),
    )
    rows: list[dict[str, Any]] = []
    chosen = cases(count)
    with watched(workdir, registry["models"], llama_server=llama_server_bin()) as stack:
        oc = openai.OpenAI(base_url=f"{stack.url}/v1", api_key="x", max_retries=0, timeout=300)
        ac = anthropic.Anthropic(base_url=stack.url, api_key="x", max_retries=0, timeout=300)
        for model in MODELS:
            # Each case through every shape and mode in turn: the six requests are one
            # prompt to llama-server, read once and then from its prompt cache.
            seconds: dict[tuple[str, bool], list[float]] = {}
            failed: dict[tuple[str, bool], list[str]] = {}
            retried: dict[tuple[str, bool], int] = {}
            repaired: dict[tuple[str, bool], int] = {}
            for number, case in enumerate(chosen, 1):
                if number % 10 == 0:
                    say(f"  {model}: case {number} of {len(chosen)}")
                for shape in SHAPES:
                    for stream in (False, True):
                        key = (shape, stream)
                        started = time.perf_counter()
                        try:
                            name, arguments, headers = ask(shape, stream, model, case, oc, ac)
                            why = judge(case, name, arguments)
                        except (openai.APIError, anthropic.APIError) as exc:
                            # Counted, not raised: an answer that is an error is no call.
                            headers, why = {}, f"error: {str(exc)[:160]}"
                        took = time.perf_counter() - started
                        seconds.setdefault(key, []).append(took)
                        if why is not None or took > SLOW_SECONDS:
                            say(
                                f"    {model} {shape} {'stream' if stream else 'whole'} "
                                f"{case.target} ({len(case.tools)} tools): {took:.1f} s"
                                + (f", {why}" if why else "")
                            )
                        if why is not None:
                            failed.setdefault(key, []).append(f"{case.target}: {why}")
                        repairs = headers.get("x-slm-tool-repairs", "")
                        retried[key] = retried.get(key, 0) + ("retried" in repairs)
                        repaired[key] = repaired.get(key, 0) + bool(repairs)
            for shape in SHAPES:
                for stream in (False, True):
                    key = (shape, stream)
                    lost = failed.get(key, [])
                    row: dict[str, Any] = {
                        "model": model,
                        "shape": shape,
                        "stream": stream,
                        "cases": len(chosen),
                        "valid": len(chosen) - len(lost),
                        "failed": lost,
                        "retried": None if stream else retried.get(key, 0),
                        "repaired": None if stream else repaired.get(key, 0),
                        "median_seconds": statistics.median(seconds[key]),
                    }
                    say(
                        f"  {model} {shape} {'stream' if stream else 'whole'}: "
                        f"{row['valid']}/{len(chosen)} valid, median {row['median_seconds']:.2f} s"
                        + (f" — {'; '.join(lost)[:400]}" if lost else "")
                    )
                    rows.append(row)
        backend_failures = len(stack.events("backend_failure"))
    rows.append({"backend_failures": backend_failures})
    return rows


COST_REQUESTS = 200
VALID_CALL = {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}
# A call that cannot be mended (no city): asked again, the fake answering under the schema.
BROKEN_CALL = {"name": "get_weather", "arguments": '{"unit": "celsius"}'}
RETRY_ANSWER = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}'


def run_cost(requests: int, workdir: Path, say: Callable[[str], None]) -> dict[str, Any]:
    """Seconds per whole chat request with a tool call, through the router to the fake
    llama-server (published as llama-server, so the forced and retried paths are the
    real ones): the guard off, on with a valid call, on with a call asked again."""
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
                    "required": ["city"],
                },
            },
        }
    ]
    models = {"agent": fake_entry(workdir, "agent", default_timeout=30)}
    found: dict[str, Any] = {}
    with (
        watched(workdir, models, SLM_OTEL_ENABLED="false") as stack,
        httpx.Client(trust_env=False, timeout=30) as http,
    ):
        control = f"http://127.0.0.1:{stack.port('agent')}/_control"
        url = f"{stack.url}/v1/chat/completions"
        body = {
            "model": "fake-agent",
            "messages": [{"role": "user", "content": "Weather?"}],
            "tools": tools,
        }
        kinds: tuple[tuple[str, dict[str, Any], dict[str, str]], ...] = (
            ("guard_off", {"tool_calls": [VALID_CALL]}, {"x-slm-tool-guard": "off"}),
            ("valid_call", {"tool_calls": [VALID_CALL]}, {}),
            (
                "retried_call",
                {
                    "tool_calls": [BROKEN_CALL],
                    "body_lacks": "json_schema",
                    "reply": RETRY_ANSWER,
                    "chunks": 1,
                    "chunk_text": RETRY_ANSWER,
                },
                {},
            ),
        )
        for _round in range(3):
            for kind, script, headers in kinds:
                http.post(control, json=script).raise_for_status()
                for _ in range(20):  # warm
                    http.post(url, json=body, headers=headers).raise_for_status()
                times = []
                for _ in range(requests):
                    started = time.perf_counter()
                    answer = http.post(url, json=body, headers=headers)
                    times.append(time.perf_counter() - started)
                    assert answer.status_code == 200, answer.text[:200]
                    calls = answer.json()["choices"][0]["message"].get("tool_calls")
                    assert calls, answer.text[:300]
                    if kind == "retried_call":
                        assert "retried" in answer.headers.get("x-slm-tool-repairs", "")
                found.setdefault(kind, []).append(statistics.median(times))
        found["backend_failures"] = len(stack.events("backend_failure"))
    for kind, *_ in kinds:
        say(f"  {kind}: median {min(found[kind]) * 1000:.2f} ms per request (best of 3 rounds)")
    return found


def say(line: str) -> None:
    print(line, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--cases", type=int, default=100)
    parser.add_argument("--cost-only", action="store_true")
    args = parser.parse_args(argv)
    with TemporaryDirectory() as tmp:
        cost = run_cost(COST_REQUESTS, Path(tmp), say)
    if args.cost_only:
        day = time.strftime("%Y-%m-%d")
        (RESULTS / f"tool_calls_cost-{day}.json").write_text(json.dumps(cost, indent=1) + "\n")
        return 0
    with TemporaryDirectory() as tmp:
        rows = run_real(args.cases, Path(tmp), say)
    if args.cases >= 20:  # a quick look writes nothing
        day = time.strftime("%Y-%m-%d")
        rows.append(
            {"cost_ms": {k: min(v) * 1000 for k, v in cost.items() if k != "backend_failures"}}
        )
        (RESULTS / f"tool_calls-{day}.json").write_text(json.dumps(rows, indent=1) + "\n")
        lines = [
            "| model | shape | mode | valid calls | retried | repaired | median s |",
            "|---|---|---|---|---|---|---|",
        ]
        for row in rows:
            if "model" in row:
                mode = "streamed" if row["stream"] else "whole"
                retried = "—" if row["retried"] is None else row["retried"]
                repaired = "—" if row["repaired"] is None else row["repaired"]
                lines.append(
                    f"| {row['model']} | {row['shape']} | {mode} | {row['valid']}/{row['cases']} "
                    f"| {retried} | {repaired} | {row['median_seconds']:.2f} |"
                )
        lines.append(f"\nbackend_failure events: {rows[-2]['backend_failures']}")
        costs = rows[-1]["cost_ms"]
        lines.append(
            "\nThe guard's cost on the fake llama-server (median ms per whole request, best "
            "of 3 rounds): " + ", ".join(f"{k} {v:.2f}" for k, v in costs.items())
        )
        (RESULTS / f"tool_calls-{day}.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
