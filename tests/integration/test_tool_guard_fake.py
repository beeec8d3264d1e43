"""Tool calls settled by the router before the client sees them (issue 42), against
fake backends that write the calls small models write, through the official ``openai``
and ``anthropic`` SDKs on chat completions, Responses and Messages, whole and streamed.

Two stacks, both real processes:

* the real launcher running the fake llama-server (``tests/fakes/fake-llama-server``),
  so that the launcher publishes the server kind ``llama-server`` and the router's
  constrained paths run (the retry under a JSON schema, the forced call), the real
  router in front; the watchdog's own log is read after every test on it, and nothing a
  test does may count against the backend;
* a router in front of a fake it did not start (no launcher: the server kind unknown),
  where no request may be sent under a JSON schema.

Every call that reaches a client is checked with ``jsonschema`` against the offered
tool's parameters; every other answer must be text, with the reason named on a whole
answer (``x-slm-tool-failed``), the repairs named in ``x-slm-tool-repairs``.
"""

from __future__ import annotations

import copy
import json
import socket
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

import anthropic
import httpx
import jsonschema
import openai
import pytest

from slm_server.router.toolcalls.forcing import RETRY_CHARS
from tests import one_shot
from tests.anthropic_shapes import strict_message
from tests.fakes.control import FakeBackend
from tests.integration.watched import Watched, fake_entry, watched
from tests.openai_shapes import strict_chat_chunks, strict_chat_completion, strict_response
from tests.processes import RunningRouter, StartRouter, poll
from tests.registry_entries import registry_entry

# Its module-scoped stacks start once: one worker runs the whole module.
pytestmark = pytest.mark.xdist_group("test_tool_guard_fake")

FAKE_ROLES = ("plain",)  # the fake in front of which no launcher runs
PLAIN = "plain"
AGENT = "fake-agent"  # the entry the launcher runs as llama-server
RAW = "agent-raw"  # its alias that does not repair
RENDERED = "agent-rendered"  # its alias whose tools the router writes into the prompt
UNTEMPLATED = "fake-untemplated"  # an entry whose template takes no tools (auto)
PROMPT = "What is the weather in Paris?"
DEADLINE = 15  # the agent's requests' (seconds)
REPAIRS = "x-slm-tool-repairs"
FAILED = "x-slm-tool-failed"
GUARD_OFF = {"x-slm-tool-guard": "off"}

WEATHER: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "days": {"type": "integer", "minimum": 1},
        "metric": {"type": "boolean"},
        "note": {"type": ["string", "null"]},
    },
    "required": ["city"],
    "additionalProperties": False,
}
SEARCH: dict[str, Any] = {
    "type": "object",
    "properties": {"query": {"type": "string"}},
    "required": ["query"],
}
OFFERED = {"get_weather": WEATHER, "search_web": SEARCH}
# What the constrained retry answers in the table: a valid call, as JSON text.
RETRY_CALL = '{"name": "get_weather", "arguments": {"city": "Oslo"}}'

Api = Literal["chat", "responses", "messages"]
Mode = Literal["whole", "stream"]
APIS: tuple[Api, ...] = ("chat", "responses", "messages")
MODES: tuple[Mode, ...] = ("whole", "stream")


# ---------------------------------------------------------------- the stacks


@dataclass
class Scripted:
    """A fake backend the launcher started, scripted on its own port."""

    url: str

    def script(self, **fields: Any) -> None:
        one_shot.post(f"{self.url}/_control", json=fields, timeout=5).raise_for_status()

    def reset(self) -> None:
        one_shot.post(f"{self.url}/_reset", timeout=5).raise_for_status()

    def requests(self) -> list[dict[str, Any]]:
        answer = one_shot.get(f"{self.url}/_requests", timeout=5)
        answer.raise_for_status()
        records: list[dict[str, Any]] = answer.json()
        return records

    def bodies(self) -> list[dict[str, Any]]:
        return [r["body"] for r in self.requests() if r["path"] == "/v1/chat/completions"]

    def wait_for(
        self, predicate: Callable[[list[dict[str, Any]]], object], timeout: float = 10.0
    ) -> list[dict[str, Any]]:
        """Poll the recorded requests until ``predicate`` holds; fail after ``timeout``."""
        found: list[list[dict[str, Any]]] = []

        def holds() -> bool:
            found[:] = [self.requests()]
            return bool(predicate(found[0]))

        poll(holds, timeout, "the fake backend's requests")
        return found[0]


@dataclass
class Stack:
    """The launcher, its fake llama-servers and the router, with what the watchdog did."""

    watched: Watched
    agent: Scripted
    untemplated: Scripted
    pids: dict[str, int] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.watched.url

    def blamed(self) -> list[dict[str, Any]]:
        """Every watchdog event that counts against a backend or restarts one."""
        names = (
            "backend_failure",
            "restart_requested",
            "restart_started",
            "backend_exited",
            "backend_not_running",
            "request_retried",
        )
        return [e for e in self.watched.events() if e["event"] in names]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("toolguard")
    aliases = [
        {"name": RAW, "tools": {"repair": False}},
        {"name": RENDERED, "tools": "render"},
    ]
    models = {
        "agent": fake_entry(
            tmp, "agent", aliases=aliases, max_concurrency=1, default_timeout=DEADLINE
        ),
        "untemplated": fake_entry(tmp, "untemplated"),
    }
    # Stalls and silences measured in seconds, not the watched stack's one: a busy
    # machine must not make a slow answer look like a backend failing.
    with watched(
        tmp,
        models,
        SLM_OTEL_ENABLED="false",
        SLM_WATCHDOG_STALL_SECONDS="30",
        SLM_WATCHDOG_SILENCE_SECONDS="30",
    ) as running:
        agent = Scripted(f"http://127.0.0.1:{running.port('agent')}")
        untemplated = Scripted(f"http://127.0.0.1:{running.port('untemplated')}")
        made = Stack(running, agent, untemplated)
        made.pids = {role: running.pid(role) for role in models}
        yield made


@pytest.fixture
def llama(stack: Stack) -> Iterator[Stack]:
    """The stack, its fakes reset; afterwards, nothing counted against a backend."""
    stack.agent.reset()
    stack.untemplated.reset()
    yield stack
    assert stack.blamed() == [], "a test counted against the backend"
    assert {role: stack.watched.pid(role) for role in stack.pids} == stack.pids
    assert stack.watched.state("agent")["state"] == "ready"


@pytest.fixture(scope="module")
def router_process(fakes: dict[str, FakeBackend], start_router: StartRouter) -> RunningRouter:
    return start_router({PLAIN: registry_entry(PLAIN, fakes[PLAIN].port)}, SLM_OTEL_ENABLED="false")


