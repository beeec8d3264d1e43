"""Tool calls in a translated Responses stream (:mod:`slm_server.router.apis.responses.events`):
a namespace's function streams as a ``function_call`` with its namespace, a custom tool's
call as a ``custom_tool_call`` whose input streams decoded, every event checked strictly
against the openai package's types."""

from __future__ import annotations

import json
from typing import Any

from openai.types.responses import (
    ResponseCustomToolCall,
    ResponseFunctionToolCall,
    ResponseStreamEvent,
)

from slm_server.router.apis.responses.events import ResponseStreamTranslator
from slm_server.router.apis.responses.from_chat import build_response
from tests.openai_shapes import strict_events

MODEL = "smollm2-135m-instruct"
REQUEST = {
    "model": MODEL,
    "input": "go",
    "stream": True,
    "tools": [
        {"type": "custom", "name": "apply_patch"},
        {
            "type": "namespace",
            "name": "crm",
            "description": "The CRM",
            "tools": [
                {"type": "function", "name": "lookup"},
                {"type": "custom", "name": "note"},
            ],
        },
        {"type": "web_search"},
    ],
}
PATCH = '*** Begin Patch\n+print("hi")\n*** End Patch'


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "model.gguf",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def call_chunk(index: int, arguments: str, name: str | None = None) -> dict[str, Any]:
    call: dict[str, Any] = {"index": index, "function": {"arguments": arguments}}
    if name is not None:
        call.update(id=f"call_{index}", type="function")
        call["function"]["name"] = name
    return chunk({"tool_calls": [call]})


def pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def run(
    chunks: list[dict[str, Any]], request: dict[str, Any] = REQUEST
) -> list[ResponseStreamEvent]:
    translator = ResponseStreamTranslator(request)
    raw = translator.start()
    for one in chunks:
        raw += translator.feed(one)
    raw += translator.finish()
    payloads = [json.loads(frame.split(b"\ndata: ", 1)[1]) for frame in raw]
    return strict_events(payloads)


def test_a_custom_tool_call_streams_its_input_decoded() -> None:
    arguments = json.dumps({"input": PATCH})
    chunks = [call_chunk(0, "", "apply_patch")]
    chunks += [call_chunk(0, piece) for piece in pieces(arguments, 4)]
    chunks.append(chunk({}, "tool_calls"))
    events = run(chunks)
    kinds = [e.type for e in events]
    assert "response.function_call_arguments.delta" not in kinds
    deltas = [e.delta for e in events if e.type == "response.custom_tool_call_input.delta"]
    assert len(deltas) > 5
    assert "".join(deltas) == PATCH
    [done] = [e for e in events if e.type == "response.custom_tool_call_input.done"]
    assert done.input == PATCH
    added = next(e for e in events if e.type == "response.output_item.added")
    assert isinstance(added.item, ResponseCustomToolCall)
    assert added.item.input == ""
    final = events[-1]
    assert final.type == "response.completed"
    [item] = final.response.output
    assert isinstance(item, ResponseCustomToolCall)
    assert (item.name, item.input, item.call_id) == ("apply_patch", PATCH, "call_0")
    assert done.item_id == item.id == added.item.id


def test_a_namespace_s_tools_stream_with_their_namespace() -> None:
    note = json.dumps({"input": "called"})
    chunks = [
        chunk({"content": "Let me check."}),
        call_chunk(0, '{"q": ', "crm__lookup"),
        call_chunk(0, '"ACME"}'),
        call_chunk(1, note[:5], "crm__note"),
        call_chunk(1, note[5:]),
        chunk({}, "tool_calls"),
    ]
    events = run(chunks)
    output = events[-1].response.output  # type: ignore[union-attr]
    message, lookup, noted = output
    assert message.type == "message"
    assert isinstance(lookup, ResponseFunctionToolCall)
    assert (lookup.namespace, lookup.name, lookup.arguments) == ("crm", "lookup", '{"q": "ACME"}')
    assert isinstance(noted, ResponseCustomToolCall)
    assert (noted.namespace, noted.name, noted.input) == ("crm", "note", "called")
    [args_done] = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert args_done.name == "lookup"
    added = [e.item for e in events if e.type == "response.output_item.added"]
    assert [getattr(i, "namespace", None) for i in added] == [None, "crm", "crm"]


def test_arguments_of_another_shape_give_the_input_in_one_delta_at_the_end() -> None:
    chunks = [call_chunk(0, '{"patch"', "apply_patch"), call_chunk(0, ': "x"}'), chunk({}, "stop")]
    events = run(chunks)
    deltas = [e.delta for e in events if e.type == "response.custom_tool_call_input.delta"]
    assert deltas == ["x"]


def test_a_failed_stream_keeps_the_custom_call_so_far() -> None:
    translator = ResponseStreamTranslator(REQUEST)
    raw = translator.start()
    raw += translator.feed(call_chunk(0, '{"input": "par', "apply_patch"))
    raw += translator.error("backend went away")
    events = strict_events([json.loads(f.split(b"\ndata: ", 1)[1]) for f in raw])
    assert events[-1].type == "response.failed"
    [item] = events[-1].response.output
    assert isinstance(item, ResponseCustomToolCall)
    assert item.input == "par"


def test_every_response_event_carries_the_whole_object_with_its_settings_spliced_in() -> None:
    """The echoed settings are serialised once per stream and spliced into each event
    that carries the response: the object is still the one build_response gives, keys
    in the same order, in created, in_progress and the last event (completed or failed)."""
    request = {**REQUEST, "instructions": "Be brief.\n" * 50, "temperature": 0.2, "user": "u"}
    for ending in ("finish", "error"):
        translator = ResponseStreamTranslator(request)
        raw = translator.start() + translator.feed(chunk({"content": "hi"}, "stop"))
        raw += translator.finish() if ending == "finish" else translator.error("gone")
        payloads = [json.loads(frame.split(b"\ndata: ", 1)[1]) for frame in raw]
        carrying = [p for p in payloads if "response" in p]
        assert [p["type"] for p in carrying][:2] == ["response.created", "response.in_progress"]
        assert len(carrying) == 3
        for payload in carrying:
            response = payload["response"]
            built = build_response(
                request,
                response_id=response["id"],
                created_at=response["created_at"],
                status=response["status"],
                output=response["output"],
                usage=response["usage"],
                incomplete=(response["incomplete_details"] or {}).get("reason"),
                error=response["error"],
            )
            built["completed_at"] = response["completed_at"]
            assert list(payload) == ["type", "sequence_number", "response"]
            assert list(response) == list(built)
            assert response == json.loads(json.dumps(built))
        strict_events(payloads)
