"""What coding agents send over the Responses API, translated to chat completions and
back (:mod:`slm_server.router.apis.responses.to_chat`): Codex CLI's first request
(namespace and custom tools, a hosted tool, ``developer`` messages, ``include``,
``reasoning``, ``store``, ``prompt_cache_key``, ``client_metadata``), a history with
namespaced and custom tool calls, and answers whose calls are mapped back, each checked
strictly against the openai package's types."""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai.types.responses import ResponseCustomToolCall, ResponseFunctionToolCall
from openai.types.responses.response_create_params import ResponseCreateParamsStreaming

from slm_server.errors import InvalidRequest
from slm_server.router.apis.responses.from_chat import chat_to_response
from slm_server.router.apis.responses.to_chat import (
    needs_translation,
    responses_to_chat,
    translate_request,
)
from tests.openai_shapes import strict_response

MODEL = "smollm2-135m-instruct"
CRM = {
    "type": "namespace",
    "name": "crm",
    "description": "The CRM",
    "tools": [
        {
            "type": "function",
            "name": "lookup",
            "description": "Find a customer",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
            "strict": False,
        }
    ],
}
PATCH = {"type": "custom", "name": "apply_patch", "description": "Edit files"}
SHELL = {
    "type": "function",
    "name": "exec_command",
    "description": "Run a command",
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
    "strict": False,
}
CODEX: ResponseCreateParamsStreaming = {
    "model": MODEL,
    "instructions": "You are a coding agent.",
    "input": [
        {
            "type": "message",
            "role": "developer",
            "content": [{"type": "input_text", "text": "Sandbox: on"}],
        },
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "Fix the bug"}],
        },
    ],
    "tools": [SHELL, CRM, PATCH, {"type": "web_search"}],  # type: ignore[list-item]
    "tool_choice": "auto",
    "parallel_tool_calls": False,
    "reasoning": {"effort": "medium", "summary": "auto"},
    "store": False,
    "stream": True,
    "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "0199a7c4-session",
}


def codex() -> dict[str, Any]:
    body: dict[str, Any] = json.loads(json.dumps(CODEX))
    body["client_metadata"] = {"x-codex-installation-id": "abc"}  # not in the SDK's params
    return body


def completion(message: dict[str, Any], finish: str = "tool_calls") -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "model.gguf",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17},
    }


def tool_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


class TestCodexFirstRequest:
    def test_is_served_with_the_hosted_tool_left_out(self) -> None:
        translated = translate_request(codex())
        chat = translated.chat
        assert translated.dropped == ("web_search",)
        assert [t["function"]["name"] for t in chat["tools"]] == [
            "exec_command",
            "crm__lookup",
            "apply_patch",
        ]
        assert chat["messages"] == [
            {"role": "system", "content": "You are a coding agent."},
            {"role": "system", "content": "Sandbox: on"},
            {"role": "user", "content": "Fix the bug"},
        ]
        assert chat["parallel_tool_calls"] is False
        assert chat["tool_choice"] == "auto"
        assert chat["stream_options"] == {"include_usage": True}
        for dropped in ("include", "reasoning", "store", "prompt_cache_key", "client_metadata"):
            assert dropped not in chat

    def test_needs_the_router_s_translation(self) -> None:
        assert needs_translation(codex())
        assert not needs_translation({"model": MODEL, "input": "hi", "tools": [SHELL]})
        assert not needs_translation({"model": MODEL, "input": "hi"})
        history = {"input": [{"type": "custom_tool_call_output", "call_id": "c", "output": ""}]}
        assert needs_translation(history)
        namespaced = {"input": [{"type": "function_call", "namespace": "crm", "name": "x"}]}
        assert needs_translation(namespaced)

    @pytest.mark.parametrize("store", [True, False])
    def test_store_is_accepted_either_way_and_nothing_is_stored(self, store: bool) -> None:
        assert "store" not in responses_to_chat({"model": MODEL, "input": "hi", "store": store})


