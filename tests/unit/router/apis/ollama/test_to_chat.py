"""Ollama's ``/api/chat`` and ``/api/generate`` requests checked and translated into chat
completions (or, raw, completions): every field of the wrong type is a 400 naming it,
no body at all makes the translation fail otherwise, and what is sent is what the
backend can serve."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slm_server.errors import InvalidRequest
from slm_server.router.apis.ollama.to_chat import Translated, chat_request, generate_request
from slm_server.router.intake.strict_json import dumps_body
from slm_server.router.intake.tool_calls import check_tool_calls
from tests.json_values import json_values

CONTEXT = 4096
HI = [{"role": "user", "content": "hi"}]
PNG = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5E"
    "rkJggg=="
)
CALLED = {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f"}}]}


def chat(vision: bool = False, **fields: Any) -> Translated:
    body = {"model": "m", "messages": HI, **fields}
    return chat_request(body, takes_images=vision, context_length=CONTEXT)


def generate(vision: bool = False, **fields: Any) -> Translated:
    body = {"model": "m", "prompt": "hi", **fields}
    return generate_request(body, takes_images=vision, context_length=CONTEXT)


def message(**fields: Any) -> list[dict[str, Any]]:
    return [fields]


# (id, the translation, whether the model takes images, the fields, what ``param`` names)
WRONG: list[tuple[str, Any, bool, dict[str, Any], str]] = [
    ("messages-string", chat, False, {"messages": "hi"}, "messages"),
    ("message-number", chat, False, {"messages": [5]}, "messages[0]"),
    ("role-number", chat, False, {"messages": message(role=7)}, "role"),
    ("role-unknown", chat, False, {"messages": message(role="robot")}, "role"),
    ("role-object", chat, False, {"messages": message(role={})}, "role"),
    ("role-array", chat, False, {"messages": message(role=["user"])}, "role"),
    ("content-number", chat, False, {"messages": message(role="user", content=1)}, "content"),
    ("content-parts", chat, False, {"messages": message(role="user", content=[])}, "content"),
    ("thinking-list", chat, False, {"messages": message(role="assistant", thinking=[])},
     "thinking"),
    ("images-on-a-text-model", chat, False, {"messages": message(role="user", images=[PNG])},
     "images"),
    ("images-string", chat, True, {"messages": message(role="user", images=PNG)}, "images"),
    ("image-number", chat, True, {"messages": message(role="user", images=[1])}, "images[0]"),
    ("image-not-base64", chat, True, {"messages": message(role="user", images=["%"])},
     "images[0]"),
    ("image-not-an-image", chat, True, {"messages": message(role="user", images=["aGk="])},
     "images[0]"),
    ("images-of-the-assistant", chat, True,
     {"messages": message(role="assistant", images=[PNG])}, "images"),
    ("tool-calls-string", chat, False, {"messages": message(role="assistant", tool_calls="f")},
     "tool_calls"),
    ("tool-calls-object", chat, False, {"messages": message(role="assistant", tool_calls={})},
     "tool_calls"),
    ("tool-call-number", chat, False, {"messages": message(role="assistant", tool_calls=[1])},
     "tool_calls[0]"),
    ("tool-call-unnamed", chat, False,
     {"messages": message(role="assistant", tool_calls=[{"function": {"name": ""}}])},
     "tool_calls[0]"),
    ("tool-call-arguments-list", chat, False,
     {"messages": message(role="assistant",
                          tool_calls=[{"function": {"name": "f", "arguments": [1]}}])},
     "arguments"),
    ("tool-name-number", chat, False,
     {"messages": [CALLED, {"role": "tool", "content": "x", "tool_name": 5}]}, "tool_name"),
    ("tool-name-of-no-call", chat, False,
     {"messages": [CALLED, {"role": "tool", "content": "x", "tool_name": "g"}]}, "messages[1]"),
    ("tool-result-first", chat, False, {"messages": message(role="tool", content="x")},
     "messages[0]"),
    ("tools-string", chat, False, {"tools": "f"}, "tools"),
    ("tool-number", chat, False, {"tools": [1]}, "tools[0]"),
    ("tool-nameless", chat, False, {"tools": [{"function": {}}]}, "tools[0]"),
    ("tool-type", chat, False, {"tools": [{"type": "x", "function": {"name": "f"}}]}, "type"),
    ("options-list", chat, False, {"options": []}, "options"),
    ("temperature-string", chat, False, {"options": {"temperature": "hot"}}, "temperature"),
    ("top-k-fraction", chat, False, {"options": {"top_k": 0.5}}, "top_k"),
    ("format-xml", chat, False, {"format": "xml"}, "format"),
    ("format-number", chat, False, {"format": 1}, "format"),
    ("think-number", chat, False, {"think": 1}, "think"),
    ("think-level", chat, False, {"think": "max"}, "think"),
    ("stream-string", chat, False, {"stream": "yes"}, "stream"),
    ("top-logprobs", chat, False, {"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
    ("prompt-number", generate, False, {"prompt": 1}, "prompt"),
    ("system-object", generate, False, {"system": {}}, "system"),
    ("raw-string", generate, False, {"raw": "true"}, "raw"),
    ("template", generate, False, {"template": "{{ .Prompt }}"}, "template"),
    ("template-false", generate, False, {"template": False}, "template"),
    ("suffix-zero", generate, False, {"suffix": 0}, "suffix"),
    ("context", generate, False, {"context": [1, 2]}, "context"),
    ("context-object", generate, False, {"context": {}}, "context"),
    ("images-string-generate", generate, True, {"images": PNG}, "images"),
    ("images-raw", generate, True, {"images": [PNG], "raw": True}, "images"),
    ("images-generate-text-model", generate, False, {"images": [PNG]}, "images"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("translate", "vision", "fields", "named"), [w[1:] for w in WRONG], ids=[w[0] for w in WRONG]
)
def test_a_field_of_the_wrong_type_is_a_400_naming_it(
    translate: Any, vision: bool, fields: dict[str, Any], named: str
) -> None:
    with pytest.raises(InvalidRequest) as refused:
        translate(vision, **fields)
    assert refused.value.status == 400
    assert named in (refused.value.param or ""), refused.value.message


values = json_values(text=8, size=3, leaves=10, integers=10**12)
messages = st.lists(
    st.fixed_dictionaries(
        {},
        optional={
            "role": st.sampled_from(["user", "system", "assistant", "tool"]) | values,
            "content": st.text(max_size=5) | values,
            "images": values,
            "tool_calls": values
            | st.lists(st.fixed_dictionaries({"function": st.just({"name": "f"}) | values})),
            "tool_name": st.just("f") | values,
            "tool_call_id": values,
            "thinking": values,
        },
    ),
    max_size=4,
)
bodies = st.fixed_dictionaries(
    {},
    optional={
        "model": values,
        "messages": messages | values,
        "prompt": st.text(max_size=5) | values,
        "system": values,
        "stream": values,
        "options": st.dictionaries(
            st.sampled_from(["temperature", "top_k", "num_predict", "num_ctx", "stop", "seed"]),
            values,
        )
        | values,
        "format": values,
        "think": values,
        "tools": values,
        "raw": values,
        "images": values,
        "suffix": values,
        "template": values,
        "context": values,
        "logprobs": values,
        "top_logprobs": values,
    },
)


@settings(
    max_examples=400,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(body=bodies, images=st.booleans(), context=st.none() | st.integers(1, 10_000))
def test_no_body_makes_the_translation_fail_but_with_a_400(
    body: dict[str, Any], images: bool, context: int | None
) -> None:
    for translate in (chat_request, generate_request):
        try:
            translated = translate(body, takes_images=images, context_length=context)
            if translated.kind == "chat":
                check_tool_calls(translated.body)  # as the endpoint checks it
        except InvalidRequest as error:
            refused: InvalidRequest | None = error
        else:
            refused = None
            json.loads(dumps_body(translated.body))  # strict JSON: nothing a backend fails on
        assert refused is None or (refused.status == 400 and refused.param)


def test_ollama_streams_unless_told_not_to() -> None:
    assert chat().stream is True
    assert chat(stream=None).stream is True
    assert chat(stream=False).stream is False
    streamed = chat(stream=True).body
    assert streamed["stream"] is True
    assert streamed["stream_options"] == {"include_usage": True}
    assert "stream" not in chat(stream=False).body


def test_tool_results_answer_their_calls_by_name_or_in_order() -> None:
    calls = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"function": {"name": "weather", "arguments": {"city": "Paris"}}},
            {"id": "mine", "function": {"name": "time", "arguments": '{"zone": "UTC"}'}},
        ],
    }
    history = [
        *HI,
        calls,
        {"role": "tool", "content": "12:00", "tool_name": "time"},
        {"role": "tool", "content": "sunny"},  # no name: the first call left
    ]
    sent = chat(messages=history).body["messages"]
    made = sent[1]["tool_calls"]
    assert [c["id"] for c in made] == ["call_1_0", "mine"]
    assert json.loads(made[0]["function"]["arguments"]) == {"city": "Paris"}
    assert made[1]["function"]["arguments"] == '{"zone": "UTC"}'
    assert sent[2] == {"role": "tool", "tool_call_id": "mine", "content": "12:00"}
    assert sent[3] == {"role": "tool", "tool_call_id": "call_1_0", "content": "sunny"}
    check_tool_calls(chat(messages=history).body)


def test_a_call_answered_twice_is_refused() -> None:
    history = [
        CALLED,
        {"role": "tool", "content": "a", "tool_name": "f"},
        {"role": "tool", "content": "b", "tool_name": "f"},
    ]
    with pytest.raises(InvalidRequest) as refused:
        chat(messages=history)
    assert refused.value.param == "messages[2]"


@pytest.mark.parametrize("prefix", ["", "data:image/png;base64,"])
def test_images_become_image_parts_of_their_own_type(prefix: str) -> None:
    asked = [{"role": "user", "content": "what?", "images": [prefix + PNG]}]
    body = chat(True, messages=asked).body
    image, text = body["messages"][0]["content"]
    assert image == {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}
    assert text == {"type": "text", "text": "what?"}


def test_generate_is_a_user_turn_and_raw_is_the_prompt_as_it_is() -> None:
    templated = generate(system="Be brief.", prompt="Why?")
    assert templated.kind == "chat"
    assert templated.body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Why?"},
    ]
    raw = generate(prompt="<s>1, 2,", raw=True, options={"num_predict": 3})
    assert raw.kind == "completions"
    assert raw.body["prompt"] == "<s>1, 2,"
    assert raw.body["max_tokens"] == 3
    assert "messages" not in raw.body


def test_a_request_that_asks_nothing_is_empty() -> None:
    assert generate(prompt="").empty
    assert generate(prompt=None).empty
    assert generate(prompt="", raw=True).empty
    assert chat(messages=[]).empty
    assert not generate().empty
    assert not generate(True, prompt="", images=[PNG]).empty


@pytest.mark.parametrize(
    ("think", "fields"),
    [
        (None, {}),
        (False, {"chat_template_kwargs": {"enable_thinking": False}}),
        (True, {"chat_template_kwargs": {"enable_thinking": True}}),
        ("low", {"chat_template_kwargs": {"enable_thinking": True}, "reasoning_effort": "low"}),
    ],
)
def test_think_is_the_templates_switch_and_the_effort(think: Any, fields: dict[str, Any]) -> None:
    body = chat(think=think).body
    assert {k: body[k] for k in ("chat_template_kwargs", "reasoning_effort") if k in body} == (
        fields
    )


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("json", {"type": "json_object"}),
        (
            {"type": "object"},
            {
                "type": "json_schema",
                "json_schema": {"name": "format", "schema": {"type": "object"}},
            },
        ),
        ("", None),
        (None, None),
    ],
)
def test_format_is_the_response_format(given: Any, expected: dict[str, Any] | None) -> None:
    assert chat(format=given).body.get("response_format") == expected