# ---------------------------------------------------------------- the clients


@dataclass
class Answer:
    """What a client got, in any API: the calls (name, arguments as JSON text), the
    text, whether it ended for the calls ("tool_calls") or not ("stop"), the headers of
    a whole answer, and for a stream how many deltas carried each call's arguments."""

    calls: list[tuple[str, str]]
    text: str
    ended: str
    headers: Mapping[str, str] = field(default_factory=dict)
    pieces: list[int] = field(default_factory=list)

    def arguments(self, tools: Mapping[str, Any] = OFFERED) -> list[dict[str, Any]]:
        """Each call's arguments, checked against its tool's parameters (strict JSON:
        no NaN or Infinity)."""
        parsed = []
        for name, text in self.calls:
            value = json.loads(text, parse_constant=_not_json)
            jsonschema.validate(value, tools[name])
            parsed.append(value)
        return parsed


def _not_json(literal: str) -> None:
    raise AssertionError(f"{literal} is not JSON")


def chat_tools(tools: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [
        {"type": "function", "function": {"name": name, "description": name, "parameters": p}}
        for name, p in tools.items()
    ]


def responses_tools(tools: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [
        {"type": "function", "name": name, "description": name, "parameters": p, "strict": False}
        for name, p in tools.items()
    ]


def messages_tools(tools: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [{"name": name, "description": name, "input_schema": p} for name, p in tools.items()]


def choice_of(api: Api, choice: str | None) -> dict[str, Any]:
    """``tool_choice`` in the API's own words: None (auto), "required", or a tool's name."""
    if choice is None:
        return {}
    if api == "chat":
        named = {"type": "function", "function": {"name": choice}}
        return {"tool_choice": "required" if choice == "required" else named}
    if api == "responses":
        return {
            "tool_choice": "required"
            if choice == "required"
            else {"type": "function", "name": choice}
        }
    return {
        "tool_choice": {"type": "any"} if choice == "required" else {"type": "tool", "name": choice}
    }


def ask(
    url: str,
    api: Api,
    mode: Mode,
    *,
    model: str = AGENT,
    tools: Mapping[str, Any] | None = None,
    choice: str | None = None,
    headers: Mapping[str, str] | None = None,
    timeout: float = 30.0,
) -> Answer:
    """One request through the API's official SDK, its answer parsed into the SDK's own
    types (strictly, where the tests' shape checks can)."""
    offered = OFFERED if tools is None else tools
    extra = dict(headers or {})
    if api == "chat":
        with openai.OpenAI(
            base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=timeout
        ) as sdk:
            return _chat(sdk, mode, model, offered, choice_of(api, choice), extra)
    if api == "responses":
        with openai.OpenAI(
            base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=timeout
        ) as sdk:
            return _responses(sdk, mode, model, offered, choice_of(api, choice), extra)
    with anthropic.Anthropic(base_url=url, api_key="x", max_retries=0, timeout=timeout) as sdk:
        return _messages(sdk, mode, model, offered, choice_of(api, choice), extra)


def _chat(
    sdk: openai.OpenAI,
    mode: Mode,
    model: str,
    tools: Mapping[str, Any],
    choice: dict[str, Any],
    headers: dict[str, str],
) -> Answer:
    offered: Any = chat_tools(tools)
    messages: Any = [{"role": "user", "content": PROMPT}]
    if mode == "whole":
        raw = sdk.chat.completions.with_raw_response.create(
            model=model, messages=messages, tools=offered, extra_headers=headers, **choice
        )
        completion = strict_chat_completion(json.loads(raw.http_response.text))
        assert raw.parse().model_dump() == completion.model_dump()
        [only] = completion.choices
        calls = [
            (c.function.name, c.function.arguments)
            for c in only.message.tool_calls or ()
            if c.type == "function"
        ]
        return Answer(calls, only.message.content or "", only.finish_reason, dict(raw.headers))
    stream = sdk.chat.completions.create(
        model=model, messages=messages, tools=offered, extra_headers=headers, stream=True, **choice
    )
    chunks = list(stream)
    strict_chat_chunks([c.model_dump(exclude_unset=True) for c in chunks])
    text, ended = "", ""
    names: dict[int, str] = {}
    arguments: dict[int, str] = {}
    pieces: dict[int, int] = {}
    for chunk in chunks:
        for part in chunk.choices:
            assert not ended, "a delta came after the finish chunk"
            text += part.delta.content or ""
            for call in part.delta.tool_calls or ():
                pieces[call.index] = pieces.get(call.index, 0) + 1
                if call.function is not None:
                    names[call.index] = names.get(call.index, "") + (call.function.name or "")
                    arguments[call.index] = arguments.get(call.index, "") + (
                        call.function.arguments or ""
                    )
            ended = part.finish_reason or ""
    order = sorted(names)
    return Answer(
        [(names[i], arguments[i]) for i in order], text, ended, pieces=[pieces[i] for i in order]
    )


def _responses(
    sdk: openai.OpenAI,
    mode: Mode,
    model: str,
    tools: Mapping[str, Any],
    choice: dict[str, Any],
    headers: dict[str, str],
) -> Answer:
    offered: Any = responses_tools(tools)
    if mode == "whole":
        raw = sdk.responses.with_raw_response.create(
            model=model, input=PROMPT, tools=offered, extra_headers=headers, **choice
        )
        response = strict_response(json.loads(raw.http_response.text))
        return _response_answer(response.output, response.output_text, dict(raw.headers))
    events = list(
        sdk.responses.create(
            model=model, input=PROMPT, tools=offered, extra_headers=headers, stream=True, **choice
        )
    )
    final = events[-1]
    assert final.type == "response.completed", [e.type for e in events]
    deltas: dict[str, int] = {}
    for event in events:
        if event.type == "response.function_call_arguments.delta":
            deltas[event.item_id] = deltas.get(event.item_id, 0) + 1
    answer = _response_answer(final.response.output, final.response.output_text, {})
    ids = [item.id or "" for item in final.response.output if item.type == "function_call"]
    answer.pieces = [deltas.get(i, 0) for i in ids]
    return answer


def _response_answer(output: list[Any], text: str, headers: dict[str, str]) -> Answer:
    calls = [(item.name, item.arguments) for item in output if item.type == "function_call"]
    return Answer(calls, text, "tool_calls" if calls else "stop", headers)


def _messages(
    sdk: anthropic.Anthropic,
    mode: Mode,
    model: str,
    tools: Mapping[str, Any],
    choice: dict[str, Any],
    headers: dict[str, str],
) -> Answer:
    offered: Any = messages_tools(tools)
    messages: Any = [{"role": "user", "content": PROMPT}]
    if mode == "whole":
        raw = sdk.messages.with_raw_response.create(
            model=model,
            max_tokens=256,
            messages=messages,
            tools=offered,
            extra_headers=headers,
            **choice,
        )
        message = strict_message(json.loads(raw.http_response.text))
        return _message_answer(message, dict(raw.headers))
    with sdk.messages.stream(
        model=model,
        max_tokens=256,
        messages=messages,
        tools=offered,
        extra_headers=headers,
        **choice,
    ) as stream:
        events = list(stream)
        final = stream.get_final_message()
    deltas: dict[int, int] = {}
    for event in events:
        if event.type == "content_block_delta" and event.delta.type == "input_json_delta":
            deltas[event.index] = deltas.get(event.index, 0) + 1
    answer = _message_answer(final, {})
    answer.pieces = [deltas.get(i, 0) for i, b in enumerate(final.content) if b.type == "tool_use"]
    return answer


def _message_answer(message: Any, headers: dict[str, str]) -> Answer:
    calls = [(b.name, json.dumps(b.input)) for b in message.content if b.type == "tool_use"]
    text = "".join(b.text for b in message.content if b.type == "text")
    ended = {"tool_use": "tool_calls", "end_turn": "stop"}.get(message.stop_reason, "")
    return Answer(calls, text, ended or str(message.stop_reason), headers)


def native(name: str, arguments: str) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


def text_answer(text: str) -> dict[str, Any]:
    """A script whose every answer (first and retried, whole or streamed) is ``text``."""
    return {"reply": text, "chunks": 1, "chunk_text": text}


def first_calls_then(calls: list[dict[str, Any]], retried: str = RETRY_CALL) -> dict[str, Any]:
    """A script whose first answer makes ``calls`` and whose retry under the JSON schema
    answers ``retried`` as text."""
    return {"tool_calls": calls, "body_lacks": "json_schema", **text_answer(retried)}


def repairs_of(answer: Answer) -> set[str]:
    value = answer.headers.get(REPAIRS)
    return set() if value is None else {part.strip() for part in value.split(",")}


def retries(bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The requests the router sent under a JSON schema."""
    return [
        b
        for b in bodies
        if isinstance(b.get("response_format"), dict)
        and b["response_format"].get("type") == "json_schema"
    ]


# ---------------------------------------------------------------- the calls small models write


@dataclass(frozen=True)
class Row:
    """A call as the model writes it (``script``), and what the client must get: the
    call (its name and arguments), with the repairs named, or text with the reason."""

    script: dict[str, Any]
    call: tuple[str, dict[str, Any]] | None
    repairs: frozenset[str] = frozenset()
    text: str = ""  # beside the call
    reason: str | None = None  # in x-slm-tool-failed
    exact: str | None = None  # the arguments byte for byte
    asked: int = 1  # requests the backend gets: 2 when asked again


VALID = '{"city": "Paris", "days": 3}'
CODE = 'Try this:\n```python\nprint({"name": "get_weather"})\n```\nDone.'
PARIS = {"city": "Paris", "days": 3}
JSON_FIX = frozenset({"arguments_json"})
EXTRACTED = frozenset({"extracted"})


def weather(arguments: str, name: str = "get_weather") -> dict[str, Any]:
    return first_calls_then([native(name, arguments)])


ROWS = [
    pytest.param(Row(weather(VALID), ("get_weather", PARIS), exact=VALID), id="valid"),
    pytest.param(Row(weather(VALID[:-1]), ("get_weather", PARIS), JSON_FIX), id="truncated"),
    pytest.param(
        Row(weather("{'city': 'Paris', 'days': 3}"), ("get_weather", PARIS), JSON_FIX),
        id="single-quotes",
    ),
    pytest.param(
        Row(weather('{"city": "Paris", "days": 3,}'), ("get_weather", PARIS), JSON_FIX),
        id="trailing-comma",
    ),
    pytest.param(
        Row(
            weather('{"city": "Paris", "metric": True}'),
            ("get_weather", {"city": "Paris", "metric": True}),
            JSON_FIX,
        ),
        id="python-true",
    ),
    pytest.param(
        Row(
            weather('{"city": "Paris", "note": None}'),
            ("get_weather", {"city": "Paris", "note": None}),
            JSON_FIX,
        ),
        id="python-none",
    ),
    pytest.param(
        Row(weather(f"```json\n{VALID}\n```"), ("get_weather", PARIS), JSON_FIX),
        id="markdown-fence",
    ),
    pytest.param(
        Row(weather(VALID, "GET_WEATHER"), ("get_weather", PARIS), frozenset({"name"})),
        id="wrong-case-name",
    ),
    pytest.param(
        Row(weather(VALID, "get_wether"), ("get_weather", PARIS), frozenset({"name"})),
        id="misspelled-name",
    ),
    pytest.param(
        Row(
            weather('{"city": "Paris", "days": "3"}'),
            ("get_weather", PARIS),
            frozenset({"arguments_schema"}),
        ),
        id="string-number",
    ),
    pytest.param(
        Row(
            weather('{"days": 3}'),
            ("get_weather", {"city": "Oslo"}),
            frozenset({"retried"}),
            asked=2,
        ),
        id="missing-required-retried",
    ),
    pytest.param(
        Row(
            first_calls_then([native("get_weather", '{"days": 3}')], "Sorry, I cannot."),
            None,
            frozenset({"retried"}),
            reason="'city' is a required property",
            asked=2,
        ),
        id="missing-required-retry-fails",
    ),
    pytest.param(
        Row(
            weather('{"city": "Paris", "days": 0}'),
            ("get_weather", {"city": "Oslo"}),
            frozenset({"retried"}),
            asked=2,
        ),
        id="out-of-range-retried",
    ),
    pytest.param(
        Row(
            weather('{"to": "Oslo"}', "book_flight"),
            None,
            reason="no offered tool is named 'book_flight'",
        ),
        id="unknown-tool",
    ),
    pytest.param(
        Row(
            text_answer(
                'Sure! <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}'
                "</tool_call>"
            ),
            ("get_weather", {"city": "Paris"}),
            EXTRACTED,
            text="Sure!",
        ),
        id="call-inside-text",
    ),
    pytest.param(
        Row(
            text_answer(
                "Here you go:\n```json\n"
                '{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n```'
            ),
            ("get_weather", PARIS),
            EXTRACTED,
            text="Here you go:",
        ),
        id="json-code-block",
    ),
    pytest.param(
        Row(
            text_answer('{"name": "get_weather", "arguments": {"city": "Paris"}}'),
            ("get_weather", {"city": "Paris"}),
            EXTRACTED,
        ),
        id="whole-answer-json",
    ),
    pytest.param(
        Row(
            text_answer(
                "<tool_call>{'name': 'get_weather', 'arguments': {'city': 'Paris', 'days': '3',}}"
            ),
            ("get_weather", PARIS),
            frozenset({"extracted", "arguments_schema"}),
        ),
        id="broken-call-in-unclosed-tag",
    ),
    pytest.param(
        Row(text_answer("It is sunny in Paris."), None, text="It is sunny in Paris."),
        id="plain-text",
    ),
    pytest.param(
        Row(text_answer('{"answer": 42}'), None, text='{"answer": 42}'),
        id="json-that-is-no-call",
    ),
    pytest.param(
        Row(text_answer(CODE), None, text=CODE),
        id="code-block-that-is-no-call",
    ),
    pytest.param(
        Row(
            text_answer('<tool_call>{"name": "get_weather", "arguments": {"days": 3}}</tool_call>'),
            None,
            frozenset({"extracted", "retried"}),
            reason="'city' is a required property",
            asked=2,
        ),
        id="text-call-missing-required",
    ),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("row", ROWS)
def test_a_call_reaches_the_client_valid_repaired_or_as_text_with_its_reason(
    llama: Stack, api: Api, mode: Mode, row: Row, request: pytest.FixtureRequest
) -> None:
    llama.agent.script(**row.script)
    answer = ask(llama.url, api, mode)
    if row.call is None:
        assert answer.calls == []
        assert answer.ended == "stop"
        assert answer.text.strip(), "the answer in the place of the call has no text"
        if row.text:
            assert answer.text == row.text
    else:
        name, arguments = row.call
        assert answer.ended == "tool_calls"
        assert [called for called, _ in answer.calls] == [name]
        assert answer.arguments() == [arguments]
        assert answer.text.strip() == row.text
        if row.exact is not None and api != "messages":  # Messages gives an object
            assert answer.calls[0][1] == row.exact
        if mode == "stream":
            assert answer.pieces == [1], "a held call is released in one delta"
    if mode == "whole":
        assert repairs_of(answer) == row.repairs
        failed = answer.headers.get(FAILED)
        if row.reason is None:
            assert failed is None
        else:
            assert failed is not None and row.reason in failed, failed
    bodies = llama.agent.bodies()
    assert len(bodies) == row.asked
    assert retries(bodies) == bodies[1:]
    assert "tools" in bodies[0], "no template caps known: the tools are left to the template"


# ---------------------------------------------------------------- the retry


def system_text(body: dict[str, Any]) -> str:
    first = body["messages"][0]
    assert first["role"] == "system", body["messages"]
    text = first["content"]
    assert isinstance(text, str)
    return text


@pytest.mark.parametrize("mode", MODES)
def test_an_unrepairable_call_is_asked_again_once_under_a_json_schema_without_tools(
    llama: Stack, mode: Mode
) -> None:
    llama.agent.script(**weather('{"days": 3}'))
    answer = ask(llama.url, "chat", mode)
    assert answer.ended == "tool_calls"
    assert [name for name, _ in answer.calls] == ["get_weather"]
    assert answer.arguments() == [{"city": "Oslo"}]
    if mode == "whole":
        assert repairs_of(answer) == {"retried"}
        assert FAILED not in answer.headers
    first, again = llama.agent.bodies()
    assert first["tools"] == chat_tools(OFFERED) and "response_format" not in first
    for gone in ("tools", "tool_choice", "parallel_tool_calls"):
        assert gone not in again
    form = again["response_format"]
    assert form["type"] == "json_schema"
    schema = form["json_schema"]["schema"]
    # One branch: the tool the model failed to call, its parameters as offered, each
    # open string bounded (a grammar that must end: the first answer may have looped).
    assert schema["properties"]["name"] == {"const": "get_weather"}
    bounded = copy.deepcopy(WEATHER)
    for name in ("city", "note"):
        bounded["properties"][name]["maxLength"] = RETRY_CHARS
    assert schema["properties"]["arguments"] == bounded
    jsonschema.validate(json.loads(RETRY_CALL), schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"name": "get_weather", "arguments": {"days": 3}}, schema)
    long_city = {"city": "x" * (RETRY_CHARS + 1)}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"name": "get_weather", "arguments": long_city}, schema)
    tools = system_text(again)
    assert "<tools>" in tools and '"name": "get_weather"' in tools
    assert again["messages"][1:] == first["messages"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("api", APIS)
def test_a_retry_the_backend_answers_500_leaves_the_first_answer_as_text_with_the_reason(
    llama: Stack, api: Api, mode: Mode
) -> None:
    llama.agent.script(tool_calls=[native("get_weather", '{"days": 3}')], statuses=[200, 500])
    started = time.monotonic()
    answer = ask(llama.url, api, mode)
    assert time.monotonic() - started < 5
    assert answer.calls == []
    assert answer.ended == "stop"
    assert '{\\"days\\": 3}' in answer.text or '{"days": 3}' in answer.text, answer.text
    if mode == "whole":
        assert "'city' is a required property" in answer.headers[FAILED]
        assert repairs_of(answer) == {"retried"}
    assert len(retries(llama.agent.bodies())) == 1
    # The router is up, and the backend answers the next request.
    llama.agent.script(tool_calls=[native("get_weather", VALID)])
    assert ask(llama.url, api, mode).calls[0][0] == "get_weather"


# ---------------------------------------------------------------- the guard turned off


BROKEN = "{'city': 'Paris',}"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("how", ["header", "alias"])
def test_with_the_guard_or_the_repair_off_a_malformed_call_passes_as_the_backend_sent_it(
    llama: Stack, api: Api, mode: Mode, how: str
) -> None:
    llama.agent.script(**weather(BROKEN))
    answer = ask(
        llama.url,
        api,
        mode,
        model=RAW if how == "alias" else AGENT,
        headers=GUARD_OFF if how == "header" else None,
    )
    if api == "messages":  # a tool's input must be an object: the text goes in one
        [(name, arguments)] = answer.calls
        assert (name, json.loads(arguments)) == ("get_weather", {"_raw_arguments": BROKEN})
    else:
        assert answer.calls == [("get_weather", BROKEN)]
    assert answer.ended == "tool_calls"
    assert REPAIRS not in answer.headers and FAILED not in answer.headers
    [body] = llama.agent.bodies()
    assert body["tools"] == chat_tools(OFFERED)


@pytest.mark.parametrize("how", ["header", "alias"])
def test_with_the_guard_or_the_repair_off_an_unknown_tool_is_not_asked_again(
    llama: Stack, how: str
) -> None:
    llama.agent.script(**weather('{"days": 3}', "book_flight"))
    answer = ask(
        llama.url,
        "chat",
        "whole",
        model=RAW if how == "alias" else AGENT,
        headers=GUARD_OFF if how == "header" else None,
    )
    assert answer.calls == [("book_flight", '{"days": 3}')]
    assert REPAIRS not in answer.headers and FAILED not in answer.headers
    assert len(llama.agent.bodies()) == 1


def test_with_the_guard_off_a_required_call_is_left_to_the_backend(llama: Stack) -> None:
    llama.agent.script(tool_calls=[native("get_weather", VALID)])
    answer = ask(llama.url, "chat", "whole", choice="required", headers=GUARD_OFF)
    assert answer.calls == [("get_weather", VALID)]
    [body] = llama.agent.bodies()
    assert body["tool_choice"] == "required"
    assert body["tools"] == chat_tools(OFFERED)
    assert "response_format" not in body


# ---------------------------------------------------------------- forced calls


FORCED = '{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}'


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("choice", ["required", "get_weather"])
def test_a_required_or_named_call_is_asked_under_the_json_schema_and_its_json_is_the_call(
    llama: Stack, api: Api, mode: Mode, choice: str
) -> None:
    llama.agent.script(**text_answer(FORCED))
    answer = ask(llama.url, api, mode, choice=choice)
    assert answer.ended == "tool_calls"
    assert [name for name, _ in answer.calls] == ["get_weather"]
    assert answer.arguments() == [PARIS]
    assert answer.text == "", "the forced answer's JSON leaked as text"
    if mode == "stream":
        assert answer.pieces == [1]
    else:
        assert REPAIRS not in answer.headers and FAILED not in answer.headers
    [body] = llama.agent.bodies()
    for gone in ("tools", "tool_choice", "parallel_tool_calls"):
        assert gone not in body
    assert body["response_format"]["type"] == "json_schema"
    schema = body["response_format"]["json_schema"]["schema"]
    branches = schema.get("anyOf", [schema])
    names = [b["properties"]["name"]["const"] for b in branches]
    tools = system_text(body)
    if choice == "required":
        assert names == ["get_weather", "search_web"]
        assert "Answer with a function call now" in tools
    elif api == "responses":  # its translation narrows the tools to the named one
        assert names == ["get_weather"]
        assert '"name": "search_web"' not in tools
        assert "Answer with a function call now" in tools
    else:
        assert names == ["get_weather"]
        assert "Answer with a call to the function get_weather now" in tools
    jsonschema.validate(json.loads(FORCED), schema)


@pytest.mark.parametrize("mode", MODES)
def test_a_forced_answer_that_is_no_call_is_asked_again_once_then_ends_as_text(
    llama: Stack, mode: Mode
) -> None:
    llama.agent.script(**text_answer("I would rather not."))
    answer = ask(llama.url, "chat", mode, choice="required")
    assert answer.calls == []
    assert answer.ended == "stop"
    assert answer.text == "I would rather not."
    if mode == "whole":
        assert answer.headers[FAILED] == "the forced answer is not a call"
        assert repairs_of(answer) == {"retried"}
    bodies = llama.agent.bodies()
    assert len(bodies) == 2 and retries(bodies) == bodies


def test_a_named_choice_never_reaches_the_client_as_a_call_to_another_tool(llama: Stack) -> None:
    llama.agent.script(**text_answer('{"name": "search_web", "arguments": {"query": "Paris"}}'))
    answer = ask(llama.url, "chat", "whole", choice="get_weather")
    assert [name for name, _ in answer.calls] in ([], ["get_weather"])


# ---------------------------------------------------------------- tools in the prompt


TAGGED = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>'
)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("api", APIS)
def test_a_rendered_alias_writes_the_tools_into_the_prompt_and_reads_the_call_back(
    llama: Stack, api: Api, mode: Mode
) -> None:
    llama.agent.script(**text_answer(TAGGED))
    answer = ask(llama.url, api, mode, model=RENDERED)
    assert answer.ended == "tool_calls"
    assert [name for name, _ in answer.calls] == ["get_weather"]
    assert answer.arguments() == [PARIS]
    assert answer.text == ""
    if mode == "whole":
        assert repairs_of(answer) == {"extracted"}
    [body] = llama.agent.bodies()
    for gone in ("tools", "tool_choice", "parallel_tool_calls", "response_format"):
        assert gone not in body
    tools = system_text(body)
    for name, parameters in OFFERED.items():
        line = {"name": name, "description": name, "parameters": parameters}
        assert json.dumps(line, ensure_ascii=False) in tools


def test_a_rendered_conversation_carries_earlier_calls_and_results_as_text(llama: Stack) -> None:
    llama.agent.script(**text_answer("It is sunny."))
    history = [
        {"role": "user", "content": PROMPT},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": VALID},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    body = {"model": RENDERED, "messages": history, "tools": chat_tools(OFFERED)}
    answer = one_shot.post(f"{llama.url}/v1/chat/completions", json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"] == "It is sunny."
    [sent] = llama.agent.bodies()
    _, user, assistant, result = sent["messages"]
    assert user == history[0]
    assert assistant["role"] == "assistant" and "tool_calls" not in assistant
    assert '"name": "get_weather"' in assistant["content"] and "<tool_call>" in assistant["content"]
    assert result["role"] == "user" and "<tool_response>" in result["content"]
    assert "sunny" in result["content"]


def test_auto_renders_the_tools_where_the_template_takes_none(llama: Stack) -> None:
    llama.untemplated.script(
        props={"chat_template_caps": {"supports_tools": False}}, **text_answer(TAGGED)
    )
    answer = ask(llama.url, "chat", "whole", model=UNTEMPLATED)
    assert answer.arguments() == [PARIS]
    assert repairs_of(answer) == {"extracted"}
    [body] = llama.untemplated.bodies()
    assert "tools" not in body
    assert "<tools>" in system_text(body)


# ---------------------------------------------------------------- a server of unknown kind


def blamed(router_process: RunningRouter) -> list[str]:
    """The watchdog events of the router in front of the plain fake that count against
    it."""
    path = router_process.workdir / "logs" / "watchdog.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    names = ("backend_failure", "restart_requested")
    return [e["event"] for e in map(json.loads, lines) if e["event"] in names]


def test_a_required_call_to_a_server_of_unknown_kind_is_left_to_it(
    router_process: RunningRouter, router: str, fake: FakeBackend
) -> None:
    fake.script(tool_calls=[native("get_weather", VALID)])
    answer = ask(router, "chat", "whole", model=PLAIN, choice="required")
    assert answer.calls == [("get_weather", VALID)]
    [record] = fake.requests()
    assert record["body"]["tool_choice"] == "required"
    assert record["body"]["tools"] == chat_tools(OFFERED)
    assert "response_format" not in record["body"]
    assert blamed(router_process) == []


@pytest.mark.parametrize("mode", MODES)
def test_a_server_of_unknown_kind_is_never_sent_a_json_schema(
    router: str, fake: FakeBackend, mode: Mode
) -> None:
    fake.script(**weather('{"days": 3}'))
    answer = ask(router, "chat", mode, model=PLAIN)
    bodies = [r["body"] for r in fake.requests()]
    assert retries(bodies) == []
    assert answer.calls == [] and answer.ended == "stop"


# ---------------------------------------------------------------- hostile


def answers(url: str) -> bool:
    """Whether the router answers at once (its event loop free)."""
    try:
        return one_shot.get(f"{url}/health", timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("api", APIS)
def test_a_tool_schema_that_is_no_json_schema_ends_as_text_with_the_reason(
    llama: Stack, api: Api, mode: Mode
) -> None:
    # llama-server builds its parser from it (the router lets it in), but no JSON
    # Schema has a string for ``required``.
    unusable = {"type": "object", "properties": {"city": {"type": "string"}}, "required": "city"}
    call = '{"city": "Paris"}'
    llama.agent.script(**weather(call))
    answer = ask(llama.url, api, mode, tools={"get_weather": unusable})
    if answer.calls:  # passed as the model wrote it, unchecked
        assert answer.calls == [("get_weather", call)] or api == "messages"
        assert FAILED not in answer.headers
    else:
        assert answer.ended == "stop" and answer.text
        if mode == "whole":
            assert "not a usable JSON Schema" in answer.headers[FAILED]
    assert len(llama.agent.bodies()) <= 2
    assert answers(llama.url)


def deep_schema(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "integer"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


def deep_value(levels: int, leaf: Any) -> Any:
    value = leaf
    for _ in range(levels):
        value = {"a": value}
    return value


DEEP = 60  # as deep as the router lets a chat request's tools be (128 levels of JSON)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("api", APIS)
def test_a_deep_tool_schema_is_checked_to_its_bottom(llama: Stack, api: Api, mode: Mode) -> None:
    tools = {"get_weather": deep_schema(DEEP)}
    exact = json.dumps(deep_value(DEEP, 3))
    llama.agent.script(**weather(exact))
    valid = ask(llama.url, api, mode, tools=tools)
    assert valid.arguments(tools) == [deep_value(DEEP, 3)]
    if api != "messages":
        assert valid.calls == [("get_weather", exact)]
    llama.agent.script(**weather(json.dumps(deep_value(DEEP, "3"))))
    repaired = ask(llama.url, api, mode, tools=tools)
    assert repaired.arguments(tools) == [deep_value(DEEP, 3)]
    three = json.dumps(deep_value(DEEP, "three"))
    five = json.dumps({"name": "get_weather", "arguments": deep_value(DEEP, 5)})
    llama.agent.script(**first_calls_then([native("get_weather", three)], five))
    retried = ask(llama.url, api, mode, tools=tools)
    assert retried.arguments(tools) == [deep_value(DEEP, 5)]
    if mode == "whole":
        assert repaired.headers[REPAIRS] == "arguments_schema"
        assert repairs_of(retried) == {"retried"}
    again = retries(llama.agent.bodies())[-1]
    schema = again["response_format"]["json_schema"]["schema"]
    # Deeper than the grammar goes (32 levels), the arguments are left free there, and
    # checked after: the grammar's schema takes the valid value, whole.
    grammar = schema["properties"]["arguments"]
    jsonschema.validate(deep_value(DEEP, 5), grammar)
    assert grammar["additionalProperties"] is False


def huge_schema() -> dict[str, Any]:
    """Some 200 kB: 2,000 described properties and an enum of 10,000 values."""
    properties: dict[str, Any] = {
        f"field_{i}": {"type": "string", "description": "d" * 40} for i in range(2000)
    }
    properties["city"] = {"enum": [f"city_{i}" for i in range(10_000)]}
    properties["days"] = {"type": "integer"}
    return {"type": "object", "properties": properties, "required": ["city"]}


@pytest.mark.parametrize("mode", MODES)
def test_a_huge_tool_schema_is_checked(llama: Stack, mode: Mode) -> None:
    tools = {"get_weather": huge_schema()}
    exact = '{"city": "city_9999", "field_1999": "x"}'
    llama.agent.script(**weather(exact))
    valid = ask(llama.url, "chat", mode, tools=tools)
    assert valid.calls == [("get_weather", exact)]
    llama.agent.script(**weather('{"city": "city_9999", "days": "2"}'))
    repaired = ask(llama.url, "chat", mode, tools=tools)
    assert repaired.arguments(tools) == [{"city": "city_9999", "days": 2}]
    llama.agent.script(**first_calls_then([native("get_weather", '{"city": "Paris"}')], "No."))
    failed = ask(llama.url, "chat", mode, tools=tools)
    assert failed.calls == [] and failed.ended == "stop"


@pytest.mark.parametrize("mode", MODES)
def test_a_ref_the_checker_cannot_resolve_still_gets_an_answer(llama: Stack, mode: Mode) -> None:
    tools = {
        "get_weather": {
            "type": "object",
            "$defs": {"a~1b": {"type": "string"}},
            "properties": {"city": {"$ref": "#/$defs/a~1b"}},
            "required": ["city"],
        }
    }
    llama.agent.script(**weather('{"city": "Paris"}'))
    try:
        answer = ask(llama.url, "chat", mode, tools=tools)
    except (openai.APIError, httpx.HTTPError) as error:
        raise AssertionError(f"no answer: {error!r}") from None
    assert answer.calls == [("get_weather", '{"city": "Paris"}')] or (
        answer.calls == [] and answer.ended == "stop"
    )


TWENTY_NAMES = [
    "get_weather",
    "search_web",
    "read_file",
    "write_file",
    "list_directory",
    "run_shell",
    "send_email",
    "create_event",
    "translate_text",
    "convert_units",
    "fetch_url",
    "query_database",
    "resize_image",
    "play_music",
    "set_timer",
    "get_stock_price",
    "book_table",
    "call_taxi",
    "order_food",
    "lock_door",
]
TWENTY = {
    name: {
        "type": "object",
        "properties": {"n": {"type": "integer"}, "label": {"type": "string"}},
        "required": ["n"],
    }
    for name in TWENTY_NAMES
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("api", APIS)
def test_twenty_tools_each_call_checked_against_its_own(llama: Stack, api: Api, mode: Mode) -> None:
    calls = [
        native("read_file", '{"n": 1}'),
        native("wirte_file", '{"n": 2, "label": "a"}'),  # misspelled
        native("lock_door", "{'n': '3',}"),  # broken and a string number
    ]
    llama.agent.script(**first_calls_then(calls))
    answer = ask(llama.url, api, mode, tools=TWENTY)
    assert [name for name, _ in answer.calls] == ["read_file", "write_file", "lock_door"]
    assert answer.arguments(TWENTY) == [{"n": 1}, {"n": 2, "label": "a"}, {"n": 3}]
    if api != "messages":
        assert answer.calls[0][1] == '{"n": 1}'
    if mode == "stream":
        assert answer.pieces == [1, 1, 1]
    else:
        assert repairs_of(answer) == {"name", "arguments_json", "arguments_schema"}
    [body] = llama.agent.bodies()
    assert [t["function"]["name"] for t in body["tools"]] == TWENTY_NAMES


def test_twenty_tools_forced_are_twenty_branches_of_the_schema(llama: Stack) -> None:
    llama.agent.script(**text_answer('{"name": "order_food", "arguments": {"n": 2}}'))
    answer = ask(llama.url, "chat", "whole", tools=TWENTY, choice="required")
    assert answer.calls == [("order_food", '{"n":2}')] or answer.arguments(TWENTY) == [{"n": 2}]
    [body] = llama.agent.bodies()
    branches = body["response_format"]["json_schema"]["schema"]["anyOf"]
    assert [b["properties"]["name"]["const"] for b in branches] == TWENTY_NAMES


MEGABYTE = 1 << 20


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("api", APIS)
def test_arguments_of_a_megabyte_pass_byte_for_byte(llama: Stack, api: Api, mode: Mode) -> None:
    exact = json.dumps({"city": "Paris", "note": "x" * MEGABYTE})
    llama.agent.script(**weather(exact), tool_piece=4096)
    answer = ask(llama.url, api, mode)
    assert answer.arguments() == [json.loads(exact)]
    if api != "messages":
        assert answer.calls == [("get_weather", exact)]
    if mode == "whole":
        assert REPAIRS not in answer.headers
    else:
        assert answer.pieces == [1]


def test_a_call_streamed_in_thirty_thousand_pieces_is_released_in_one(llama: Stack) -> None:
    exact = json.dumps({"city": "Paris", "note": "x" * (MEGABYTE // 4)})
    llama.agent.script(**weather(exact))  # eight characters a chunk, as a model's tokens
    answer = ask(llama.url, "chat", "stream")
    assert answer.calls == [("get_weather", exact)]
    assert answer.pieces == [1]


def test_a_broken_call_of_half_a_megabyte_does_not_stop_the_router(llama: Stack) -> None:
    cut = json.dumps({"city": "Paris", "note": "x" * (MEGABYTE // 2)})[:-2]
    llama.agent.script(**weather(cut))
    with ThreadPoolExecutor(1) as pool:
        asked = pool.submit(ask, llama.url, "chat", "whole", timeout=60.0)
        llama.agent.wait_for(lambda records: records and records[0]["completed"])
        slow = 0
        while not asked.done():
            slow += not answers(llama.url)
        answer = asked.result()
    # Too long to mend on the event loop: asked again (a valid call), or text.
    assert answer.calls == [] or answer.arguments() == [json.loads(RETRY_CALL)["arguments"]]
    assert slow == 0, "the router did not answer /health while it settled the call"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("api", APIS)
def test_a_stream_that_ends_without_its_finish_while_a_call_is_held_ends_with_the_call(
    llama: Stack, api: Api, mode: Mode
) -> None:
    llama.agent.script(**weather(VALID[:-1]), finish_chunk=False)  # cut off, no finish
    answer = ask(llama.url, api, mode)
    assert answer.ended == "tool_calls"
    assert [name for name, _ in answer.calls] == ["get_weather"]
    assert answer.arguments() == [PARIS]
    if mode == "stream":
        assert answer.pieces == [1]
    else:
        assert repairs_of(answer) == {"arguments_json"}


def chat_request(model: str = AGENT, stream: bool = True) -> bytes:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": PROMPT}],
        "tools": chat_tools(OFFERED),
        "stream": stream,
    }
    return json.dumps(body).encode()


def sent_raw(url: str, body: bytes) -> Any:
    """A chat request sent on a socket of its own, left open (the caller closes it: a
    client that leaves)."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    sock.sendall(head.encode() + body)
    return sock


def the_slot_is_free(llama: Stack) -> None:
    """The agent's one admission slot is free: a request answers at once."""
    llama.agent.reset()
    llama.agent.script(tool_calls=[native("get_weather", VALID)])
    started = time.monotonic()
    assert ask(llama.url, "chat", "whole", timeout=10).calls == [("get_weather", VALID)]
    assert time.monotonic() - started < 3


def test_a_client_leaving_while_a_call_is_held_ends_the_backend_and_frees_the_slot(
    llama: Stack,
) -> None:
    arguments = json.dumps({"city": "Paris", "note": "x" * 400})  # some fifty pieces
    llama.agent.script(**weather(arguments), chunk_interval_seconds=0.1)
    sock = sent_raw(llama.url, chat_request())
    try:
        llama.agent.wait_for(lambda records: records and records[0]["chunks_sent"] >= 3)
    finally:
        sock.close()
    [record] = llama.agent.wait_for(lambda records: records[0]["finished_at"] is not None)
    assert record["disconnected"] and not record["completed"]
    the_slot_is_free(llama)


MISSING_IN_TEXT = '<tool_call>{"name": "get_weather", "arguments": {"days": 3}}</tool_call>'


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_leaving_during_the_retry_ends_it_and_frees_the_slot(
    llama: Stack, stream: bool
) -> None:
    # The first answer a call (written as text) that cannot be mended; the retry hangs.
    llama.agent.script(**text_answer(MISSING_IN_TEXT), body_contains="json_schema", stall=True)
    sock = sent_raw(llama.url, chat_request(stream=stream))
    try:
        llama.agent.wait_for(lambda records: len(retries([r["body"] for r in records])) == 1)
    finally:
        sock.close()
    first, again = llama.agent.wait_for(lambda records: records[1]["finished_at"] is not None)
    assert first["completed"]
    assert again["disconnected"] and not again["completed"]
    the_slot_is_free(llama)


@pytest.mark.parametrize("mode", MODES)
def test_a_retry_that_hangs_ends_at_the_deadline_never_with_a_malformed_call(
    llama: Stack, mode: Mode
) -> None:
    llama.agent.script(**text_answer(MISSING_IN_TEXT), body_contains="json_schema", stall=True)
    started = time.monotonic()
    answer: Answer | None = None
    cut = ""
    try:
        answer = ask(llama.url, "chat", mode, headers={"x-request-timeout": "2"})
    except openai.APIError as error:  # the deadline, reported in the stream
        cut = str(error)
    if answer is None:
        assert mode == "stream" and "deadline" in cut, cut
    else:
        assert answer.calls == [] and answer.ended == "stop"
        assert answer.text == MISSING_IN_TEXT
        if mode == "whole":
            assert "'city' is a required property" in answer.headers[FAILED]
    assert time.monotonic() - started < 6
    the_slot_is_free(llama)


@pytest.mark.parametrize("mode", MODES)
def test_a_valid_call_beside_an_unrepairable_one_is_not_lost_to_the_retry(
    llama: Stack, mode: Mode
) -> None:
    calls = [native("search_web", '{"query": "Paris"}'), native("get_weather", '{"days": 3}')]
    llama.agent.script(**first_calls_then(calls))
    answer = ask(llama.url, "chat", mode)
    assert [name for name, _ in answer.calls] == ["search_web", "get_weather"]
    assert answer.calls[0][1] == '{"query": "Paris"}'


THERMOSTAT = {
    "set_temperature": {
        "type": "object",
        "properties": {"degrees": {"type": "number"}, "room": {"type": "string"}},
        "required": ["degrees"],
    }
}


@pytest.mark.parametrize(
    "arguments",
    ['{"degrees": NaN}', '{"degrees": -Infinity}', '{"degrees": 20, "room": "\\ud800"}'],
)
def test_arguments_that_are_not_json_never_reach_the_client_as_a_call(
    llama: Stack, arguments: str
) -> None:
    fixed = '{"name": "set_temperature", "arguments": {"degrees": 20}}'
    llama.agent.script(**first_calls_then([native("set_temperature", arguments)], fixed))
    answer = ask(llama.url, "chat", "whole", tools=THERMOSTAT)
    # What the client got goes back in its next request, as an agent sends it.
    history = [
        {"role": "user", "content": PROMPT},
        {
            "role": "assistant",
            "content": answer.text or None,
            "tool_calls": [
                {"id": f"call_{i}", "type": "function", "function": {"name": n, "arguments": a}}
                for i, (n, a) in enumerate(answer.calls)
            ],
        },
        *(
            {"role": "tool", "tool_call_id": f"call_{i}", "content": "ok"}
            for i in range(len(answer.calls))
        ),
    ]
    llama.agent.script(**text_answer("Done."))
    body = {"model": AGENT, "messages": history, "tools": chat_tools(THERMOSTAT)}
    again = one_shot.post(f"{llama.url}/v1/chat/completions", json=body, timeout=30)
    assert again.status_code == 200, again.text
    answer.arguments(THERMOSTAT)


@pytest.mark.parametrize("mode", MODES)
def test_a_repaired_call_with_a_lone_surrogate_escape_still_gets_an_answer(
    llama: Stack, mode: Mode
) -> None:
    llama.agent.script(**first_calls_then([native("get_weather", "{'city': '\\ud800'}")]))
    try:
        answer = ask(llama.url, "chat", mode)
    except (openai.APIError, httpx.HTTPError) as error:
        raise AssertionError(f"no answer: {error!r}") from None
    assert answer.calls == [] or answer.arguments() == [{"city": "Oslo"}]


def test_text_streams_as_it_comes_while_tools_are_offered(llama: Stack) -> None:
    llama.agent.script(chunks=20, chunk_text="tok ")
    with openai.OpenAI(base_url=f"{llama.url}/v1", api_key="x", max_retries=0) as sdk:
        messages: Any = [{"role": "user", "content": PROMPT}]
        tools: Any = chat_tools(OFFERED)
        chunks = list(
            sdk.chat.completions.create(model=AGENT, messages=messages, tools=tools, stream=True)
        )
    texts = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert texts == ["tok "] * 20, "text was held"
    assert chunks[-1].choices[0].finish_reason == "stop"


LISTING = {
    "list_files": {"type": "object", "properties": {"path": {"type": "string"}}},
    "get_weather": WEATHER,
}
EXAMPLE = (
    "Use it like this:\n```python\n"
    'agent.run({"name": "list_files", "arguments": {"path": "/etc"}})\n```\n'
    "That lists /etc."
)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("api", APIS)
def test_a_code_example_that_names_a_tool_stays_text(
    llama: Stack, api: Api, mode: Mode, request: pytest.FixtureRequest
) -> None:
    llama.agent.script(**text_answer(EXAMPLE))
    answer = ask(llama.url, api, mode, tools=LISTING)
    assert answer.calls == []
    assert answer.text == EXAMPLE
    assert answer.ended == "stop"
    assert REPAIRS not in answer.headers and FAILED not in answer.headers


# ---------------------------------------------------------------- what is counted and shown


def metric(url: str, name: str, **labels: str) -> float:
    """The value of one sample of the router's ``/metrics`` (0 when absent)."""
    text = one_shot.get(f"{url}/metrics", timeout=10).text
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        shown = dict(
            part.split("=", 1) for part in line[len(name) + 1 : line.index("}")].split(",")
        )
        if all(shown.get(k) == f'"{v}"' for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_repairs_and_retries_are_counted_listed_and_shown_and_the_models_say_the_policy(
    llama: Stack,
) -> None:
    answers = "slm_tool_answers_total"
    before = {
        outcome: metric(llama.url, answers, model=AGENT, outcome=outcome)
        for outcome in ("valid", "repaired", "retried")
    }
    fixed = metric(llama.url, "slm_tool_repairs_total", model=AGENT, repair="arguments_json")
    llama.agent.script(**weather(VALID))
    ask(llama.url, "chat", "whole")
    llama.agent.script(**weather("{'city': 'Paris'}"))
    ask(llama.url, "chat", "whole")
    llama.agent.script(**weather('{"days": 3}'))  # no city: asked again
    ask(llama.url, "chat", "whole")
    for outcome in before:
        after = metric(llama.url, answers, model=AGENT, outcome=outcome)
        assert after == before[outcome] + 1, outcome
    assert metric(llama.url, "slm_tool_repairs_total", model=AGENT, repair="arguments_json") == (
        fixed + 1
    )
    recent = one_shot.get(f"{llama.url}/v1/ui/requests", timeout=10).json()["data"]
    assert [r["tools"] for r in recent[:3]] == [
        "native retried calls=1",
        "native repaired calls=1 repairs=arguments_json",
        "native valid calls=1",
    ]
    llama.untemplated.script(props={"chat_template_caps": {"supports_tools": False}})
    listed = {m["id"]: m for m in one_shot.get(f"{llama.url}/v1/models", timeout=10).json()["data"]}
    assert listed[AGENT]["tools"] == {"mode": "auto", "repair": True, "applies": "native"}
    assert listed[RAW]["tools"] == {"mode": "auto", "repair": False, "applies": "native"}
    assert listed[RENDERED]["tools"] == {"mode": "render", "repair": True, "applies": "render"}
    assert listed[UNTEMPLATED]["tools"]["applies"] == "render"
