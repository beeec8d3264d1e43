"""Ollama's API (``/api/...``) attacked by a hostile client and by a heavy one, on real
processes: a router in front of fake backends; the same router in front of the
raw-socket backend (tests/fakes/raw_backend.py) that misbehaves byte by byte; and the
launcher supervising fake llama-servers, with the watchdog's thresholds at a second and
API keys set.

Whatever a client sends gets an Ollama-shaped answer (``{"error": "..."}`` and a
proper status, never a 500 nor a traceback, never a dropped connection) and reaches no
backend unless it is a request the backend can serve; whatever a backend does, the
client gets a clean Ollama error (whole, or a stream's last ``{"error"}`` line) and
never hangs; nothing a client does counts against a healthy backend."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from slm_server.router.intake.strict_json import MAX_DEPTH
from tests import one_shot
from tests.fakes.control import FakeBackend
from tests.integration.attack_wire import Wire, request
from tests.integration.raw_stack import SSE_HEAD, Raw, delta, raw_stack
from tests.integration.test_strict_bodies import a_sweep_has_passed, fake_requests
from tests.integration.watched import Watched, fake_entry, watched
from tests.json_values import json_values
from tests.processes import RunningRouter, StartRouter
from tests.registry_entries import registry_entry

# Its module-scoped stacks start once: one worker runs the whole module.
pytestmark = pytest.mark.xdist_group("test_ollama_hostile")

FAKE_ROLES = ("chat", "vis", "embed", "sick", "sick-embed", "queue")
CONTEXT = 4096
MAX_BODY = 1024 * 1024  # SLM_MAX_BODY_MB=1
BODY_STALL = 1.0  # SLM_BODY_STALL_SECONDS
QUEUE = {"max_concurrency": 2, "max_queue": 3}
KEY = "sk-ollama-hostile"
AUTH = {"authorization": f"Bearer {KEY}"}
HI = [{"role": "user", "content": "hi"}]
JSON = {"content-type": "application/json"}
# A 1x1 PNG, base64.
PNG = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5E"
    "rkJggg=="
)
MODEL_PATHS = ("/api/chat", "/api/generate", "/api/embed", "/api/embeddings")


@pytest.fixture(scope="module")
def router_process(fakes: dict[str, FakeBackend], start_router: StartRouter) -> RunningRouter:
    models = {
        "chat": registry_entry(
            "chat", fakes["chat"].port, context_length=CONTEXT, max_concurrency=8
        ),
        "vis": registry_entry(
            "vis", fakes["vis"].port, model_type="multimodal", mmproj_path="models/none.mmproj"
        ),
        "embed": registry_entry("embed", fakes["embed"].port, model_type="embeddings"),
        "sick": registry_entry("sick", fakes["sick"].port, default_timeout=5),
        "sick-embed": registry_entry(
            "sick-embed", fakes["sick-embed"].port, model_type="embeddings"
        ),
        "queue": registry_entry("queue", fakes["queue"].port, **QUEUE),
    }
    return start_router(
        models,
        SLM_OTEL_ENABLED="false",
        SLM_MAX_BODY_MB="1",
        SLM_BODY_STALL_SECONDS=str(BODY_STALL),
        SLM_MAX_HEADERS_KB="32",
    )


# -- helpers ---------------------------------------------------------------------------------------


def chat(model: str = "chat", **fields: Any) -> dict[str, Any]:
    return {"model": model, "messages": HI, "stream": False, **fields}


def said(*messages: dict[str, Any], model: str = "chat") -> dict[str, Any]:
    return {"model": model, "messages": list(messages), "stream": False}


def generate(model: str = "chat", **fields: Any) -> dict[str, Any]:
    return {"model": model, "prompt": "hi", "stream": False, **fields}


def options(**values: Any) -> dict[str, Any]:
    return chat(options=values)


def embed(**fields: Any) -> dict[str, Any]:
    """An ``/api/embed`` request (``prompt`` instead of ``input``: ``/api/embeddings``')."""
    base: dict[str, Any] = {"model": "embed"}
    if "prompt" not in fields:
        base["input"] = "x"
    return {**base, **fields}


CALLED = {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f"}}]}


def called(**call: Any) -> dict[str, Any]:
    return said({"role": "assistant", "content": "", "tool_calls": [call]})


def tool(**function: Any) -> dict[str, Any]:
    return chat(tools=[{"type": "function", "function": {"name": "f", **function}}])


def error_of(response: httpx.Response, status: int) -> str:
    """The message of an Ollama-shaped whole error answer of ``status``."""
    assert response.status_code == status, (response.status_code, response.text[:300])
    assert response.headers["content-type"].startswith("application/json")
    assert "Traceback" not in response.text
    body = response.json()
    assert set(body) == {"error"}, body
    message = body["error"]
    assert isinstance(message, str) and message, body
    return message


def ollama_shaped(body: bytes) -> str:
    """The message of an Ollama error body read off the wire: ``{"error": "..."}``."""
    found = json.loads(body)
    assert isinstance(found, dict) and set(found) == {"error"}, body
    assert isinstance(found["error"], str) and found["error"], body
    message: str = found["error"]
    return message


def lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def ends_in_error(response: httpx.Response) -> str:
    """The message of a failed answer: a whole Ollama error of a 5xx status, or a
    stream whose last line is ``{"error"}`` and that says nowhere it is done."""
    assert "Traceback" not in response.text
    if response.status_code != 200:
        assert response.status_code >= 500, response.text[:300]
        return error_of(response, response.status_code)
    assert response.headers["content-type"].startswith("application/x-ndjson")
    got = lines(response.text)
    assert got, "an empty stream"
    assert set(got[-1]) == {"error"}, got[-1]
    assert all("error" not in line and line.get("done") is False for line in got[:-1]), got
    message = got[-1]["error"]
    assert isinstance(message, str) and message
    return message


def done_stream(response: httpx.Response) -> list[dict[str, Any]]:
    """A whole, healthy Ollama stream: pieces, then one ``done`` line with its counts."""
    assert response.status_code == 200, response.text[:300]
    assert response.headers["content-type"].startswith("application/x-ndjson")
    got = lines(response.text)
    assert [line.get("done") for line in got[:-1]] == [False] * (len(got) - 1), got
    last = got[-1]
    assert last["done"] is True and last["done_reason"] == "stop", last
    for count in ("total_duration", "eval_count", "prompt_eval_count", "eval_duration"):
        assert isinstance(last[count], int), last
    return got


def nothing_reached(fakes: dict[str, FakeBackend]) -> None:
    for role, fake in fakes.items():
        assert fake.requests() == [], f"a refused request reached {role}"


def watchdog_events(router_process: RunningRouter, role: str) -> list[dict[str, Any]]:
    """The router's watchdog events about ``role``'s backend."""
    path = router_process.workdir / "logs" / "watchdog.jsonl"
    if not path.exists():
        return []
    events = [json.loads(line) for line in path.read_text().splitlines() if line]
    return [e for e in events if e.get("role") == role]


def failure_verdicts(http: httpx.Client, model: str) -> float:
    """``slm_watchdog_failures_total`` of ``model``, every reason."""
    text = http.get("/metrics").text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "slm_watchdog_failures_total" and sample.labels.get("model") == model
    )


def post_raw(http: httpx.Client, path: str, body: bytes) -> httpx.Response:
    return http.post(path, content=body, headers=JSON)


# -- bodies too large, or not JSON the backend could parse -----------------------------------------

FILLER = "x" * (MAX_BODY + MAX_BODY // 2)
LARGE = {
    "/api/chat": chat(messages=[{"role": "user", "content": FILLER}]),
    "/api/generate": generate(prompt=FILLER),
    "/api/embed": {"model": "embed", "input": [FILLER]},
    "/api/embeddings": {"model": "embed", "prompt": FILLER},
    "/api/show": {"model": "chat", "pad": FILLER},
}


def pieces(data: bytes, size: int = 65536) -> Iterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
@pytest.mark.parametrize("path", sorted(LARGE))
def test_a_body_over_the_limit_is_413_in_ollamas_shape_and_reaches_no_backend(
    http: httpx.Client, fakes: dict[str, FakeBackend], path: str, framing: str
) -> None:
    body = json.dumps(LARGE[path]).encode()
    content: bytes | Iterator[bytes] = body if framing == "content-length" else pieces(body)
    response = http.post(path, content=content, headers=JSON)
    assert "larger than" in error_of(response, 413)
    nothing_reached(fakes)
    assert http.get("/health").status_code == 200


def test_a_chunked_body_within_the_limit_is_served(
    http: httpx.Client, fakes: dict[str, FakeBackend]
) -> None:
    body = json.dumps(chat(messages=[{"role": "user", "content": "y" * 200_000}])).encode()
    response = http.post("/api/chat", content=pieces(body, 4096), headers=JSON)
    assert response.status_code == 200, response.text[:300]
    assert response.json()["done"] is True
    [sent] = fakes["chat"].requests()
    assert sent["body"]["messages"][0]["content"] == "y" * 200_000


HELLO = json.dumps(HI)
# What Python's json.loads takes and llama-server's parser refuses (a 500 there, which
# the watchdog would count): refused by the router's strict JSON rules.
NOT_STRICT = {
    "nan": f'{{"model": "chat", "messages": {HELLO}, "options": {{"temperature": NaN}}}}',
    "infinity": f'{{"model": "chat", "messages": {HELLO}, "options": {{"top_p": Infinity}}}}',
    "float-overflow": '{"model": "chat", "prompt": "x", "options": {"seed": 1e999}}',
    "int-overflow": f'{{"model": "chat", "prompt": "x", "keep_alive": {"9" * 400}}}',
    "lone-surrogate": '{"model": "chat", "messages": [{"role": "user", "content": "a\\ud83d"}]}',
    "lone-surrogate-key": f'{{"model": "chat", "messages": {HELLO}, "options": {{"\\udc00": 1}}}}',
    "lone-surrogate-prompt": '{"model": "chat", "prompt": "\\udfff"}',
    "deep-messages": '{"model": "chat", "messages": ' + "[" * 100_000 + "]" * 100_000 + "}",
    "deep-format": '{"model": "chat", "prompt": "x", "format": '
    + '{"a": ' * (MAX_DEPTH + 1)
    + "1"
    + "}" * (MAX_DEPTH + 1)
    + "}",
    "trailing-data": '{"model": "chat", "prompt": "x"} {}',
    "single-quotes": "{'model': 'chat'}",
    "not-an-object": '["model", "chat"]',
    "empty": "",
}
ENCODED = {
    "utf16": json.dumps(generate()).encode("utf-16"),
    "utf8-encoded-surrogate": b'{"model": "chat", "prompt": "\xed\xa0\x80"}',
    "not-utf8": b'{"model": "chat", "prompt": "\xff\xfe"}',
}
STRICT_CASES = {**{k: v.encode() for k, v in NOT_STRICT.items()}, **ENCODED}


@pytest.mark.parametrize("name", sorted(STRICT_CASES))
def test_json_a_backend_could_not_parse_is_400_and_reaches_no_backend(
    http: httpx.Client, fakes: dict[str, FakeBackend], name: str
) -> None:
    for path in ("/api/chat", "/api/generate", "/api/embed", "/api/show"):
        response = post_raw(http, path, STRICT_CASES[name])
        # /api/show reads 64 KiB at most
        error_of(response, 413 if name == "deep-messages" and path == "/api/show" else 400)
    nothing_reached(fakes)


def test_duplicate_keys_mean_the_last_one_for_routing_and_translation_alike(
    http: httpx.Client, fakes: dict[str, FakeBackend]
) -> None:
    """The strict rules take duplicate keys, the last one winning, as both parsers do:
    the model routed to, the stream and the prompt sent must all be the last ones."""
    body = (
        '{"model": "embed", "model": "chat", "stream": true, "stream": false, '
        '"prompt": "first", "prompt": "second", "options": {"temperature": 2, '
        '"temperature": 0.5}}'
    )
    response = post_raw(http, "/api/generate", body.encode())
    assert response.status_code == 200, response.text[:300]
    assert response.headers["content-type"].startswith("application/json")
    assert response.json()["done"] is True
    [sent] = fakes["chat"].requests()
    assert sent["body"]["messages"] == [{"role": "user", "content": "second"}]
    assert sent["body"]["temperature"] == 0.5
    assert sent["body"].get("stream") in (None, False)
    assert fakes["embed"].requests() == []


@pytest.mark.parametrize("path", [*MODEL_PATHS, "/api/show"])
def test_a_body_not_said_to_be_json_is_415(
    http: httpx.Client, fakes: dict[str, FakeBackend], path: str
) -> None:
    body = json.dumps({"model": "chat", "prompt": "x", "input": "x", "messages": HI}).encode()
    for content_type in ("text/plain", "application/x-www-form-urlencoded", "", "json"):
        response = http.post(path, content=body, headers={"content-type": content_type})
        assert "Content-Type" in error_of(response, 415)
    nothing_reached(fakes)


# -- every field the translation reads, of the wrong type ------------------------------------------

# (id, path, body, what the message names). Each is a 400 naming the field, before
# any backend is asked.
WRONG: list[tuple[str, str, dict[str, Any], str]] = [
    ("messages-string", "/api/chat", chat(messages="hi"), "messages"),
    ("messages-object", "/api/chat", chat(messages={"role": "user"}), "messages"),
    ("message-number", "/api/chat", chat(messages=[5]), "messages[0]"),
    ("role-number", "/api/chat", said({"role": 7, "content": "x"}), "role"),
    ("role-object", "/api/chat", said({"role": {}, "content": "x"}), "role"),
    ("role-array", "/api/chat", said({"role": ["user"], "content": "x"}), "role"),
    ("role-unknown", "/api/chat", said({"role": "robot", "content": "x"}), "role"),
    ("content-number", "/api/chat", said({"role": "user", "content": 5}), "content"),
    ("content-parts", "/api/chat", said({"role": "user", "content": [{"text": "x"}]}),
     "content"),
    ("thinking-number", "/api/chat", said({"role": "assistant", "thinking": 1}), "thinking"),
    (
        "images-for-a-text-model",
        "/api/chat",
        said({"role": "user", "content": "x", "images": [PNG]}),
        "images",
    ),
    (
        "images-string",
        "/api/chat",
        said({"role": "user", "images": PNG}, model="vis"),
        "images",
    ),
    (
        "image-number",
        "/api/chat",
        said({"role": "user", "images": [5]}, model="vis"),
        "images[0]",
    ),
    (
        "image-not-base64",
        "/api/chat",
        said({"role": "user", "images": ["%%%"]}, model="vis"),
        "images[0]",
    ),
    (
        "image-not-an-image",
        "/api/chat",
        said({"role": "user", "images": ["aGVsbG8gd29ybGQ="]}, model="vis"),
        "images[0]",
    ),
    (
        "images-on-a-system-message",
        "/api/chat",
        said({"role": "system", "images": [PNG]}, model="vis"),
        "images",
    ),
    (
        "tool-calls-string",
        "/api/chat",
        said({"role": "assistant", "tool_calls": "f()"}),
        "tool_calls",
    ),
    (
        "tool-calls-object",
        "/api/chat",
        said({"role": "assistant", "tool_calls": {}}),
        "tool_calls",
    ),
    ("tool-call-number", "/api/chat", said({"role": "assistant", "tool_calls": [5]}),
     "tool_calls[0]"),
    ("tool-call-no-name", "/api/chat", called(function={"arguments": {}}), "name"),
    (
        "tool-call-arguments-list",
        "/api/chat",
        called(function={"name": "f", "arguments": [1]}),
        "arguments",
    ),
    (
        "tool-call-arguments-not-json",
        "/api/chat",
        called(function={"name": "f", "arguments": "{city"}),
        "arguments",
    ),
    (
        "tool-call-arguments-json-array",
        "/api/chat",
        called(function={"name": "f", "arguments": "[1]"}),
        "arguments",
    ),
    (
        "tool-name-number",
        "/api/chat",
        said(CALLED, {"role": "tool", "content": "x", "tool_name": 5}),
        "tool_name",
    ),
    (
        "tool-name-answering-nothing",
        "/api/chat",
        said(CALLED, {"role": "tool", "content": "x", "tool_name": "g"}),
        "tool",
    ),
    ("tool-result-first", "/api/chat", said({"role": "tool", "content": "x"}), "tool"),
    ("tools-string", "/api/chat", chat(tools="f"), "tools"),
    ("tools-object", "/api/chat", chat(tools={"f": {}}), "tools"),
    ("tool-number", "/api/chat", chat(tools=[5]), "tools[0]"),
    ("tool-type", "/api/chat", chat(tools=[{"type": "x", "function": {"name": "f"}}]),
     "type"),
    ("tool-parameters-string", "/api/chat", tool(parameters="x"), "parameters"),
    ("tool-parameters-bad-type", "/api/chat", tool(parameters={"type": 5}), "parameters"),
    ("tool-description-number", "/api/chat", tool(description=5), "description"),
    ("options-string", "/api/chat", chat(options="fast"), "options"),
    ("options-list", "/api/chat", chat(options=[]), "options"),
    ("temperature-string", "/api/chat", options(temperature="hot"), "temperature"),
    ("temperature-bool", "/api/chat", options(temperature=True), "temperature"),
    ("top-k-fraction", "/api/chat", options(top_k=1.5), "top_k"),
    ("seed-string", "/api/chat", options(seed="42"), "seed"),
    ("stop-number", "/api/chat", options(stop=5), "stop"),
    ("stop-list-with-number", "/api/chat", options(stop=["a", 1]), "stop"),
    ("penalize-newline-string", "/api/chat", options(penalize_newline="y"),
     "penalize_newline"),
    ("num-predict-zero", "/api/chat", options(num_predict=0), "num_predict"),
    ("num-predict-minus-three", "/api/chat", options(num_predict=-3), "num_predict"),
    ("num-predict-string", "/api/chat", options(num_predict="8"), "num_predict"),
    ("num-ctx-zero", "/api/chat", options(num_ctx=0), "num_ctx"),
    ("num-ctx-object", "/api/chat", options(num_ctx={}), "num_ctx"),
    ("format-xml", "/api/chat", chat(format="xml"), "format"),
    ("format-list", "/api/chat", chat(format=[1]), "format"),
    ("format-number", "/api/chat", chat(format=0), "format"),
    ("think-level-unknown", "/api/chat", chat(think="max"), "think"),
    ("think-number", "/api/chat", chat(think=1), "think"),
    ("think-on-a-model-that-does-not", "/api/chat", chat(think=True), "think"),
    ("keep-alive-word", "/api/chat", chat(keep_alive="soon"), "keep_alive"),
    ("keep-alive-bool", "/api/chat", chat(keep_alive=True), "keep_alive"),
    ("keep-alive-object", "/api/chat", chat(keep_alive={}), "keep_alive"),
    ("stream-string", "/api/chat", chat(stream="yes"), "stream"),
    ("stream-number", "/api/chat", chat(stream=1), "stream"),
    ("top-logprobs-past-20", "/api/chat", chat(logprobs=True, top_logprobs=21),
     "top_logprobs"),
    ("model-number", "/api/chat", {**chat(), "model": 5}, "model"),
    ("model-missing", "/api/chat", {"messages": HI, "stream": False}, "model"),
    ("model-of-embeddings", "/api/chat", chat(model="embed"), "embed"),
    ("prompt-number", "/api/generate", generate(prompt=5), "prompt"),
    ("system-number", "/api/generate", generate(system=["x"]), "system"),
    ("raw-string", "/api/generate", generate(raw="yes"), "raw"),
    ("suffix-number", "/api/generate", generate(suffix=0), "suffix"),
    ("template", "/api/generate", generate(template="{{ .Prompt }}"), "template"),
    ("template-bool", "/api/generate", generate(template=False), "template"),
    ("context", "/api/generate", generate(context=[1, 2, 3]), "context"),
    ("context-object", "/api/generate", generate(context={}), "context"),
    ("images-string-generate", "/api/generate", generate("vis", images=PNG), "images"),
    ("images-raw", "/api/generate", generate("vis", images=[PNG], raw=True), "images"),
    ("stream-string-generate", "/api/generate", generate(stream="no"), "stream"),
    ("input-number", "/api/embed", {"model": "embed", "input": 5}, "input"),
    ("input-numbers", "/api/embed", {"model": "embed", "input": [1, 2]}, "input"),
    ("input-object", "/api/embed", {"model": "embed", "input": {}}, "input"),
    ("truncate-string", "/api/embed", embed(truncate="y"), "truncate"),
    ("dimensions-zero", "/api/embed", embed(dimensions=0), "dimensions"),
    ("dimensions-string", "/api/embed", embed(dimensions="3"), "dimensions"),
    ("dimensions-bool", "/api/embed", embed(dimensions=True), "dimensions"),
    ("keep-alive-embed", "/api/embed", embed(keep_alive="x"), "keep_alive"),
    ("embed-with-a-chat-model", "/api/embed", {"model": "chat", "input": "x"}, "chat"),
    ("prompt-list-embeddings", "/api/embeddings", embed(prompt=["x"]), "prompt"),
    ("prompt-number-embeddings", "/api/embeddings", embed(prompt=5), "prompt"),
    ("show-model-number", "/api/show", {"model": 5}, "model"),
    ("show-name-list", "/api/show", {"name": ["chat"]}, "model"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("path", "body", "named"), [w[1:] for w in WRONG], ids=[w[0] for w in WRONG]
)
def test_a_field_of_the_wrong_type_is_a_400_naming_it_and_reaches_no_backend(
    http: httpx.Client, fakes: dict[str, FakeBackend], path: str, body: dict[str, Any], named: str
) -> None:
    message = error_of(http.post(path, json=body), 400)
    assert named in message, message
    nothing_reached(fakes)


@pytest.mark.parametrize(
    ("given", "sent", "ignored"),
    [
        ({"num_predict": 16}, 16, None),
        ({"num_predict": CONTEXT}, CONTEXT, None),
        ({"num_predict": CONTEXT + 1}, CONTEXT, None),  # no answer outgrows its context
        ({"num_predict": 10**15}, CONTEXT, None),
        ({"num_predict": -1}, None, None),  # Ollama's "until it stops"
        ({"num_predict": -2}, None, None),  # and "until the context is full"
        ({"num_ctx": CONTEXT}, None, None),
        ({"num_ctx": CONTEXT * 8}, None, "num_ctx"),  # the registry's context, unchanged
        ({"num_ctx": CONTEXT + 1, "num_thread": 8}, None, "num_ctx,num_thread"),
    ],
    ids=str,
)
def test_num_predict_and_num_ctx_are_bounded_by_the_served_context(
    http: httpx.Client,
    fakes: dict[str, FakeBackend],
    given: dict[str, int],
    sent: int | None,
    ignored: str | None,
) -> None:
    response = http.post("/api/generate", json=generate(options=given))
    assert response.status_code == 200, response.text[:300]
    assert response.headers.get("x-slm-ignored-options") == ignored
    [request] = fakes["chat"].requests()
    assert request["body"].get("max_tokens") == sent


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize(
    "name", ["temperatur\u00e9", "\u6e29\u5ea6", "a\r\nX-Injected: 1", "nul\x00byte", "x" * 3000]
)
def test_an_option_of_any_name_is_answered(
    http: httpx.Client, fakes: dict[str, FakeBackend], name: str, stream: bool
) -> None:
    """An option Ollama does not know is left alone, as Ollama leaves it, whatever its
    name: the answer is the model's, never the router's failure or a dropped
    connection (and no header is injected)."""
    fakes["chat"].script(reply="fine", chunks=2)
    response = http.post("/api/chat", json=chat(options={name: 1}, stream=stream))
    assert "x-injected" not in response.headers
    if stream:
        done_stream(response)
    else:
        assert response.status_code == 200, response.text[:300]
        assert response.json()["message"]["content"] == "fine"
    assert http.get("/health").status_code == 200


@pytest.mark.parametrize("path", ["/api/chat", "/api/generate"])
def test_stream_null_means_ollamas_default_a_stream(
    http: httpx.Client, fakes: dict[str, FakeBackend], path: str
) -> None:
    """``null`` is "not given" for every other field (and for Ollama's own server):
    the answer streams, as the backend was asked to."""
    fakes["chat"].script(chunks=3, chunk_text="ab")
    body = chat(stream=None) if path == "/api/chat" else generate(stream=None)
    got = done_stream(http.post(path, json=body))
    assert len(got) == 4
    assert fakes["chat"].requests()[-1]["body"]["stream"] is True


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/api/nothing", 404),
        ("GET", "/api/", 404),
        ("GET", "/api/chat", 405),
        ("PUT", "/api/generate", 405),
        ("POST", "/api/tags", 405),
        ("POST", "/api/pull", 501),
        ("POST", "/api/push", 501),
        ("POST", "/api/create", 501),
        ("POST", "/api/copy", 501),
        ("DELETE", "/api/delete", 501),
        ("POST", "/api/blobs/sha256:00", 501),
    ],
)
def test_every_other_request_under_api_is_refused_in_ollamas_shape(
    http: httpx.Client, method: str, path: str, status: int
) -> None:
    # A model file's worth of body, as a client pushing a blob sends it.
    response = http.request(method, path, content=b"\0" * (2 * MAX_BODY), headers=JSON)
    error_of(response, status)


def test_what_cannot_be_served_is_refused_in_ollamas_shape(
    http: httpx.Client, fakes: dict[str, FakeBackend]
) -> None:
    error_of(http.post("/api/chat", json=chat(model="x" * 300)), 404)
    kept = http.post("/api/generate", json=generate(keep_alive=0))
    assert "keep_alive" in error_of(kept, 409)  # would unload a model kept for good
    assert "nope" in error_of(http.post("/api/show", json={"model": "nope"}), 404)
    late = http.post("/api/chat", json=chat(), headers={"x-request-timeout": "soon"})
    assert "X-Request-Timeout" in error_of(late, 400)
    nothing_reached(fakes)


# -- a client that is slow, or leaves --------------------------------------------------------------


def test_a_body_that_stops_coming_is_408_in_ollamas_shape_and_reaches_no_backend(
    router: str, fakes: dict[str, FakeBackend]
) -> None:
    body = json.dumps(chat()).encode()
    started = time.monotonic()
    with Wire(router) as wire:
        full = request("POST", "/api/chat", body, content_type="application/json")
        wire.send(full[: len(full) - 10])  # the head and most of the body, then nothing
        reply = wire.response()
        assert wire.closed_without_more()
    assert time.monotonic() - started < BODY_STALL + 5
    assert reply.status == 408
    nothing_reached(fakes)
    assert "body" in ollama_shaped(reply.body)


def test_a_head_too_large_on_an_api_path_is_431_in_ollamas_shape(router: str) -> None:
    big = {f"x_h{i}": "v" * 400 for i in range(90)}  # 36 KB of headers: over 32
    with Wire(router) as wire:
        wire.send(request("POST", "/api/chat", b"{}", content_type="application/json", **big))
        reply = wire.response()
    assert reply.status == 431
    assert "headers" in ollama_shaped(reply.body)


def streamed_first_line(
    router: str, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> dict[str, Any]:
    """Start a stream, read its first line, and leave."""
    with (
        httpx.Client(base_url=router, headers=headers, timeout=10, trust_env=False) as client,
        client.stream("POST", path, json=body) as response,
    ):
        assert response.status_code == 200
        first: dict[str, Any] = json.loads(next(response.iter_lines()))
    return first


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/api/chat", chat(stream=True)),
        ("/api/generate", generate(stream=True)),
        ("/api/generate", generate(stream=True, raw=True)),
    ],
    ids=["chat", "generate", "raw-generate"],
)
def test_a_client_leaving_mid_stream_closes_the_backends_request(
    router: str, fakes: dict[str, FakeBackend], http: httpx.Client, path: str, body: dict[str, Any]
) -> None:
    fakes["chat"].script(chunks=200, chunk_interval_seconds=0.05)
    first = streamed_first_line(router, path, body)
    assert first["done"] is False
    [record] = fakes["chat"].wait_for(lambda reqs: len(reqs) == 1 and reqs[0]["disconnected"])
    assert not record["completed"] and record["chunks_sent"] < 200
    assert http.get("/health").status_code == 200


