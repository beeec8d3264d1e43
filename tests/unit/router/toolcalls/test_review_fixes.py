"""What a review of the guard found, each held to: a call cut off at the token limit is
not passed as whole, a named choice is not met by renaming another offered tool, valid
calls survive beside one that cannot be had, ``parallel_tool_calls: false`` keeps one
call, the client's messages are never changed, the grammar leaves out what llama.cpp
cannot read, long broken text is not mended on the event loop, and a stream that errors
keeps the text it held."""

from __future__ import annotations

import copy
import json
import time
from typing import Any

import jsonschema
import pytest

from slm_server.registry.tools import ToolPolicy
from slm_server.router.toolcalls import forcing, repair
from slm_server.router.toolcalls.extract import extract_calls
from slm_server.router.toolcalls.forcing import call_schema
from slm_server.router.toolcalls.guard import tool_guard
from slm_server.router.toolcalls.offer import Offer, Tool, offer_of
from slm_server.router.toolcalls.render import render_request
from slm_server.router.toolcalls.settle import Verdict, settle
from slm_server.router.toolcalls.stream_guard import StreamGuard

CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = (Tool("get_weather", "", CITY), Tool("set_weather", "", CITY), Tool("now", "", {}))


def calls(*pairs: tuple[str, str]) -> dict[str, Any]:
    return {
        "role": "assistant",
        "tool_calls": [
            {"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": a}}
            for i, (n, a) in enumerate(pairs)
        ],
    }


def test_a_call_cut_off_at_the_token_limit_is_asked_again_not_closed() -> None:
    message = calls(("get_weather", '{"city": "Par'))
    whole = settle(message, Offer(TOOLS, "auto"), Verdict(), repair=True, forced=False)
    assert json.loads(whole.message["tool_calls"][0]["function"]["arguments"]) == {"city": "Par"}
    verdict = Verdict()
    cut = settle(message, Offer(TOOLS, "auto"), verdict, repair=True, forced=False, cut=True)
    assert "tool_calls" not in cut.message and cut.retry is not None
    assert verdict.failed == "the call was cut off at the token limit"
    # Decoded under the grammar, only the last value was cut: closed, and said so.
    forced = Offer(TOOLS, "required")
    text = {"role": "assistant", "content": '{"name": "get_weather", "arguments": {"city": "Par'}
    verdict = Verdict()
    closed = settle(text, forced, verdict, repair=True, forced=True, cut=True)
    assert closed.finish == "tool_calls" and "cut" in verdict.repairs


def test_a_named_choice_is_not_met_by_renaming_another_offered_tool() -> None:
    named = Offer(TOOLS, "named", "get_weather")
    settled = settle(
        calls(("set_weather", '{"city": "x"}')), named, Verdict(), repair=True, forced=False
    )
    assert "tool_calls" not in settled.message
    assert settled.retry == named


def test_valid_calls_go_on_beside_a_call_to_no_offered_tool() -> None:
    verdict = Verdict()
    message = calls(("get_weather", '{"city": "Oslo"}'), ("launch", "{}"))
    settled = settle(message, Offer(TOOLS, "auto"), verdict, repair=True, forced=False)
    assert [c["function"]["name"] for c in settled.message["tool_calls"]] == ["get_weather"]
    assert settled.finish == "tool_calls" and "dropped" in verdict.repairs


def test_without_parallel_calls_only_the_first_is_kept_and_the_prompt_says_one() -> None:
    offer = Offer(TOOLS, "auto", None, parallel=False)
    message = calls(("get_weather", '{"city": "Oslo"}'), ("now", "{}"))
    settled = settle(message, offer, Verdict(), repair=True, forced=False)
    assert [c["function"]["name"] for c in settled.message["tool_calls"]] == ["get_weather"]
    chat = {"messages": [], "tools": [{"type": "function", "function": {"name": "now"}}]}
    parsed = offer_of({**chat, "parallel_tool_calls": False})
    assert parsed is not None and not parsed.parallel
    system = render_request(chat, parsed)["messages"][0]["content"]
    assert "Call at most one function" in system


def test_the_clients_messages_are_never_changed_whatever_keys_they_carry() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": None, "_results": True},
        {"role": "tool", "tool_call_id": "a", "content": "one"},
        {"role": "tool", "tool_call_id": "b", "content": "two"},
        {"role": "user", "content": "next"},
    ]
    chat = {"messages": messages, "tools": [{"type": "function", "function": {"name": "now"}}]}
    before = copy.deepcopy(chat)
    offer = offer_of(chat)
    assert offer is not None
    turns = render_request(chat, offer)["messages"]
    assert chat == before
    assert [t["role"] for t in turns] == ["system", "user", "user", "user"]
    assert turns[2]["content"].count("<tool_response>") == 2


