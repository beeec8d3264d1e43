"""``POST /infill`` and completions with ``suffix`` in-process: sent as llama-server takes
them (llama.vscode's and Continue's bodies), routed to the registry's default model when
the body names none, refused with a 400 naming why for a model that cannot fill in the
middle (before it waits, once its file is read), and the answer in completions' shape
(whole and streamed, checked against the openai package's types)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gguf
import pytest

from tests.openai_shapes import strict_completion, strict_completion_chunks
from tests.plugin_requests import VSCODE
from tests.unit.memory.gguf_files import write_gguf
from tests.unit.router.inprocess import (
    FakeResponse,
    Router,
    Sent,
    backend_state,
    call,
    entry_text,
    make_router,
    run,
    serving,
    sse,
    whole,
)

pytestmark = pytest.mark.usefixtures("via")

MODEL = "org/chat-model"
CAN = "    infill: true\n"
NATIVE = {
    "index": 0,
    "content": " a + b",
    "tokens": [],
    "id_slot": 0,
    "stop": True,
    "model": MODEL,
    "tokens_predicted": 4,
    "tokens_evaluated": 17,
    "stop_type": "eos",
    "stopping_word": "",
    "timings": {"prompt_n": 17, "predicted_n": 4},
}


def recording(answer: Any = NATIVE) -> tuple[list[Sent], Any]:
    sent: list[Sent] = []

    async def script(request: Sent) -> FakeResponse:
        sent.append(request)
        return answer if isinstance(answer, FakeResponse) else whole(answer)

    return sent, script


def test_llama_vscode_s_body_goes_to_the_default_model_as_it_came(tmp_path: Path) -> None:
    sent, script = recording()
    router = make_router(tmp_path, script, chat=CAN + "    infill_default: true\n")
    raw = json.dumps(VSCODE).encode()

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, "/infill", raw)
            assert got.status == 200
            assert got.json() == NATIVE  # llama-server's answer, as it is
            [request] = sent
            assert (request.path, request.body) == ("/infill", raw)
            assert request.spec.entry.id == MODEL

    run(scenario())


def test_with_no_model_and_no_default_the_request_is_400_naming_the_field(
    tmp_path: Path,
) -> None:
    sent, script = recording()
    router = make_router(tmp_path, script, chat=CAN)

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, "/infill", VSCODE)
            assert got.status == 400
            error = got.json()["error"]
            assert (error["code"], error["param"]) == ("missing_model", "model")
            assert "infill_default" in error["message"]
            assert sent == []

    run(scenario())


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"input_suffix": None}, "input_suffix"),  # llama-server: 500
        ({"input_prefix": None}, "input_prefix"),
        ({"input_prefix": {"a": 1}}, "input_prefix"),
        ({"input_extra": ["text"]}, "input_extra[0]"),  # llama-server: 500
        ({"input_extra": [{"text": 1}]}, "input_extra[0]"),
        ({"input_extra": [{"text": "x", "filename": 3}]}, "input_extra[0]"),
        ({"input_extra": "x"}, "input_extra"),
        ({"prompt": 5}, "prompt"),
    ],
)
def test_what_llama_server_would_fail_on_is_refused_first(
    tmp_path: Path, change: dict[str, Any], param: str
) -> None:
    sent, script = recording()
    router = make_router(tmp_path, script, chat=CAN)
    body = {"model": MODEL, **VSCODE, **change}
    body = {k: v for k, v in body.items() if v is not None}

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, "/infill", body)
            assert got.status == 400
            assert got.json()["error"]["param"] == param
            assert sent == []

    run(scenario())


def fim_model(path: Path, *, tokens: bool) -> Path:
    """A GGUF whose vocabulary has (or lacks) llama.cpp's FIM tokens by their text."""
    vocabulary = ["<unk>", "a", "b"]
    if tokens:
        vocabulary += ["<fim_prefix>", "<fim_suffix>", "<fim_middle>"]

    def fill(writer: gguf.GGUFWriter) -> None:
        writer.add_token_list(vocabulary)

    return write_gguf(path, "llama", fill)


def gguf_router(tmp_path: Path, script: Any, *, tokens: bool, **fields: Any) -> Router:
    model = fim_model(tmp_path / "coder.gguf", tokens=tokens)
    more = entry_text("coder", 18002, model_path=str(model), **fields)
    return make_router(tmp_path, script, more=more)


def test_a_model_whose_gguf_has_the_tokens_fills_in(tmp_path: Path) -> None:
    sent, script = recording()
    router = gguf_router(tmp_path, script, tokens=True)

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, "/infill", {"model": "coder-model", **VSCODE})
            assert got.status == 200
            assert len(sent) == 1
            listed = await call(router.app, "/v1/models", b"", method="GET")
            infill = {m["id"]: m["infill"] for m in listed.json()["data"]}
            assert infill == {MODEL: None, "coder-model": True}

    run(scenario())


