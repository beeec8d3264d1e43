"""An answer's calls settled before the client sees them, whole and as a stream: valid
calls exactly as written, repairable ones repaired, one that cannot be asked again
under a constraint, and what is still not a call given as text with its reason — never
a malformed call."""

from __future__ import annotations

import json
from typing import Any

import pytest

from slm_server.router.toolcalls.forcing import call_schema, constrain, forced_call
from slm_server.router.toolcalls.offer import Offer, Tool
from slm_server.router.toolcalls.settle import Verdict, settle
from slm_server.router.toolcalls.stream_guard import StreamGuard

CITY = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city"],
}
TOOLS = (Tool("get_weather", "", CITY), Tool("search", "", {}))
AUTO = Offer(TOOLS, "auto")


def native(name: str, arguments: str, call_id: str = "call_1") -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        ],
    }


def test_a_valid_call_passes_byte_for_byte() -> None:
    verdict = Verdict()
    written = '{ "city" : "Paris" ,"days":2}'
    settled = settle(native("get_weather", written), AUTO, verdict, repair=True, forced=False)
    [call] = settled.message["tool_calls"]
    assert call == {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": written},
    }
    assert settled.finish == "tool_calls" and settled.retry is None
    assert not verdict.changed and verdict.calls == 1


def test_a_repairable_call_is_repaired_and_named() -> None:
    verdict = Verdict()
    settled = settle(
        native("Get_Weather", "{'city': 'Paris', 'days': '3',}"),
        AUTO,
        verdict,
        repair=True,
        forced=False,
    )
    [call] = settled.message["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris", "days": 3}
    assert verdict.repairs == ["name", "arguments_json", "arguments_schema"]


def test_an_unrepairable_call_is_text_and_asks_for_that_tool_again() -> None:
    verdict = Verdict()
    settled = settle(native("get_weather", '{"days": 2}'), AUTO, verdict, repair=True, forced=False)
    assert "tool_calls" not in settled.message
    assert settled.message["content"] == '{"name": "get_weather", "arguments": "{\\"days\\": 2}"}'
    assert settled.finish == "stop"
    assert settled.retry == Offer(TOOLS, "named", "get_weather")
    assert verdict.failed is not None and "city" in verdict.failed


def test_a_call_to_no_offered_tool_is_text_without_a_retry_unless_one_was_required() -> None:
    message = native("launch_missiles", "{}")
    assert settle(message, AUTO, Verdict(), repair=True, forced=False).retry is None
    required = Offer(TOOLS, "required")
    assert settle(message, required, Verdict(), repair=True, forced=False).retry == required


def test_text_where_a_call_was_required_asks_again() -> None:
    verdict = Verdict()
    required = Offer(TOOLS, "required")
    settled = settle(
        {"role": "assistant", "content": "It is sunny."},
        required,
        verdict,
        repair=True,
        forced=False,
    )
    assert settled.message["content"] == "It is sunny." and settled.retry == required
    assert verdict.failed == "the model answered text, not a call"


def test_plain_text_under_auto_is_left_alone() -> None:
    message = {"role": "assistant", "content": "It is sunny."}
    settled = settle(message, AUTO, Verdict(), repair=True, forced=False)
    assert settled.message is message and settled.finish is None


def test_a_forced_answers_json_is_the_call() -> None:
    forced = Offer(TOOLS, "required")
    text = '{"name": "get_weather", "arguments": {"city": "Rome"}}'
    settled = settle(
        {"role": "assistant", "content": text}, forced, Verdict(), repair=True, forced=True
    )
    [call] = settled.message["tool_calls"]
    assert settled.message["content"] is None
    assert (call["function"]["name"], json.loads(call["function"]["arguments"])) == (
        "get_weather",
        {"city": "Rome"},
    )
    assert forced_call("not json") is None and forced_call('{"arguments": {}}') is None


def test_with_repair_off_calls_pass_as_written() -> None:
    settled = settle(native("get_weather", "{'bad'"), AUTO, Verdict(), repair=False, forced=False)
    assert settled.message["tool_calls"][0]["function"]["arguments"] == "{'bad'"