class TestHistory:
    def test_namespaced_and_custom_calls_and_their_outputs_become_chat_turns(self) -> None:
        patch_text = "*** Begin Patch\n*** End Patch"
        body = {
            "model": MODEL,
            "tools": [CRM, PATCH],
            "input": [
                {"role": "user", "content": "Look up ACME, then patch"},
                {
                    "type": "reasoning",
                    "id": "rs_1",
                    "summary": [{"type": "summary_text", "text": "thinking"}],
                    "encrypted_content": "gAAAA...",
                },
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
                    "input": patch_text,
                },
                {
                    "type": "custom_tool_call_output",
                    "call_id": "call_2",
                    "output": [{"type": "input_text", "text": "Done"}],
                },
                {
                    "type": "web_search_call",
                    "id": "ws_1",
                    "status": "completed",
                    "action": {"type": "search", "query": "x"},
                },
            ],
        }
        messages = responses_to_chat(body)["messages"]
        assert messages[1] == {
            "role": "assistant",
            "content": "",
            "tool_calls": [tool_call("call_1", "crm__lookup", '{"q": "ACME"}')],
        }
        assert messages[2] == {"role": "tool", "tool_call_id": "call_1", "content": "ACME Corp"}
        [custom] = messages[3]["tool_calls"]
        assert custom["function"]["name"] == "apply_patch"
        assert json.loads(custom["function"]["arguments"]) == {"input": patch_text}
        assert messages[4] == {"role": "tool", "tool_call_id": "call_2", "content": "Done"}
        assert len(messages) == 5  # reasoning and the hosted call are dropped

    @pytest.mark.parametrize(
        ("item", "param"),
        [
            ({"type": "custom_tool_call", "call_id": "c", "name": "p"}, "input[0].input"),
            ({"type": "custom_tool_call", "call_id": "c", "input": "x"}, "input[0].name"),
            ({"type": "custom_tool_call_output", "call_id": "c"}, "input[0].output"),
            (
                {
                    "type": "function_call",
                    "call_id": "c",
                    "name": "f",
                    "arguments": "{}",
                    "namespace": 3,
                },
                "input[0].namespace",
            ),
            ({"type": "compaction", "encrypted_content": "x"}, "input[0].type"),
            ({"type": "local_shell_call", "call_id": "c"}, "input[0].type"),
        ],
    )
    def test_malformed_or_unsupported_items_are_refused_naming_the_field(
        self, item: dict[str, Any], param: str
    ) -> None:
        with pytest.raises(InvalidRequest) as caught:
            responses_to_chat({"model": MODEL, "input": [item]})
        assert caught.value.param == param


class TestAnswer:
    def test_calls_are_mapped_back_to_the_tools_they_stand_for(self) -> None:
        request = codex()
        message = {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                tool_call("call_a", "crm__lookup", '{"q": "ACME"}'),
                tool_call("call_b", "apply_patch", json.dumps({"input": "*** Begin Patch"})),
                tool_call("call_c", "exec_command", '{"cmd": "ls"}'),
            ],
        }
        response = strict_response(chat_to_response(completion(message), request))
        lookup, patch, shell = response.output
        assert isinstance(lookup, ResponseFunctionToolCall)
        assert (lookup.namespace, lookup.name, lookup.call_id) == ("crm", "lookup", "call_a")
        assert lookup.arguments == '{"q": "ACME"}'
        assert isinstance(patch, ResponseCustomToolCall)
        assert (patch.name, patch.input, patch.call_id) == (
            "apply_patch",
            "*** Begin Patch",
            "call_b",
        )
        assert patch.namespace is None
        assert patch.id is not None and patch.id.startswith("ctc_")
        assert isinstance(shell, ResponseFunctionToolCall)
        assert shell.namespace is None
        assert "namespace" not in chat_to_response(completion(message), request)["output"][2]

    def test_a_custom_call_whose_arguments_are_not_json_keeps_their_text(self) -> None:
        message = {"role": "assistant", "tool_calls": [tool_call("c", "apply_patch", "raw text")]}
        response = strict_response(
            chat_to_response(completion(message), {"model": MODEL, "tools": [PATCH]})
        )
        [patch] = response.output
        assert isinstance(patch, ResponseCustomToolCall)
        assert patch.input == "raw text"

    def test_the_echoed_tools_leave_the_hosted_ones_out(self) -> None:
        request = codex()
        request["tools"][3] = {"type": "web_search", "external_web_access": False}
        answer = completion({"role": "assistant", "content": "Hi"}, "stop")
        response = strict_response(chat_to_response(answer, request))
        assert [tool.type for tool in response.tools] == ["function", "namespace", "custom"]