def test_a_model_without_the_tokens_is_400_and_then_refused_before_it_loads(
    tmp_path: Path,
) -> None:
    sent, script = recording()
    router = gguf_router(tmp_path, script, tokens=False, load="on_demand")

    async def scenario() -> None:
        async with serving(router):
            first = await call(router.app, "/infill", {"model": "coder-model", **VSCODE})
            assert first.status == 400
            error = first.json()["error"]
            assert (error["code"], error["param"]) == ("infill_not_supported", "model")
            assert "no fill-in-the-middle prefix or suffix or middle token" in error["message"]
            router.supervisor.publish(router.spec_of("coder"), "unloaded")  # unloaded since
            loads = router.supervisor.loads
            again = await call(
                router.app, "/v1/completions", {**completion(suffix="x"), "model": "coder-model"}
            )
            assert again.status == 400
            assert router.supervisor.loads == loads  # refused before admission: no load
            assert sent == []
            listed = await call(router.app, "/v1/models/coder-model", b"", method="GET")
            assert listed.json()["infill"] is False

    run(scenario())


@pytest.mark.parametrize(
    ("chat", "why"),
    [
        ("", "its model file cannot be found"),
        ("    infill: false\n", "its registry entry says it does not take infill"),
    ],
)
def test_a_model_that_cannot_say_or_says_no_is_refused(tmp_path: Path, chat: str, why: str) -> None:
    sent, script = recording()
    router = make_router(tmp_path, script, chat=chat)

    async def scenario() -> None:
        async with serving(router):
            for path, body in (
                ("/infill", {"model": MODEL, **VSCODE}),
                ("/v1/completions", completion(suffix="}")),
            ):
                got = await call(router.app, path, body)
                assert got.status == 400, path
                assert why in got.json()["error"]["message"]
            assert sent == []
            assert router.gate_active() == 0

    run(scenario())


def completion(**fields: Any) -> dict[str, Any]:
    """Continue's FIM request fields (core/llm/llms/OpenAI.ts, _streamFim), on
    /v1/completions."""
    return {
        "model": MODEL,
        "prompt": "def add(a, b):\n    return",
        "max_tokens": 16,
        "temperature": 0.01,
        "top_p": 0.9,
        "frequency_penalty": 0,
        "presence_penalty": 0,
        "stop": ["\n\n"],
        "stream": False,
        **fields,
    }


def test_a_suffix_is_sent_to_infill_and_answered_as_a_completion(tmp_path: Path) -> None:
    sent, script = recording({**NATIVE, "stop_type": "limit"})
    router = make_router(tmp_path, script, chat=CAN)

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, "/v1/completions", completion(suffix="\n\nprint(1)\n"))
            assert got.status == 200
            answer = strict_completion(got.json())
            assert answer.choices[0].text == " a + b"
            assert answer.choices[0].finish_reason == "length"
            assert answer.model == MODEL and answer.id.startswith("cmpl-")
            assert answer.usage is not None
            assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (17, 4)
            [request] = sent
            assert request.path == "/infill"
            body = request.json()
            assert body["input_prefix"] == "def add(a, b):\n    return"
            assert body["input_suffix"] == "\n\nprint(1)\n"
            assert body["prompt"] == "" and "suffix" not in body
            assert (body["max_tokens"], body["stop"]) == (16, ["\n\n"])

    run(scenario())


def test_completions_without_a_suffix_pass_through(tmp_path: Path) -> None:
    sent, script = recording({"id": "cmpl-1", "object": "text_completion", "choices": []})
    router = make_router(tmp_path, script)  # no infill: never asked

    async def scenario() -> None:
        async with serving(router):
            for suffix in ({}, {"suffix": None}):
                got = await call(router.app, "/v1/completions", completion(**suffix))
                assert got.status == 200
            assert [s.path for s in sent] == ["/v1/completions"] * 2

    run(scenario())


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"n": 2}, "n"),
        ({"best_of": 3}, "best_of"),
        ({"echo": True}, "echo"),
        ({"logprobs": 2}, "logprobs"),
        ({"prompt": ["one", "two"]}, "prompt"),
        ({"suffix": 3}, "suffix"),
    ],
)
def test_what_the_infill_answer_cannot_carry_back_is_400(
    tmp_path: Path, fields: dict[str, Any], param: str
) -> None:
    sent, script = recording()
    router = make_router(tmp_path, script, chat=CAN)

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, "/v1/completions", completion(**{"suffix": "}", **fields}))
            assert got.status == 400
            assert got.json()["error"]["param"] == param
            assert sent == []

    run(scenario())