@pytest.mark.parametrize(
    ("role", "path", "body"),
    [
        ("chat", "/api/chat", chat()),
        ("chat", "/api/generate", generate()),
        ("embed", "/api/embed", embed(input=["a", "b"])),
        ("embed", "/api/embeddings", embed(prompt="a")),
    ],
    ids=["chat", "generate", "embed", "embeddings"],
)
def test_a_client_leaving_before_a_whole_answer_closes_the_backends_request(
    router: str, fakes: dict[str, FakeBackend], role: str, path: str, body: dict[str, Any]
) -> None:
    fakes[role].script(delay_seconds=5)
    with pytest.raises(httpx.ReadTimeout):
        one_shot.post(f"{router}{path}", json=body, timeout=0.5)
    [record] = fakes[role].wait_for(lambda reqs: len(reqs) == 1 and reqs[0]["disconnected"])
    assert not record["completed"]


# -- a backend that fails --------------------------------------------------------------------------

QUICK = {"x-request-timeout": "0.5"}


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
@pytest.mark.parametrize("path", ["/api/chat", "/api/generate"])
def test_a_backend_that_stalls_before_answering_is_a_504_not_a_hang(
    http: httpx.Client, fakes: dict[str, FakeBackend], path: str, stream: bool
) -> None:
    fakes["sick"].script(stall=True)
    body = chat("sick", stream=stream) if path == "/api/chat" else generate("sick", stream=stream)
    started = time.monotonic()
    response = http.post(path, json=body, headers=QUICK)
    assert time.monotonic() - started < 4
    assert "deadline" in error_of(response, 504)
    assert http.get("/health").status_code == 200