def test_the_grammar_leaves_out_what_llama_cpp_cannot_read_and_closes_objects() -> None:
    parameters = {
        "type": "object",
        "properties": {
            "code": {"type": "string", "pattern": "[a-z]+", "format": "uuid", "maxLength": 8},
            "notes": {"type": "array", "items": {"type": "string"}, "maxItems": 100000},
            "both": {"allOf": [{"properties": {"a": {"type": "string"}}}]},
        },
        "required": ["code"],
    }
    schema = call_schema(Offer((Tool("t", "", parameters),), "required"))
    arguments = schema["properties"]["arguments"]
    assert arguments["properties"]["code"] == {"type": "string", "maxLength": 8}
    assert "maxItems" not in arguments["properties"]["notes"]
    assert arguments["additionalProperties"] is False
    assert "additionalProperties" not in arguments["properties"]["both"]["allOf"][0]


def test_long_broken_text_is_not_mended_on_the_event_loop() -> None:
    broken = '<tool_call>{"name": "get_weather", "arguments": {"city": "' + "ab'c, " * 20_000
    started = time.perf_counter()
    _rest, found = extract_calls(broken, ["get_weather"])
    assert found == [] or all(isinstance(c.arguments, dict) for c in found)
    assert time.perf_counter() - started < 2.0  # json_repair would take minutes


def test_the_validator_cache_is_bounded() -> None:
    for index in range(repair.MAX_CACHED_VALIDATORS + 10):
        repair.check_call("t", "{}", {"t": {"type": "object", "title": str(index)}})
    assert len(repair._VALIDATORS) == repair.MAX_CACHED_VALIDATORS


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"id": "c", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def test_a_stream_keeps_a_name_sent_again_whole_and_gives_back_what_it_held_on_error() -> None:
    guard = StreamGuard(Offer(TOOLS, "auto"), Verdict(), repair=True, forced=False)
    pieces = [
        {"index": 0, "id": "x", "function": {"name": "now", "arguments": ""}},
        {"index": 0, "function": {"name": "now", "arguments": "{}"}},
    ]
    for piece in pieces:
        guard.feed(chunk({"tool_calls": [piece]}))
    guard.feed(chunk({}, "tool_calls"))
    [call] = guard.settle().message["tool_calls"]
    assert call["function"] == {"name": "now", "arguments": "{}"}

    held = StreamGuard(Offer(TOOLS, "auto"), Verdict(), repair=True, forced=False)
    shown = held.feed(chunk({"content": 'Look: <tool_call>{"name": "now"'}))
    assert [c["choices"][0]["delta"]["content"] for c in shown] == ["Look: "]
    back = held.unsettled()
    assert [c["choices"][0]["delta"]["content"] for c in back] == ['<tool_call>{"name": "now"']


def test_tool_choice_none_where_auto_renders_sends_the_history_as_text() -> None:
    chat = {
        "messages": [{"role": "tool", "tool_call_id": "a", "content": "x"}],
        "tools": [{"type": "function", "function": {"name": "now"}}],
        "tool_choice": "none",
    }
    guard = tool_guard(chat, ToolPolicy(), template_takes_tools=False, server_kind="llama-server")
    assert guard is not None and guard.mode == "render" and not guard.repair
    sent = guard.request(chat)
    assert "tools" not in sent and sent["messages"][0]["role"] == "user"
    native = tool_guard(chat, ToolPolicy(), template_takes_tools=True, server_kind="llama-server")
    assert native is None


def test_a_call_asked_again_is_asked_under_a_grammar_that_must_end() -> None:
    """The first answer may have looped until its tokens ran out: asked again, every
    string and array the schema leaves open is bounded, within the schema's own bounds;
    the first answer's grammar leaves the model free."""
    parameters = {
        "type": "object",
        "properties": {
            "to": {"type": "array", "items": {"type": "string"}, "minItems": 1},
            "many": {"type": "array", "minItems": 20},
            "kind": {"type": "string", "enum": ["a", "b"]},
            "note": {"type": ["string", "null"], "maxLength": 100},
            "short": {"type": "string", "maxLength": 5},
            "count": {"type": "integer"},
        },
        "required": ["to"],
    }
    chat = {
        "messages": [{"role": "user", "content": "Mail bob"}],
        "tools": [{"type": "function", "function": {"name": "mail", "parameters": parameters}}],
        "tool_choice": "required",
    }
    guard = tool_guard(
        chat,
        ToolPolicy(mode="render", repair=True),
        template_takes_tools=False,
        server_kind="llama-server",
    )
    assert guard is not None

    def arguments(request: dict[str, Any]) -> dict[str, Any]:
        schema = request["response_format"]["json_schema"]["schema"]
        found: dict[str, Any] = schema["properties"]["arguments"]["properties"]
        return found

    first = arguments(guard.request(chat))
    assert "maxItems" not in first["to"] and "maxLength" not in first["to"]["items"]
    again = arguments(guard.retry_request(chat, guard.offer))
    assert again["to"]["maxItems"] == forcing.RETRY_ITEMS
    assert again["to"]["items"]["maxLength"] == forcing.RETRY_CHARS
    assert again["many"]["maxItems"] == 20  # never under the lower bound
    assert "maxLength" not in again["kind"]  # a fixed set is bounded already
    assert again["note"]["maxLength"] == 100  # too large for the grammar, not for this
    assert again["short"]["maxLength"] == 5
    assert again["count"] == {"type": "integer"}
    assert (
        guard.retry_request(chat, guard.offer)["dry_multiplier"]
        == forcing.LOOP_BREAKER["dry_multiplier"]
    )