def native_stream(*, progress: bool) -> FakeResponse:
    """llama-server's streamed infill answer: its own events, no [DONE]."""
    events: list[dict[str, Any]] = []
    if progress:
        report = {"total": 9, "cache": 0, "processed": 9, "time_ms": 1.0}
        events.append({"content": "", "stop": False, "prompt_progress": report})
    events += [{"index": 0, "content": piece, "stop": False} for piece in (" a", " +", " b")]
    events.append({**NATIVE, "content": ""})
    return sse(*events, done=False)


def llama_server(router: Router) -> None:
    """A launcher that runs llama-server for the chat model (its progress reports)."""
    router.states.alive = True
    spec = router.spec
    state = backend_state(spec, "ready", kind="llama-server")
    router.states.states[(spec.role, spec.entry.port)] = state


@pytest.mark.parametrize("usage", [True, False])
def test_a_suffix_stream_is_completions_chunks_from_llama_server_s_events(
    tmp_path: Path, usage: bool
) -> None:
    sent, script = recording(native_stream(progress=True))
    router = make_router(tmp_path, script, chat=CAN)
    llama_server(router)
    options = {"stream_options": {"include_usage": True}} if usage else {}

    async def scenario() -> None:
        async with serving(router):
            body = completion(suffix="}", stream=True, **options)
            got = await call(router.app, "/v1/completions", body)
            assert got.status == 200
            events = got.events()
            assert events[-1] == "[DONE]"
            chunks = strict_completion_chunks(events[:-1])
            text = "".join(c.choices[0].text for c in chunks if c.choices)
            assert text == " a + b"
            usages = [c.usage for c in chunks if c.usage is not None]
            assert len(usages) == (1 if usage else 0)
            assert all("prompt_progress" not in json.dumps(e) for e in events[:-1])
            asked = sent[0].json()
            assert asked["return_progress"] is True  # the watchdog's signs of life

    run(scenario())


def test_a_streamed_infill_is_llama_server_s_own_events_with_its_reports_kept_back(
    tmp_path: Path,
) -> None:
    sent, script = recording(native_stream(progress=True))
    router = make_router(tmp_path, script, chat=CAN)
    llama_server(router)

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, "/infill", {"model": MODEL, **VSCODE, "stream": True})
            assert got.status == 200
            events = got.events()
            assert [e["content"] for e in events] == [" a", " +", " b", ""]
            assert events[-1]["stop"] is True
            recent = await call(router.app, "/v1/ui/requests", b"", method="GET")
            [record] = [r for r in recent.json()["data"] if r["endpoint"] == "/infill"]
            assert (record["input_tokens"], record["output_tokens"]) == (17, 4)
            assert sent[0].json()["return_progress"] is True

    run(scenario())


def test_a_whole_infill_is_noted_for_telemetry(tmp_path: Path) -> None:
    _sent, script = recording()
    router = make_router(tmp_path, script, chat=CAN)

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, "/infill", {"model": MODEL, **VSCODE})
            assert got.status == 200
            recent = await call(router.app, "/v1/ui/requests", b"", method="GET")
            [record] = recent.json()["data"]
            assert (record["input_tokens"], record["output_tokens"]) == (17, 4)

    run(scenario())


def test_llama_cpp_python_s_server_takes_the_suffix_itself_and_has_no_infill(
    tmp_path: Path,
) -> None:
    sent, script = recording({"id": "cmpl-1", "object": "text_completion", "choices": []})
    router = make_router(tmp_path, script, chat=CAN)
    router.states.alive = True
    spec = router.spec
    fallback = backend_state(spec, "ready", kind="llama_cpp.server")
    router.states.states[(spec.role, spec.entry.port)] = fallback

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, "/v1/completions", completion(suffix="}"))
            assert got.status == 200
            assert sent[0].path == "/v1/completions"
            assert sent[0].json()["suffix"] == "}"
            refused = await call(router.app, "/infill", {"model": MODEL, **VSCODE})
            assert refused.status == 400
            assert "llama_cpp.server" in refused.json()["error"]["message"]

    run(scenario())


def test_an_engine_501_on_infill_never_counts(tmp_path: Path) -> None:
    error = {"error": {"code": 501, "message": "Infill is not supported", "type": "x"}}
    _sent, script = recording(whole(error, status=501))
    router = make_router(tmp_path, script, chat=CAN)  # the entry says so, wrongly

    async def scenario() -> None:
        async with serving(router):
            for _ in range(3):
                got = await call(router.app, "/infill", {"model": MODEL, **VSCODE})
                assert got.status == 501
            assert router.events.named("backend_failure") == []

    run(scenario())