def test_a_backend_that_stalls_mid_stream_ends_it_with_an_error_line(
    http: httpx.Client, fakes: dict[str, FakeBackend]
) -> None:
    fakes["sick"].script(chunks=3, chunk_interval_seconds=10)
    started = time.monotonic()
    response = http.post("/api/chat", json=chat("sick", stream=True), headers=QUICK)
    assert time.monotonic() - started < 4
    assert "deadline" in ends_in_error(response)
    assert lines(response.text)[0]["message"]["content"] == "tok "


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/api/chat", chat("sick", stream=True)),
        ("/api/generate", generate("sick", stream=True)),
        ("/api/generate", generate("sick", stream=True, raw=True)),
    ],
    ids=["chat", "generate", "raw-generate"],
)
def test_a_backend_dying_mid_stream_ends_it_with_an_error_line(
    http: httpx.Client, fakes: dict[str, FakeBackend], path: str, body: dict[str, Any]
) -> None:
    fakes["sick"].script(chunks=6, fail_mid_stream_after=2)
    response = http.post(path, json=body)
    assert response.status_code == 200
    ends_in_error(response)
    assert len(lines(response.text)) == 3  # two pieces, then the error
    assert http.get("/health").status_code == 200


@pytest.mark.parametrize(
    ("role", "path", "body"),
    [
        ("sick", "/api/chat", chat("sick", stream=True)),
        ("sick", "/api/chat", chat("sick")),
        ("sick", "/api/generate", generate("sick", stream=True, raw=True)),
        ("sick-embed", "/api/embed", embed(model="sick-embed")),
        ("sick-embed", "/api/embeddings", embed(model="sick-embed", prompt="x")),
    ],
    ids=["chat-streamed", "chat", "raw-generate", "embed", "embeddings"],
)
def test_a_backends_error_status_is_relayed_in_ollamas_shape(
    http: httpx.Client,
    fakes: dict[str, FakeBackend],
    role: str,
    path: str,
    body: dict[str, Any],
) -> None:
    for status in (500, 503, 429, 400):
        fakes[role].script(status=status)
        assert f"scripted {status}" in error_of(http.post(path, json=body), status)


