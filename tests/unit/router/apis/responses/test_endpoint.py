"""``POST /v1/responses`` in-process (:mod:`slm_server.router.apis.responses.endpoint`):
the hosted tools left out are named in the ``x-slm-dropped-tools`` header of every
answer (whole, streamed, a backend's error; through plain ASGI and through the door)
and in the access line, and a request only the translation serves is never sent to an
MLX backend's own ``/v1/responses``."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from tests.openai_shapes import strict_events, strict_response
from tests.unit.router.inprocess import (
    FakeResponse,
    Sent,
    call,
    entry_text,
    make_router,
    run,
    serving,
    sse,
    whole,
)

# Every test here runs twice: through plain ASGI and through the door (its fast path).
pytestmark = pytest.mark.usefixtures("via")

MODEL = "org/chat-model"
TOOLS = [
    {"type": "web_search"},
    {
        "type": "namespace",
        "name": "crm",
        "description": "CRM",
        "tools": [{"type": "function", "name": "lookup"}],
    },
    {"type": "mcp", "server_label": "deepwiki", "server_url": "https://x.example"},
]
CALL = {"id": "call_1", "type": "function", "function": {"name": "crm__lookup", "arguments": "{}"}}
ANSWER = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": MODEL,
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": None, "tool_calls": [CALL]},
            "finish_reason": "tool_calls",
        }
    ],
    "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
}
CHUNKS = [
    {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "delta": {"tool_calls": [{"index": 0, **CALL}]},
                "finish_reason": "tool_calls",
            }
        ],
    }
]
MLX = entry_text(
    "mlx", 18002, id="org/mlx-model", backend="mlx", model_path="org/model", quantization="4bit"
)


def answering(response: FakeResponse) -> Any:
    async def script(_sent: Sent) -> FakeResponse:
        return response

    return script


def access_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "slm_server.access"]


def test_a_whole_answer_names_the_dropped_tools(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="slm_server.access")
    router = make_router(tmp_path, answering(whole(ANSWER)))

    async def scenario() -> None:
        async with serving(router):
            got = await call(
                router.app, "/v1/responses", {"model": MODEL, "input": "hi", "tools": TOOLS}
            )
            assert got.status == 200
            assert got.headers["x-slm-dropped-tools"] == "web_search, mcp"
            [item] = strict_response(got.json()).output
            assert item.type == "function_call"
            assert (item.namespace, item.name) == ("crm", "lookup")
            [sent] = router.transport.sent
            assert [t["function"]["name"] for t in sent.json()["tools"]] == ["crm__lookup"]

    run(scenario())
    [line] = access_lines(caplog)
    assert line.getMessage().endswith(" dropped_tools=web_search,mcp")
    assert getattr(line, "dropped_tools", None) == ["web_search", "mcp"]


def test_a_stream_names_the_dropped_tools(tmp_path: Path) -> None:
    router = make_router(tmp_path, answering(sse(*CHUNKS)))

    async def scenario() -> None:
        async with serving(router):
            body = {"model": MODEL, "input": "hi", "tools": TOOLS, "stream": True}
            got = await call(router.app, "/v1/responses", body)
            assert got.status == 200
            assert got.headers["x-slm-dropped-tools"] == "web_search, mcp"
            events = strict_events(got.events())
            assert events[-1].type == "response.completed"

    run(scenario())


def test_a_backend_s_error_names_the_dropped_tools_too(tmp_path: Path) -> None:
    error = {"error": {"message": "no", "type": "invalid_request_error", "code": 400}}
    router = make_router(tmp_path, answering(whole(error, status=400)))

    async def scenario() -> None:
        async with serving(router):
            got = await call(
                router.app, "/v1/responses", {"model": MODEL, "input": "hi", "tools": TOOLS}
            )
            assert got.status == 400
            assert got.headers["x-slm-dropped-tools"] == "web_search, mcp"

    run(scenario())


def test_nothing_dropped_no_header(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="slm_server.access")
    router = make_router(tmp_path, answering(whole(ANSWER)))

    async def scenario() -> None:
        async with serving(router):
            got = await call(
                router.app, "/v1/responses", {"model": MODEL, "input": "hi", "tools": TOOLS[1:2]}
            )
            assert got.status == 200
            assert "x-slm-dropped-tools" not in got.headers

    run(scenario())
    [line] = access_lines(caplog)
    assert "dropped_tools" not in line.getMessage()


def test_a_refused_tool_names_its_field(tmp_path: Path) -> None:
    router = make_router(tmp_path, answering(whole(ANSWER)))

    async def scenario() -> None:
        async with serving(router):
            body = {"model": MODEL, "input": "hi", "tools": [{"type": "local_shell"}]}
            got = await call(router.app, "/v1/responses", body)
            assert got.status == 400
            assert got.json()["error"]["param"] == "tools[0].type"
            assert router.transport.sent == []

    run(scenario())


def test_an_mlx_backend_s_own_api_is_skipped_for_what_only_the_translation_serves(
    tmp_path: Path,
) -> None:
    paths: list[str] = []

    async def script(sent: Sent) -> FakeResponse:
        paths.append(sent.path)
        return whole(ANSWER)

    router = make_router(tmp_path, script, more=MLX)

    async def scenario() -> None:
        async with serving(router):
            model = "org/mlx-model"
            got = await call(
                router.app, "/v1/responses", {"model": model, "input": "hi", "tools": TOOLS}
            )
            assert got.status == 200
            assert paths == ["/v1/chat/completions"]
            plain = {"model": model, "input": "hi"}
            assert (await call(router.app, "/v1/responses", plain)).status == 200
            assert paths[-1] == "/v1/responses"

    run(scenario())