def test_the_forced_schema_allows_only_the_offered_calls() -> None:
    from jsonschema import Draft202012Validator

    schema = call_schema(Offer(TOOLS, "required"))
    valid = Draft202012Validator(schema).is_valid
    assert valid({"name": "get_weather", "arguments": {"city": "x"}})
    assert valid({"name": "search", "arguments": {"anything": 1}})
    assert not valid({"name": "get_weather", "arguments": {"days": 1}})
    assert not valid({"name": "other", "arguments": {}})
    named = call_schema(Offer(TOOLS, "named", "search"))
    assert named["properties"]["name"] == {"const": "search"}
    # A keyword the grammar conversion does not read: constrained to an object, checked after.
    odd = Offer((Tool("t", "", {"type": "object", "patternProperties": {"^x": {}}}),), "required")
    assert call_schema(odd)["properties"]["arguments"] == {"type": "object"}
    request = constrain(
        {"messages": [], "grammar": "root ::= x", "response_format": {"type": "text"}}, odd
    )
    assert "grammar" not in request and request["response_format"]["type"] == "json_schema"


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "c",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def run(
    guard: StreamGuard, chunks: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """What went out as the chunks came, and what the settled end sends."""
    live = [out for c in chunks for out in guard.feed(c)]
    return live, guard.finish(guard.settle())


def test_a_stream_sends_text_at_once_and_a_held_call_whole_at_the_end() -> None:
    guard = StreamGuard(AUTO, Verdict(), repair=True, forced=False)
    pieces = ['{"ci', 'ty": "Pa', 'ris"}']
    chunks = [chunk({"role": "assistant", "content": "Let me check."})]
    chunks.append(
        chunk(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call_9",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": ""},
                    }
                ]
            }
        )
    )
    chunks += [chunk({"tool_calls": [{"index": 0, "function": {"arguments": p}}]}) for p in pieces]
    chunks.append(chunk({}, "tool_calls"))
    chunks.append({"id": "c", "choices": [], "usage": {"prompt_tokens": 3}})
    live, end = run(guard, chunks)
    assert [c["choices"][0]["delta"] for c in live] == [
        {"role": "assistant", "content": "Let me check."}
    ]
    assert end[0]["choices"][0]["delta"] == {
        "tool_calls": [
            {
                "index": 0,
                "id": "call_9",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ]
    }
    assert end[1]["choices"][0]["finish_reason"] == "tool_calls"
    assert end[2] == {"id": "c", "choices": [], "usage": {"prompt_tokens": 3}}


def test_a_stream_holds_text_from_a_tag_and_gives_back_what_is_not_a_call() -> None:
    guard = StreamGuard(AUTO, Verdict(), repair=True, forced=False)
    texts = ["Sure", " <tool", '_call>{"name": "search", "arguments": {}}', "</tool_call>"]
    live, end = run(guard, [chunk({"content": t}) for t in texts] + [chunk({}, "stop")])
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in live) == "Sure "
    assert all("content" not in c["choices"][0]["delta"] for c in end)
    calls = [
        c["choices"][0]["delta"]["tool_calls"][0]
        for c in end
        if "tool_calls" in c["choices"][0]["delta"]
    ]
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == [
        ("search", "{}")
    ]
    assert end[-1]["choices"][0]["finish_reason"] == "tool_calls"

    plain = StreamGuard(AUTO, Verdict(), repair=True, forced=False)
    live, end = run(plain, [chunk({"content": t}) for t in ("a <to", "o> b")] + [chunk({}, "stop")])
    shown = "".join(c["choices"][0]["delta"].get("content", "") for c in live + end)
    assert shown == "a <too> b"
    assert end[-1]["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize("finish", [None, "length"])
def test_a_forced_stream_holds_everything_and_ends_with_the_call(finish: str | None) -> None:
    guard = StreamGuard(Offer(TOOLS, "required"), Verdict(), repair=True, forced=True)
    texts = ['{"name": "get_', 'weather", "arguments": {"city": "Oslo"}}']
    ending = [chunk({}, finish)] if finish else []  # a stream cut before its finish too
    live, end = run(
        guard, [chunk({"role": "assistant"})] + [chunk({"content": t}) for t in texts] + ending
    )
    assert [c["choices"][0]["delta"] for c in live] == [{"role": "assistant"}]
    [call] = [
        c["choices"][0]["delta"]["tool_calls"][0]
        for c in end
        if "tool_calls" in c["choices"][0]["delta"]
    ]
    assert json.loads(call["function"]["arguments"]) == {"city": "Oslo"}
    assert end[-1]["choices"][0]["finish_reason"] == "tool_calls"