# -- a backend that misbehaves byte by byte --------------------------------------------------------


@pytest.fixture(scope="module")
def raw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Raw]:
    tmp = tmp_path_factory.mktemp("raw-ollama")
    with raw_stack(tmp, "raw", answer_limit_mb=1, event_limit_mb=1) as stack:
        yield stack


def answer(content_type: str, body: str, status: str = "200 OK") -> dict[str, str]:
    return {
        "send": f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n{body}"
    }


def event(payload: dict[str, Any]) -> dict[str, str]:
    return {"chunk": f"data: {json.dumps(payload)}\n\n"}


DONE = [{"chunk": "data: [DONE]\n\n"}, {"chunk": ""}]
MISBEHAVIOURS: dict[str, list[dict[str, Any]]] = {
    "garbage-instead-of-http": [{"send": "\x00\x01\x02 garbage\r\n\r\n"}],
    "closes-at-once": [],
    "not-json-200": [answer("application/json", "not json!")],
    "html-500": [answer("text/html", "<h1>boom</h1>", "500 Internal Server Error")],
    "status-600": [{"send": "HTTP/1.1 600 Odd\r\nContent-Length: 2\r\n\r\n{}"}],
    "deep-json": [answer("application/json", "[" * 100_000 + "]" * 100_000)],
    "stated-too-long": [
        {"send": "HTTP/1.1 200 OK\r\nContent-Length: 10000000000\r\n\r\n{"},
        {"hold": True},
    ],
    "endless-body": [
        {"send": "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{"},
        {"repeat": '"k": 1, ', "times": 400_000},
    ],
    "dies-mid-stream": [{"send": SSE_HEAD}, {"chunk": delta("raw", "hi")}, {"send": "5\r\nda"}],
    "endless-event": [
        {"send": SSE_HEAD},
        {"chunk": delta("raw", "hi")},
        {"repeat": "5\r\nxxxxx\r\n", "times": 400_000},
        {"hold": True},
    ],
    "malformed-event": [{"send": SSE_HEAD}, {"chunk": "data: {not json\n\n"}, *DONE],
    "deep-event": [{"send": SSE_HEAD}, {"chunk": "data: " + "[" * 100_000 + "\n\n"}, *DONE],
    "in-band-error": [
        {"send": SSE_HEAD},
        {"chunk": delta("raw", "hi")},
        event({"error": {"code": 500, "message": "boom"}}),
        *DONE,
    ],
}
ASKED = {
    "chat-streamed": ("/api/chat", chat("raw", stream=True)),
    "chat-whole": ("/api/chat", chat("raw")),
    "raw-generate-streamed": ("/api/generate", generate("raw", stream=True, raw=True)),
}


