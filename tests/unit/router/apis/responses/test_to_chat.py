"""The Responses <-> chat completions translation, checked against the openai SDK's own types."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseOutputMessage,
    ResponseStreamEvent,
    ResponseTextDeltaEvent,
    ToolChoiceFunction,
)
from openai.types.responses.response_create_params import ResponseCreateParamsNonStreaming
from pydantic import TypeAdapter

from slm_server.errors import BackendProtocolError, InvalidRequest
from slm_server.router.apis.responses.events import ResponseStreamTranslator
from slm_server.router.apis.responses.from_chat import chat_to_response
from slm_server.router.apis.responses.to_chat import responses_to_chat
from slm_server.router.upstream.sse import DONE, SseSplitter, data_object

EVENTS: TypeAdapter[ResponseStreamEvent] = TypeAdapter(ResponseStreamEvent)
MODEL = "smollm2-135m-instruct"


def parse_events(raw: list[bytes]) -> list[dict[str, Any]]:
    """Decode SSE events, checking the framing and that each one validates as an SDK event."""
    events = []
    for frame in raw:
        assert frame.endswith(b"\n\n")
        header, data = frame[:-2].split(b"\n")
        assert header.startswith(b"event: ")
        assert data.startswith(b"data: ")
        event = json.loads(data[len(b"data: ") :])
        assert header[len(b"event: ") :].decode() == event["type"]
        EVENTS.validate_python(event)
        events.append(event)
    return events


def run_stream(request: dict[str, Any], chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    translator = ResponseStreamTranslator(request)
    raw = translator.start()
    for chunk in chunks:
        raw += translator.feed(chunk)
    raw += translator.finish()
    assert translator.closed
    events = parse_events(raw)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    return events


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "model.gguf",
        "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}],
    }


def usage_chunk(prompt: int, completion: int) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "model.gguf",
        "choices": [],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
    }


def completion(message: dict[str, Any], finish: str = "stop", **extra: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "model.gguf",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17},
        **extra,
    }


class TestRequestTranslation:
    def test_string_input_becomes_one_user_message(self) -> None:
        chat = responses_to_chat({"model": MODEL, "input": "Hello"})
        assert chat == {"model": MODEL, "messages": [{"role": "user", "content": "Hello"}]}

    def test_instructions_lead_as_a_system_message(self) -> None:
        chat = responses_to_chat({"model": MODEL, "instructions": "Be brief.", "input": "Hi"})
        assert chat["messages"] == [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
        ]

    def test_message_items_and_roles(self) -> None:
        chat = responses_to_chat(
            {
                "model": MODEL,
                "input": [
                    {"role": "developer", "content": "Rules."},
                    {"role": "system", "content": [{"type": "input_text", "text": "More."}]},
                    {
                        "type": "message",
                        "role": "user",
                        "content": [
                            {"type": "input_text", "text": "a"},
                            {"type": "input_text", "text": "b"},
                        ],
                    },
                    {
                        "type": "message",
                        "id": "msg_1",
                        "status": "completed",
                        "role": "assistant",
                        "content": [{"type": "output_text", "text": "Yes.", "annotations": []}],
                    },
                ],
            }
        )
        assert chat["messages"] == [
            {"role": "system", "content": "Rules."},
            {"role": "system", "content": "More."},
            {"role": "user", "content": "a\nb"},
            {"role": "assistant", "content": "Yes."},
        ]

    def test_input_image_becomes_an_image_url_part(self) -> None:
        chat = responses_to_chat(
            {
                "model": MODEL,
                "input": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "input_text", "text": "What is this?"},
                            {
                                "type": "input_image",
                                "image_url": "data:image/png;base64,AAAA",
                                "detail": "low",
                            },
                        ],
                    }
                ],
            }
        )
        assert chat["messages"] == [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is this?"},
                    {
                        "type": "image_url",
                        "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"},
                    },
                ],
            }
        ]

    def test_function_calls_and_outputs(self) -> None:
        chat = responses_to_chat(
            {
                "model": MODEL,
                "input": [
                    {"role": "user", "content": "Weather in Paris and Rome?"},
                    {"type": "reasoning", "id": "rs_1", "summary": []},
                    {"role": "assistant", "content": "Checking."},
                    {
                        "type": "function_call",
                        "id": "fc_1",
                        "call_id": "call_a",
                        "name": "weather",
                        "arguments": '{"city":"Paris"}',
                    },
                    {
                        "type": "function_call",
                        "call_id": "call_b",
                        "name": "weather",
                        "arguments": '{"city":"Rome"}',
                    },
                    {"type": "function_call_output", "call_id": "call_a", "output": "sunny"},
                    {
                        "type": "function_call_output",
                        "call_id": "call_b",
                        "output": [{"type": "input_text", "text": "rainy"}],
                    },
                    {
                        "type": "function_call",
                        "call_id": "call_c",
                        "name": "weather",
                        "arguments": "{}",
                    },
                ],
            }
        )

        def call(cid: str, args: str) -> dict[str, Any]:
            return {
                "id": cid,
                "type": "function",
                "function": {"name": "weather", "arguments": args},
            }

        assert chat["messages"] == [
            {"role": "user", "content": "Weather in Paris and Rome?"},
            {
                "role": "assistant",
                "content": "Checking.",
                "tool_calls": [
                    call("call_a", '{"city":"Paris"}'),
                    call("call_b", '{"city":"Rome"}'),
                ],
            },
            {"role": "tool", "tool_call_id": "call_a", "content": "sunny"},
            {"role": "tool", "tool_call_id": "call_b", "content": "rainy"},
            {"role": "assistant", "content": "", "tool_calls": [call("call_c", "{}")]},
        ]

    def test_sampling_fields_copied_responses_fields_dropped_others_forwarded(self) -> None:
        chat = responses_to_chat(
            {
                "model": MODEL,
                "input": "Hi",
                "max_output_tokens": 64,
                "temperature": 0.2,
                "top_p": 0.9,
                "user": "u1",
                "parallel_tool_calls": False,
                "metadata": {"k": "v"},
                "reasoning": {"effort": "low"},
                "store": True,
                "include": ["reasoning.encrypted_content"],
                "truncation": "disabled",
                "top_k": 40,
                "seed": 7,
            }
        )
        assert chat == {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 64,
            "temperature": 0.2,
            "top_p": 0.9,
            "user": "u1",
            "parallel_tool_calls": False,
            "top_k": 40,
            "seed": 7,
        }

    def test_streaming_asks_for_usage(self) -> None:
        chat = responses_to_chat({"model": MODEL, "input": "Hi", "stream": True})
        assert chat["stream"] is True
        assert chat["stream_options"] == {"include_usage": True}
        plain = responses_to_chat({"model": MODEL, "input": "Hi", "stream": False})
        assert plain["stream"] is False
        assert "stream_options" not in plain

    def test_function_tools_take_the_nested_chat_shape(self) -> None:
        parameters = {"type": "object", "properties": {"city": {"type": "string"}}}
        chat = responses_to_chat(
            {
                "model": MODEL,
                "input": "Hi",
                "tools": [
                    {
                        "type": "function",
                        "name": "weather",
                        "description": "Current weather",
                        "parameters": parameters,
                        "strict": True,
                    },
                    {"type": "function", "name": "noop"},
                ],
            }
        )
        assert chat["tools"] == [
            {
                "type": "function",
                "function": {
                    "name": "weather",
                    "description": "Current weather",
                    "parameters": parameters,
                },
            },
            {"type": "function", "function": {"name": "noop"}},
        ]
        assert "tools" not in responses_to_chat({"model": MODEL, "input": "Hi", "tools": []})

    @pytest.mark.parametrize(
        ("choice", "expected"),
        [
            ("auto", "auto"),
            ("none", "none"),
            ("required", "required"),
            ({"type": "function", "name": "weather"}, "required"),
        ],
    )
    def test_tool_choice(self, choice: Any, expected: Any) -> None:
        tools = [{"type": "function", "name": "weather"}]
        body = {"model": MODEL, "input": "Hi", "tools": tools, "tool_choice": choice}
        chat = responses_to_chat(body)
        assert chat["tool_choice"] == expected

    def test_text_format(self) -> None:
        schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
        fmt = {"type": "json_schema", "name": "thing", "schema": schema, "strict": True}
        chat = responses_to_chat({"model": MODEL, "input": "Hi", "text": {"format": fmt}})
        assert chat["response_format"] == {
            "type": "json_schema",
            "json_schema": {"name": "thing", "schema": schema, "strict": True},
        }
        json_object = {"format": {"type": "json_object"}}
        chat = responses_to_chat({"model": MODEL, "input": "Hi", "text": json_object})
        assert chat["response_format"] == {"type": "json_object"}
        plain = {"format": {"type": "text"}, "verbosity": "low"}
        assert "response_format" not in responses_to_chat(
            {"model": MODEL, "input": "Hi", "text": plain}
        )

    @pytest.mark.parametrize(
        ("changes", "param"),
        [
            ({"input": None}, "input"),
            ({"input": 3}, "input"),
            ({"input": []}, "input"),
            ({"model": None}, "model"),
            ({"previous_response_id": "resp_1"}, "previous_response_id"),
            ({"conversation": "conv_1"}, "conversation"),
            ({"prompt": {"id": "pmpt_1"}}, "prompt"),
            ({"background": True}, "background"),
            ({"instructions": ["x"]}, "instructions"),
            ({"max_output_tokens": "10"}, "max_output_tokens"),
            ({"tools": [{"type": "local_shell"}]}, "tools[0].type"),
            ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools[0].name"),
            ({"tools": {"type": "function"}}, "tools"),
            ({"tool_choice": {"type": "web_search_preview"}}, "tool_choice"),
            ({"tool_choice": "sometimes"}, "tool_choice"),
            ({"text": {"format": {"type": "yaml"}}}, "text.format.type"),
            ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
            ({"input": ["Hi"]}, "input[0]"),
            ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
            ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
            ({"input": [{"role": "user", "content": 5}]}, "input[0].content"),
            (
                {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
                "input[0].content[0].type",
            ),
            (
                {"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]},
                "input[0].content[0].image_url",
            ),
            (
                {
                    "input": [
                        {
                            "role": "system",
                            "content": [{"type": "input_image", "image_url": "http://x/y.png"}],
                        }
                    ]
                },
                "input[0].content[0]",
            ),
            (
                {"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]},
                "input[0].call_id",
            ),
            ({"input": [{"type": "function_call_output", "call_id": "c"}]}, "input[0].output"),
        ],
    )
    def test_unsupported_requests_name_the_field(self, changes: dict[str, Any], param: str) -> None:
        body = {"model": MODEL, "input": "Hi", **changes}
        with pytest.raises(InvalidRequest) as caught:
            responses_to_chat(body)
        assert caught.value.param == param
        assert caught.value.status == 400
        assert caught.value.message

    def test_sdk_typed_params_translate(self) -> None:
        params: ResponseCreateParamsNonStreaming = {
            "model": MODEL,
            "input": [{"role": "user", "content": "Hi"}],
            "max_output_tokens": 10,
        }
        chat = responses_to_chat(dict(params))
        assert chat["messages"] == [{"role": "user", "content": "Hi"}]
        assert chat["max_tokens"] == 10


class TestChatToResponse:
    def test_text_completion(self) -> None:
        request = {"model": MODEL, "input": "Hi"}
        result = chat_to_response(completion({"role": "assistant", "content": "Hello!"}), request)
        response = Response.model_validate(result)
        assert response.output_text == "Hello!"
        assert response.status == "completed"
        assert response.id.startswith("resp_")
        assert response.model == MODEL
        assert response.created_at == 1700000000
        assert response.incomplete_details is None
        assert response.error is None
        [item] = result["output"]
        assert item["id"].startswith("msg_")
        assert item["content"] == [
            {"type": "output_text", "text": "Hello!", "annotations": [], "logprobs": []}
        ]
        assert response.usage is not None
        assert response.usage.input_tokens == 12
        assert response.usage.output_tokens == 5
        assert response.usage.total_tokens == 17
        assert response.usage.input_tokens_details.cached_tokens == 0
        assert response.usage.output_tokens_details.reasoning_tokens == 0

    def test_usage_details_and_missing_usage(self) -> None:
        chat = completion({"role": "assistant", "content": "x"})
        chat["usage"] = {
            "prompt_tokens": 10,
            "completion_tokens": 4,
            "total_tokens": 14,
            "prompt_tokens_details": {"cached_tokens": 6},
            "completion_tokens_details": {"reasoning_tokens": 2},
        }
        usage = Response.model_validate(chat_to_response(chat, {"model": MODEL})).usage
        assert usage is not None
        assert usage.input_tokens_details.cached_tokens == 6
        assert usage.output_tokens_details.reasoning_tokens == 2
        del chat["usage"]
        assert Response.model_validate(chat_to_response(chat, {"model": MODEL})).usage is None

    def test_reasoning_comes_first(self) -> None:
        message = {"role": "assistant", "content": "42", "reasoning_content": "Think."}
        result = chat_to_response(completion(message), {"model": MODEL})
        response = Response.model_validate(result)
        assert [item.type for item in response.output] == ["reasoning", "message"]
        assert result["output"][0]["content"] == [{"type": "reasoning_text", "text": "Think."}]
        assert result["output"][0]["id"].startswith("rs_")
        assert response.output_text == "42"

    def test_tool_calls_become_function_call_items(self) -> None:
        message = {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city":"Paris"}'},
                },
                {"id": "call_2", "type": "function", "function": {"name": "t", "arguments": {}}},
            ],
        }
        result = chat_to_response(completion(message, "tool_calls"), {"model": MODEL})
        response = Response.model_validate(result)
        assert response.output_text == ""
        assert [item.type for item in response.output] == ["function_call", "function_call"]
        first, second = result["output"]
        assert first["id"].startswith("fc_")
        assert first["call_id"] == "call_1"
        assert first["name"] == "weather"
        assert first["arguments"] == '{"city":"Paris"}'
        assert first["status"] == "completed"
        assert second["arguments"] == "{}"

    def test_length_finish_is_incomplete(self) -> None:
        chat = completion({"role": "assistant", "content": "Once upon"}, "length")
        response = Response.model_validate(chat_to_response(chat, {"model": MODEL}))
        assert response.status == "incomplete"
        assert response.incomplete_details is not None
        assert response.incomplete_details.reason == "max_output_tokens"
        assert response.output_text == "Once upon"

    def test_request_settings_are_echoed(self) -> None:
        tool = {"type": "function", "name": "weather", "parameters": {"type": "object"}}
        request = {
            "model": MODEL,
            "input": "Hi",
            "instructions": "Be brief.",
            "temperature": 0.3,
            "top_p": 0.8,
            "max_output_tokens": 50,
            "metadata": {"k": "v"},
            "tools": [tool],
            "tool_choice": {"type": "function", "name": "weather"},
            "parallel_tool_calls": False,
            "text": {"format": {"type": "json_object"}},
        }
        chat = completion({"role": "assistant", "content": "{}"})
        response = Response.model_validate(chat_to_response(chat, request))
        assert response.instructions == "Be brief."
        assert response.temperature == 0.3
        assert response.top_p == 0.8
        assert response.max_output_tokens == 50
        assert response.metadata == {"k": "v"}
        assert response.tools[0].type == "function"
        assert isinstance(response.tool_choice, ToolChoiceFunction)
        assert response.tool_choice.name == "weather"
        assert response.parallel_tool_calls is False
        assert response.text is not None
        assert response.text.format is not None
        assert response.text.format.type == "json_object"

    def test_defaults_when_request_is_minimal(self) -> None:
        chat = completion({"role": "assistant", "content": "x"})
        result = chat_to_response(chat, {"input": "Hi"})
        response = Response.model_validate(result)
        assert response.model == "model.gguf"
        assert response.tool_choice == "auto"
        assert response.tools == []
        assert response.parallel_tool_calls is True

    @pytest.mark.parametrize(
        "chat",
        [
            {"choices": []},
            {},
            {"choices": [{"index": 0, "finish_reason": "stop"}]},
            {"choices": [{"message": {"tool_calls": [{"id": "c", "function": {}}]}}]},
        ],
    )
    def test_malformed_completion_is_a_backend_error(self, chat: dict[str, Any]) -> None:
        with pytest.raises(BackendProtocolError):
            chat_to_response(chat, {"model": MODEL})


class TestStream:
    def test_realistic_text_stream(self) -> None:
        request = {"model": MODEL, "input": "Hi", "stream": True}
        pieces = ["Hel", "lo", ", wor", "ld", "!"]
        chunks = [
            chunk({"role": "assistant", "content": None}),
            *[chunk({"content": piece}) for piece in pieces],
            chunk({}, "stop"),
            usage_chunk(9, 5),
        ]
        events = run_stream(request, chunks)
        assert [e["type"] for e in events] == [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            *["response.output_text.delta"] * len(pieces),
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ]
        assert events[0]["response"]["status"] == "in_progress"
        assert events[0]["response"]["output"] == []
        deltas = [e for e in events if e["type"] == "response.output_text.delta"]
        assert "".join(e["delta"] for e in deltas) == "Hello, world!"
        item_id = events[2]["item"]["id"]
        assert all(e["item_id"] == item_id and e["output_index"] == 0 for e in deltas)
        done = {e["type"]: e for e in events}
        assert done["response.output_text.done"]["text"] == "Hello, world!"
        assert done["response.output_item.done"]["item"]["status"] == "completed"
        completed = ResponseCompletedEvent.model_validate(events[-1])
        response = completed.response
        assert response.status == "completed"
        assert response.output_text == "Hello, world!"
        assert response.id == events[0]["response"]["id"]
        assert response.usage is not None
        assert (response.usage.input_tokens, response.usage.output_tokens) == (9, 5)
        assert response.usage.total_tokens == 14

    def test_reasoning_then_text(self) -> None:
        chunks = [
            chunk({"role": "assistant"}),
            chunk({"reasoning_content": "Let me "}),
            chunk({"reasoning_content": "think."}),
            chunk({"content": "Answer."}),
            chunk({}, "stop"),
        ]
        events = run_stream({"model": MODEL, "input": "Hi"}, chunks)
        types = [e["type"] for e in events]
        assert types[2:9] == [
            "response.output_item.added",
            "response.content_part.added",
            "response.reasoning_text.delta",
            "response.reasoning_text.delta",
            "response.reasoning_text.done",
            "response.content_part.done",
            "response.output_item.done",
        ]
        assert events[6]["text"] == "Let me think."
        assert events[8]["item"]["type"] == "reasoning"
        assert events[9]["item"]["type"] == "message"
        assert events[9]["output_index"] == 1
        response = Response.model_validate(events[-1]["response"])
        assert [item.type for item in response.output] == ["reasoning", "message"]
        assert response.output_text == "Answer."
        assert response.usage is None

    def test_streamed_tool_calls(self) -> None:
        def call(index: int, **fields: Any) -> dict[str, Any]:
            return chunk({"tool_calls": [{"index": index, **fields}]})

        chunks = [
            chunk({"role": "assistant", "content": None}),
            call(0, id="call_a", type="function", function={"name": "weather", "arguments": ""}),
            call(0, function={"arguments": '{"city":'}),
            call(0, function={"arguments": '"Paris"}'}),
            call(1, id="call_b", function={"arguments": "{}"}),
            call(1, function={"name": "time"}),
            chunk({}, "tool_calls"),
            usage_chunk(20, 10),
        ]
        events = run_stream({"model": MODEL, "input": "Hi"}, chunks)
        added = [e for e in events if e["type"] == "response.output_item.added"]
        assert [(e["output_index"], e["item"]["name"]) for e in added] == [
            (0, "weather"),
            (1, "time"),
        ]
        assert all(e["item"]["arguments"] == "" for e in added)
        deltas = [e for e in events if e["type"] == "response.function_call_arguments.delta"]
        assert [(e["output_index"], e["delta"]) for e in deltas] == [
            (0, '{"city":'),
            (0, '"Paris"}'),
            (1, "{}"),
        ]
        done = [e for e in events if e["type"] == "response.function_call_arguments.done"]
        assert [(e["name"], e["arguments"]) for e in done] == [
            ("weather", '{"city":"Paris"}'),
            ("time", "{}"),
        ]
        response = Response.model_validate(events[-1]["response"])
        assert events[-1]["type"] == "response.completed"
        calls = [item for item in response.output if item.type == "function_call"]
        assert [(c.call_id, c.name, c.arguments) for c in calls] == [
            ("call_a", "weather", '{"city":"Paris"}'),
            ("call_b", "time", "{}"),
        ]

    def test_text_before_tool_call_is_closed_first(self) -> None:
        chunks = [
            chunk({"content": "Checking."}),
            chunk({"tool_calls": [{"index": 0, "id": "c", "function": {"name": "f"}}]}),
            chunk({}, "tool_calls"),
        ]
        events = run_stream({"model": MODEL, "input": "Hi"}, chunks)
        types = [e["type"] for e in events]
        assert types.index("response.output_item.done") < types.index(
            "response.output_item.added", 3
        )
        response = Response.model_validate(events[-1]["response"])
        assert [item.type for item in response.output] == ["message", "function_call"]

    def test_length_finish_is_incomplete(self) -> None:
        chunks = [chunk({"content": "Once upon"}), chunk({}, "length"), usage_chunk(3, 2)]
        events = run_stream({"model": MODEL, "input": "Hi", "max_output_tokens": 2}, chunks)
        assert events[-1]["type"] == "response.incomplete"
        response = Response.model_validate(events[-1]["response"])
        assert response.status == "incomplete"
        assert response.incomplete_details is not None
        assert response.incomplete_details.reason == "max_output_tokens"
        assert isinstance(response.output[0], ResponseOutputMessage)
        assert response.output[0].status == "incomplete"
        assert response.output_text == "Once upon"

    def test_error_mid_stream_fails_the_response(self) -> None:
        translator = ResponseStreamTranslator({"model": MODEL, "input": "Hi"})
        raw = translator.start() + translator.feed(chunk({"content": "Par"}))
        raw += translator.error("backend connection lost")
        assert translator.closed
        assert translator.feed(chunk({"content": "tial"})) == []
        assert translator.finish() == []
        assert translator.error("again") == []
        events = parse_events(raw)
        assert events[-1]["type"] == "response.failed"
        response = Response.model_validate(events[-1]["response"])
        assert response.status == "failed"
        assert response.error is not None
        assert response.error.message == "backend connection lost"
        assert isinstance(response.output[0], ResponseOutputMessage)
        assert response.output[0].status == "incomplete"

    def test_error_chunk_fails_the_response(self) -> None:
        translator = ResponseStreamTranslator({"model": MODEL, "input": "Hi"})
        events = parse_events(translator.feed({"error": {"message": "context too long"}}))
        assert [e["type"] for e in events] == [
            "response.created",
            "response.in_progress",
            "response.failed",
        ]
        assert events[-1]["response"]["error"]["message"] == "context too long"

    def test_start_is_implicit_and_once(self) -> None:
        translator = ResponseStreamTranslator({"model": MODEL, "input": "Hi"})
        events = parse_events(translator.feed(chunk({"content": "x"})))
        assert [e["type"] for e in events[:2]] == ["response.created", "response.in_progress"]
        assert translator.start() == []

    def test_empty_stream_completes_with_no_output(self) -> None:
        events = run_stream({"model": MODEL, "input": "Hi"}, [chunk({}, "stop")])
        assert [e["type"] for e in events] == [
            "response.created",
            "response.in_progress",
            "response.completed",
        ]
        assert Response.model_validate(events[-1]["response"]).output == []


BONJOUR_CHUNKS = [
    chunk({"role": "assistant", "content": None}),
    chunk({"content": "Bon"}),
    chunk({"content": "jour"}),
    chunk({}, "stop"),
    usage_chunk(4, 2),
]


def fake_gateway(chat_answer: dict[str, Any], chunks: list[dict[str, Any]]) -> openai.OpenAI:
    """An openai client whose transport runs the translation around canned backend answers."""

    def handle(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        chat = responses_to_chat(body)
        assert chat["messages"][-1]["role"] == "user"
        if not chat.get("stream"):
            return httpx.Response(200, json=chat_to_response(chat_answer, body))
        translator = ResponseStreamTranslator(body)
        raw = translator.start()
        splitter = SseSplitter(1 << 20)
        stream = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks)
        for event in splitter.feed(stream):
            parsed = data_object(event)
            if parsed is not None and parsed is not DONE:
                raw += translator.feed(parsed)
        raw += translator.finish()
        return httpx.Response(
            200, content=b"".join(raw), headers={"content-type": "text/event-stream"}
        )

    http = httpx.Client(transport=httpx.MockTransport(handle))
    return openai.OpenAI(api_key="unused", base_url="http://gateway/v1", http_client=http)


class TestOpenAIClient:
    def test_non_streaming_create(self) -> None:
        answer = completion({"role": "assistant", "content": "Bonjour"})
        with fake_gateway(answer, []) as client:
            response = client.responses.create(model=MODEL, input="Say hello in French")
        assert isinstance(response, Response)
        assert response.output_text == "Bonjour"

    def test_streaming_create_yields_typed_events(self) -> None:
        with fake_gateway({}, BONJOUR_CHUNKS) as client:
            stream = client.responses.create(model=MODEL, input="Say hello", stream=True)
            events = list(stream)
        deltas = [e.delta for e in events if isinstance(e, ResponseTextDeltaEvent)]
        assert "".join(deltas) == "Bonjour"
        final = events[-1]
        assert isinstance(final, ResponseCompletedEvent)
        assert final.response.output_text == "Bonjour"
        assert final.response.usage is not None
        assert final.response.usage.output_tokens == 2

    def test_stream_helper_accumulates(self) -> None:
        with (
            fake_gateway({}, BONJOUR_CHUNKS) as client,
            client.responses.stream(model=MODEL, input="Say hello") as stream,
        ):
            text = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
            final = stream.get_final_response()
        assert text == "Bonjour"
        assert final.output_text == "Bonjour"
