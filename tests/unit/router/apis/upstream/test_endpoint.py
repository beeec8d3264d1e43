"""``/upstream/<model>/<engine path>`` in-process: what the engine is sent (method, path,
query, body bytes, headers), the answer relayed unchanged (errors too, streams as they
come), every refusal with its status and why, and what the watchdog hears: only what
the engine did wrong by itself."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote

import pytest
from starlette.applications import Starlette
from starlette.types import Message

from slm_server.errors import BackendUnavailable
from tests.unit.router.inprocess import (
    Answer,
    FakeResponse,
    Script,
    Sent,
    call,
    make_router,
    run,
    serving,
    sse,
    whole,
)

pytestmark = pytest.mark.usefixtures("via")

MODEL = "org/chat-model"  # an id with a slash: the path's first two segments
BASE = f"/upstream/{MODEL}"


def recording(answer: FakeResponse | None = None) -> tuple[list[Sent], Script]:
    sent: list[Sent] = []

    async def script(request: Sent) -> FakeResponse:
        sent.append(request)
        return answer if answer is not None else whole({"tokens": [1, 2, 3]})

    return sent, script


def test_a_post_reaches_the_engine_as_the_client_wrote_it(tmp_path: Path) -> None:
    raw = b'{"content":  "hi",\n "with_pieces": false}'  # spacing kept: never re-serialised
    answer = b'{"tokens": [1,  2]}'
    router = make_router(tmp_path, lambda sent: _whole_bytes(answer))

    async def scenario() -> None:
        async with serving(router):
            got = await call(
                router.app,
                f"{BASE}/tokenize?trace=1&x=a:b",
                raw,
                headers={"x-client": "yes", "authorization": "Bearer secret"},
            )
            assert got.status == 200
            assert got.body == answer  # byte for byte
            [sent] = router.transport.sent
            assert (sent.method, sent.path, sent.body) == ("POST", "/tokenize?trace=1&x=a:b", raw)
            assert sent.headers["x-client"] == "yes"
            assert "authorization" not in sent.headers  # the client's key stays here
            assert sent.headers["x-request-id"] == got.headers["x-request-id"]
            assert router.gate_active() == 0

    run(scenario())


async def _whole_bytes(body: bytes, status: int = 200) -> FakeResponse:
    return FakeResponse(status, {"content-type": "application/json"}, [body])


def test_a_get_with_no_body_is_sent_as_a_get(tmp_path: Path) -> None:
    router = make_router(tmp_path, lambda sent: _whole_bytes(b'{"n_ctx": 4096}'))

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, f"{BASE}/props", b"", method="GET")
            assert (got.status, got.body) == (200, b'{"n_ctx": 4096}')
            [sent] = router.transport.sent
            assert (sent.method, sent.path, sent.body) == ("GET", "/props", b"")

    run(scenario())


def test_an_alias_names_the_model_too(tmp_path: Path) -> None:
    router = make_router(tmp_path, lambda sent: _whole_bytes(b"{}"), chat="    aliases: [short]\n")

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, "/upstream/short/tokenize", {"content": "x"})
            assert got.status == 200
            assert router.transport.sent[0].spec.entry.id == MODEL

    run(scenario())


@pytest.mark.parametrize("status", [400, 404, 422, 500, 503])
def test_the_engine_s_error_is_relayed_unchanged_and_never_counted(
    tmp_path: Path, status: int
) -> None:
    body = b'{"error":{"code":%d,"message":"[json.exception.parse_error.101]","type":"x"}}' % status
    router = make_router(tmp_path, lambda sent: _whole_bytes(body, status))

    async def scenario() -> None:
        async with serving(router):
            for _ in range(3):  # past the failure threshold (2) were any counted
                got = await call(router.app, f"{BASE}/tokenize", b"{not json")
                assert (got.status, got.body) == (status, body)
            assert router.events.named("backend_failure") == []
            assert router.events.named("restart_requested") == []
            assert router.gate_active() == 0

    run(scenario())


def test_an_unreachable_engine_counts_as_on_every_route(tmp_path: Path) -> None:
    async def refused(_sent: Sent) -> FakeResponse:
        raise BackendUnavailable("The backend is unreachable", retry_after=5.0)

    router = make_router(tmp_path, refused)

    async def scenario() -> None:
        async with serving(router):
            for _ in range(2):
                got = await call(router.app, f"{BASE}/tokenize", {"content": "x"})
                assert got.status == 503
                assert got.json()["error"]["code"] == "backend_unreachable"
            assert len(router.events.named("restart_requested")) == 1

    run(scenario())


def test_a_stream_is_relayed_as_it_comes_and_with_no_keep_alive(tmp_path: Path) -> None:
    release = asyncio.Event()
    events = [{"content": "a", "stop": False}, {"content": "b", "stop": False}]
    stream = sse(*events, done=False, then=[release, b'data: {"content":"","stop":true}\n\n'])
    router = make_router(tmp_path, lambda sent: _ready(stream))

    async def scenario() -> None:
        async with serving(router):
            got = Answer()
            task = asyncio.create_task(
                call(router.app, f"{BASE}/completion", {"prompt": "x", "stream": True}, answer=got)
            )
            await _until(lambda: b'"b"' in got.body)
            assert not got.complete  # the first events are out before the last exists
            release.set()
            await task
            assert got.headers["content-type"].startswith("text/event-stream")
            assert b"keep-alive" not in got.body
            assert [e["content"] for e in got.events()] == ["a", "b", ""]

    run(scenario())


async def _ready(response: FakeResponse) -> FakeResponse:
    return response


async def _until(condition: Callable[[], bool], seconds: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not condition():
        assert loop.time() < deadline, "never happened"
        await asyncio.sleep(0.005)


def test_a_client_that_leaves_mid_stream_closes_the_engine_s_response(tmp_path: Path) -> None:
    never = asyncio.Event()
    stream = sse({"content": "a", "stop": False}, done=False, then=[never])
    router = make_router(tmp_path, lambda sent: _ready(stream))

    async def scenario() -> None:
        async with serving(router):
            leave, got = asyncio.Event(), Answer()
            task = asyncio.create_task(
                call(
                    router.app,
                    f"{BASE}/completion",
                    {"prompt": "x", "stream": True},
                    leave=leave,
                    answer=got,
                )
            )
            await _until(lambda: b'"a"' in got.body)
            leave.set()
            await asyncio.wait_for(stream.closed.wait(), 5)
            await task
            assert router.gate_active() == 0
            assert router.events.named("backend_failure") == []

    run(scenario())


@pytest.mark.parametrize(
    ("method", "path", "words"),
    [
        ("GET", "/slots", "other clients' requests"),
        ("POST", "/slots/0?action=save", "saves, restores or erases"),
        ("POST", "/slots/0?action=erase", "saves, restores or erases"),
        ("POST", "/props", "global properties"),
        ("POST", "/lora-adapters", "LoRA adapters"),
        ("GET", "/metrics", "engine's own metrics"),
        ("POST", "/v1/chat/completions/control", "another client's generation"),
        ("GET", "", "not among the paths"),  # the engine's root: its web page
        ("POST", "/tools", "server-side tools"),
    ],
)
def test_a_path_that_changes_or_shows_the_engine_s_state_is_403_with_why(
    tmp_path: Path, method: str, path: str, words: str
) -> None:
    sent, script = recording()
    router = make_router(tmp_path, script)

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, f"{BASE}{path}", b"{}", method=method)
            assert got.status == 403
            error = got.json()["error"]
            assert error["code"] == "upstream_path_not_allowed"
            assert words in error["message"]
            assert "upstream_paths" in error["message"]
            assert sent == []
            assert router.gate_active() == 0

    run(scenario())


def test_the_entry_s_upstream_paths_allow_what_it_lists(tmp_path: Path) -> None:
    sent, script = recording(whole({"id_slot": 0, "n_saved": 3}))
    router = make_router(
        tmp_path,
        script,
        chat='    upstream_paths: ["POST /slots/*", "GET /slots"]\n',
    )

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, f"{BASE}/slots/0?action=save", {"filename": "a.bin"})
            assert got.status == 200
            assert sent[0].path == "/slots/0?action=save"
            refused = await call(router.app, f"{BASE}/props", {"x": 1})  # POST /props: not listed
            assert refused.status == 403

    run(scenario())


@pytest.mark.parametrize(
    "path",
    [
        f"{BASE}/../x",
        f"{BASE}/./tokenize",
        f"{BASE}//tokenize",
        f"{BASE}/tokenize/",
        f"{BASE}/%2e%2e/slots",
        f"{BASE}/slots%2fx",
    ],
)
def test_a_path_that_could_reach_elsewhere_is_refused_before_anything(
    tmp_path: Path, path: str
) -> None:
    sent, script = recording()
    router = make_router(tmp_path, script)

    async def scenario() -> None:
        async with serving(router):
            got = await _raw_path_call(router.app, path)
            assert got.status == 400
            assert got.json()["error"]["code"] == "invalid_upstream_path"
            assert sent == []

    run(scenario())


async def _raw_path_call(app: Starlette, raw: str) -> Answer:
    """A request whose raw path keeps its escapes, as a server gives it (the decoded
    path beside it)."""
    got = Answer()
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": unquote(raw),
        "raw_path": raw.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"127.0.0.1:8000"), (b"content-length", b"2")],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": b"{}", "more_body": False}
        await asyncio.Event().wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        if message["type"] == "http.response.start":
            got.status = message["status"]
        elif message["type"] == "http.response.body":
            got.chunks.append(message.get("body", b""))

    await app(scope, receive, send)
    return got


def test_an_unknown_model_is_404_in_openai_s_shape(tmp_path: Path) -> None:
    router = make_router(tmp_path, lambda sent: _whole_bytes(b"{}"))

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, "/upstream/nope/tokenize", {"content": "x"})
            assert got.status == 404
            assert got.json()["error"]["code"] == "model_not_found"
            assert "org/chat-model" in got.json()["error"]["message"]

    run(scenario())


def test_a_disabled_model_is_404_and_a_remote_one_400(tmp_path: Path) -> None:
    more = (
        "  off:\n    id: off-model\n    backend: llamacpp\n    port: 18009\n"
        "    model_path: models/off.gguf\n    default_timeout: 5\n    quantization: Q4_1\n"
        "    enabled: false\n"
        "  far:\n    id: far-model\n    backend: remote\n    url: http://10.0.0.5:8000/v1\n"
        "    default_timeout: 5\n"
    )
    sent, script = recording()
    router = make_router(tmp_path, script, more=more)

    async def scenario() -> None:
        async with serving(router):
            off = await call(router.app, "/upstream/off-model/tokenize", {"content": "x"})
            assert off.status == 404
            assert "not enabled" in off.json()["error"]["message"]
            far = await call(router.app, "/upstream/far-model/tokenize", {"content": "x"})
            assert far.status == 400
            assert far.json()["error"]["code"] == "upstream_remote"
            assert sent == []

    run(scenario())


def test_head_is_405(tmp_path: Path) -> None:
    sent, script = recording()
    router = make_router(tmp_path, script)

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, f"{BASE}/health", b"", method="HEAD")
            assert got.status == 405
            assert sent == []

    run(scenario())


def test_a_body_past_the_limit_is_413_and_never_sent(tmp_path: Path) -> None:
    sent, script = recording()
    router = make_router(
        tmp_path,
        script,
        env={"SLM_MAX_BODY_MB": "1"},
    )

    async def scenario() -> None:
        async with serving(router):
            body = json.dumps({"content": "x" * (2 << 20)}).encode()
            got = await call(router.app, f"{BASE}/tokenize", body)
            assert got.status == 413
            assert got.json()["error"]["code"] == "request_too_large"
            assert sent == []

    run(scenario())