@pytest.mark.parametrize("name", sorted(MISBEHAVIOURS))
def test_a_misbehaving_backend_is_a_clean_ollama_error_never_a_hang(raw: Raw, name: str) -> None:
    raw.script(*MISBEHAVIOURS[name])
    for path, body in ASKED.values():
        started = time.monotonic()
        response = one_shot.post(f"{raw.url}{path}", json=body, timeout=30)
        assert time.monotonic() - started < 10
        message = ends_in_error(response)
        assert "router failed" not in message, (path, body)
        assert raw.healthy_within()


TOOL_CALL = {
    "index": 0,
    "id": "call_1",
    "type": "function",
    "function": {"name": "f", "arguments": "{}"},
}


def choice(**fields: Any) -> dict[str, Any]:
    return {"choices": [{"index": 0, **fields}]}


def whole_choice(**fields: Any) -> dict[str, str]:
    return answer("application/json", json.dumps(choice(**fields)))


CALLING = {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]}
ODD_ANSWERS: dict[str, tuple[list[dict[str, Any]], str, dict[str, Any]]] = {
    # A templated generate is a chat completion: a model may still answer it with a call.
    "generate-answered-with-a-call-streamed": (
        [{"send": SSE_HEAD}, event(choice(delta={"tool_calls": [TOOL_CALL]})), *DONE],
        "/api/generate",
        generate("raw", stream=True),
    ),
    "generate-answered-with-a-call-whole": (
        [whole_choice(finish_reason="tool_calls", message=CALLING)],
        "/api/generate",
        generate("raw"),
    ),
    "finish-reason-a-list": (
        [whole_choice(finish_reason=["stop"], message={"role": "assistant", "content": "x"})],
        "/api/chat",
        chat("raw"),
    ),
    "finish-reason-an-object-streamed": (
        [{"send": SSE_HEAD}, event(choice(delta={"content": "x"}, finish_reason={"a": 1})), *DONE],
        "/api/chat",
        chat("raw", stream=True),
    ),
}