def test_a_lower_bound_the_grammar_leaves_out_still_bounds_the_retry_from_below() -> None:
    """A ``minLength`` over the grammar's bounds is not in the grammar: the retry's cap
    is raised to it, or nothing the grammar allows would validate."""
    parameters = {
        "type": "object",
        "properties": {
            "essay": {"type": "string", "minLength": 200},
            "ids": {"type": "array", "items": {"type": "integer"}, "minItems": 70},
        },
    }
    offer = Offer((Tool("t", "", parameters),), "required")
    found = call_schema(offer, bounded=True)["properties"]["arguments"]["properties"]
    assert found["essay"] == {"type": "string", "maxLength": 200}
    assert found["ids"]["maxItems"] == 70


@pytest.mark.parametrize("tools", [1, 2])
def test_references_in_a_tools_parameters_point_into_the_calls_schema(tools: int) -> None:
    """llama.cpp resolves a ``$ref`` from the root of the schema it is sent: the
    parameters' own references (``$defs``, ``#`` for a recursive one) are made ones
    into the call's schema, where they resolve to the same definitions."""
    parameters = {
        "type": "object",
        "properties": {
            "owner": {"$ref": "#/$defs/Person"},
            "tree": {"$ref": "#"},
        },
        "required": ["owner"],
        "$defs": {
            "Person": {
                "type": "object",
                "properties": {"name": {"type": "string"}},
                "required": ["name"],
            }
        },
    }
    offered = tuple(Tool(f"t{i}", "", parameters) for i in range(tools))
    schema = call_schema(Offer(offered, "required"))
    call = {"name": "t0", "arguments": {"owner": {"name": "Ada"}, "tree": {"owner": {"name": "B"}}}}
    jsonschema.validate(call, schema)
    for wrong in ({"owner": {"age": 3}}, {"owner": {"name": "A"}, "tree": {"owner": 1}}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({"name": "t0", "arguments": wrong}, schema)
    at = "#/properties/arguments" if tools == 1 else "#/anyOf/0/properties/arguments"
    arguments = schema if tools == 1 else schema["anyOf"][0]
    found = arguments["properties"]["arguments"]["properties"]
    assert found["owner"] == {"$ref": f"{at}/$defs/Person"}
    assert found["tree"] == {"$ref": at}


def test_a_retry_bounds_so_many_strings_and_no_more() -> None:
    """Each bound is 128 grammar rules in llama.cpp: a tool with thousands of strings
    has only the first ones bounded on a retry, the rest left open as before."""
    properties = {f"p{i}": {"type": "string"} for i in range(forcing.RETRY_MAX_BOUNDS + 10)}
    parameters = {"type": "object", "properties": properties}
    offer = Offer((Tool("t", "", parameters),), "required")
    found = call_schema(offer, bounded=True)["properties"]["arguments"]["properties"]
    bounded = [name for name, schema in found.items() if "maxLength" in schema]
    assert len(bounded) == forcing.RETRY_MAX_BOUNDS


def test_a_reference_deep_in_the_parameters_is_rebased_and_values_are_not() -> None:
    """A ``$ref`` as deep as the grammar goes still points into the call's schema; an
    ``enum`` or ``const`` value that looks like a reference is a value, left alone."""
    leaf: dict[str, Any] = {"$ref": "#/$defs/Leaf"}
    for _ in range(forcing.MAX_DEPTH - 2):
        leaf = {"type": "object", "properties": {"next": leaf}}
    parameters = {
        "type": "object",
        "properties": {"deep": leaf, "kind": {"const": {"$ref": "#/x"}}},
        "$defs": {"Leaf": {"type": "string"}},
    }
    schema = call_schema(Offer((Tool("t", "", parameters),), "required"))
    found = schema["properties"]["arguments"]["properties"]
    assert found["kind"] == {"const": {"$ref": "#/x"}}
    node = found["deep"]
    while "$ref" not in node:
        node = node["properties"]["next"]
    assert node == {"$ref": "#/properties/arguments/$defs/Leaf"}