@pytest.mark.parametrize("name", sorted(ODD_ANSWERS))
def test_an_odd_but_well_formed_answer_never_fails_the_router(raw: Raw, name: str) -> None:
    """An answer the router reads but did not expect is translated, or refused as the
    backend's fault (502): never the router's own failure."""
    steps, path, body = ODD_ANSWERS[name]
    raw.script(*steps)
    response = one_shot.post(f"{raw.url}{path}", json=body, timeout=30)
    assert "router failed" not in response.text, response.text[:300]
    assert response.status_code in (200, 502), response.text[:300]
    if response.status_code == 502:
        error_of(response, 502)
    elif body["stream"]:
        assert lines(response.text)[-1]["done"] is True
    else:
        assert response.json()["done"] is True
    assert raw.healthy_within()


# -- a heavy user ----------------------------------------------------------------------------------


def test_fifty_concurrent_streams_over_a_small_queue_are_served_or_told_429(
    router: str, fakes: dict[str, FakeBackend]
) -> None:
    fakes["queue"].script(chunks=8, chunk_interval_seconds=0.1)
    body = {"model": "queue", "messages": HI}  # streams: Ollama's default

    def one(_: int) -> httpx.Response:
        return one_shot.post(f"{router}/api/chat", json=body, timeout=30)

    with ThreadPoolExecutor(50) as pool:
        answers = list(pool.map(one, range(50)))
    served = [a for a in answers if a.status_code == 200]
    refused = [a for a in answers if a.status_code != 200]
    assert refused, "fifty streams of 0.8 s each, and no queue ever full"
    taken = QUEUE["max_concurrency"] + QUEUE["max_queue"]
    # At least the slots and the queue: the first ones may end before the last arrive.
    assert len(served) >= taken, [a.status_code for a in answers]
    for each in served:
        got = done_stream(each)
        assert "".join(line["message"]["content"] for line in got) == "tok " * 8
    for each in refused:
        assert "busy" in error_of(each, 429)
        assert each.headers["retry-after"] == "1"
    assert len(fakes["queue"].requests()) == len(served)  # none dropped on the way


# -- fuzzing ---------------------------------------------------------------------------------------

values = json_values(text=20, size=4, leaves=12)
messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "assistant", "tool"]) | values},
        optional={
            "content": values,
            "images": values,
            "tool_calls": values,
            "tool_name": values,
            "thinking": values,
        },
    ),
    max_size=3,
)
ollama_bodies = st.fixed_dictionaries(
    {"model": st.sampled_from(["chat", "embed", "vis", "nope"]) | values},
    optional={
        "messages": messages | values,
        "prompt": values,
        "input": values,
        "system": values,
        "stream": st.just(False) | values,
        "options": st.dictionaries(
            st.sampled_from(["temperature", "top_k", "num_predict", "num_ctx", "stop", "seed"])
            | st.text(max_size=10),
            values,
            max_size=3,
        )
        | values,
        "format": values,
        "think": values,
        "keep_alive": values,
        "tools": values,
        "raw": values,
        "images": values,
        "suffix": values,
        "template": values,
        "context": values,
        "truncate": values,
        "dimensions": values,
    },
)


@settings(
    max_examples=100,
    database=None,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(path=st.sampled_from([*MODEL_PATHS, "/api/show"]), body=ollama_bodies)
def test_no_body_makes_an_ollama_route_fail(
    http: httpx.Client, path: str, body: dict[str, Any]
) -> None:
    response = http.post(path, json=body, headers={"x-request-timeout": "5"})
    assert response.status_code < 500, (response.status_code, response.text[:300])
    assert "Traceback" not in response.text
    if response.status_code >= 400:
        error_of(response, response.status_code)


# -- the watchdog's half ---------------------------------------------------------------------------


def test_no_client_input_counted_against_the_backends(
    http: httpx.Client, router_process: RunningRouter, fakes: dict[str, FakeBackend], router: str
) -> None:
    """Everything above that a client did wrong, and this barrage, left no watchdog
    verdict on the backends that only clients misused."""
    for _, path, body, _ in WRONG:
        http.post(path, json=body)
    for name in STRICT_CASES:
        post_raw(http, "/api/chat", STRICT_CASES[name])
    for path in MODEL_PATHS:
        http.post(path, content=b"{}", headers={"content-type": "text/plain"})
    fakes["chat"].script(chunks=50, chunk_interval_seconds=0.05)
    streamed_first_line(router, "/api/chat", chat(stream=True))
    fakes["chat"].wait_for(lambda reqs: any(r["disconnected"] for r in reqs))
    for role in ("chat", "vis", "embed", "queue"):
        assert watchdog_events(router_process, role) == [], role
        assert failure_verdicts(http, role) == 0, role
    fakes["chat"].script(reply="still here")
    assert http.post("/api/chat", json=chat()).json()["message"]["content"] == "still here"


# -- supervised: the launcher, fake llama-servers, the watchdog at a second ------------------------


@pytest.fixture(scope="module")
def supervised(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Watched]:
    tmp = tmp_path_factory.mktemp("supervised-ollama")
    models = {
        "standard": fake_entry(tmp, "standard", context_length=CONTEXT, default_timeout=10),
        "lazy": fake_entry(tmp, "lazy", load="on_demand", idle_ttl=600),
    }
    with watched(tmp, models, SLM_API_KEYS=KEY) as stack:
        yield stack


def test_a_long_healthy_stream_is_neither_cut_nor_counted(supervised: Watched) -> None:
    stack = supervised
    stack.past_startup_grace("standard")
    pid = stack.pid("standard")
    # Twice the stall and silence limits (a second each), a token every 0.3 s.
    stack.control("standard", chunks=8, chunk_interval_seconds=0.3)
    started = time.monotonic()
    body = {"model": "fake-standard", "messages": HI}
    response = one_shot.post(f"{stack.url}/api/chat", json=body, headers=AUTH, timeout=30)
    assert time.monotonic() - started > 2
    got = done_stream(response)
    assert "".join(line["message"]["content"] for line in got) == "tok " * 8
    a_sweep_has_passed(stack)
    assert not stack.events("backend_failure")
    assert not stack.events("restart_requested")
    assert stack.pid("standard") == pid


def test_a_barrage_of_bad_ollama_requests_never_counts_against_a_supervised_backend(
    supervised: Watched,
) -> None:
    """Each request twice in a row (two failures are a trip here); what each is
    answered is the router-only tests' concern, what it cost the backend is this one's."""
    stack = supervised
    stack.past_startup_grace("standard")
    pid = stack.pid("standard")
    stack.control("standard")  # answered at once, should any reach it
    with httpx.Client(base_url=stack.url, headers=AUTH, timeout=10, trust_env=False) as client:
        for _, path, body, _ in WRONG:
            if body.get("model") == "chat" and path != "/api/show":
                for _ in range(2):
                    client.post(path, json={**body, "model": "fake-standard"})
        for name in STRICT_CASES:
            for _ in range(2):
                post_raw(client, "/api/generate", STRICT_CASES[name])
        stack.control("standard", chunks=50, chunk_interval_seconds=0.05)
        for _ in range(2):  # a client leaving mid-stream, twice
            streamed_first_line(stack.url, "/api/chat", chat("fake-standard", stream=True), AUTH)
    a_sweep_has_passed(stack)
    assert not stack.events("backend_failure")
    assert not stack.events("restart_requested")
    assert stack.pid("standard") == pid
    assert stack.state("standard")["state"] == "ready"


# -- API keys (on the supervised stack) ------------------------------------------------------------

GUARDED = [
    ("POST", "/api/chat", chat("fake-standard")),
    ("POST", "/api/generate", generate("fake-standard")),
    ("POST", "/api/show", {"model": "fake-standard"}),
    ("GET", "/api/tags", None),
    ("GET", "/api/ps", None),
    ("GET", "/api/version", None),
]


@pytest.mark.parametrize(("method", "path", "body"), GUARDED, ids=[g[1] for g in GUARDED])
def test_api_routes_need_the_key(supervised: Watched, method: str, path: str, body: Any) -> None:
    stack = supervised
    stack.control("standard")  # answers at once
    sent = len(fake_requests(stack))
    with httpx.Client(base_url=stack.url, timeout=10, trust_env=False) as client:
        for headers in ({}, {"authorization": "Bearer wrong"}, {"x-api-key": "wrong"}):
            refused = client.request(method, path, json=body, headers=headers)
            assert "API key" in error_of(refused, 401)
        assert len(fake_requests(stack)) == sent
        for headers in (AUTH, {"x-api-key": KEY}):
            answer = client.request(method, path, json=body, headers=headers)
            assert answer.status_code == 200, answer.text[:300]


def test_the_probes_need_no_key(supervised: Watched) -> None:
    with httpx.Client(base_url=supervised.url, timeout=10, trust_env=False) as client:
        assert client.get("/").text == "Ollama is running"
        assert client.head("/").status_code == 200
        assert client.get("/health").status_code == 200


def test_a_huge_keep_alive_leaves_api_ps_answering(supervised: Watched) -> None:
    """``keep_alive`` far in the future (Ollama's clients send seconds or a Go
    duration) keeps an on-demand model loaded: ``/api/ps`` says until when, for
    every client, and does not fail."""
    stack = supervised
    body = {"model": "fake-lazy", "prompt": "hi", "stream": False, "keep_alive": "300000000h"}
    response = one_shot.post(f"{stack.url}/api/generate", json=body, headers=AUTH, timeout=30)
    assert response.status_code == 200, response.text[:300]
    assert response.json()["done"] is True
    listed = one_shot.get(f"{stack.url}/api/ps", headers=AUTH, timeout=10)
    assert listed.status_code == 200, listed.text[:300]
    [lazy] = [m for m in listed.json()["models"] if m["name"] == "fake-lazy"]
    assert lazy["expires_at"] > "2318"
    assert one_shot.get(f"{stack.url}/v1/models", headers=AUTH, timeout=10).status_code == 200
