"""The watchdog spares a healthy backend, whatever a client does or a file says: holes
found by a hostile review, each test failing before its fix. A client that reads
nothing (the stream's head cannot go out), a body llama-server answers 500, "stream":
true on an endpoint that never streams, a forged request file for a model with no
canary, a forged NaN stamp.

Driven through the real code: the router in-process on a scripted upstream, uvicorn's
protocol as the router's door serves it, the supervisor's pure core.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, cast

import pytest

from slm_server.contracts.restart_requests import take_requests
from slm_server.supervise.core.actions import Confirm, Stop
from slm_server.supervise.core.confirm import judge
from slm_server.supervise.core.decide import Lifecycle, Policy, decide
from slm_server.supervise.core.observations import Judged, Requested
from slm_server.supervise.core.phases import Ready
from slm_server.supervise.core.restart_budget import RestartBudget
from slm_server.supervise.shell.evidence import Target, gather
from tests.unit.router.door_client import Unread, door_for
from tests.unit.router.inprocess import (
    FakeResponse,
    Router,
    Sent,
    call,
    entry_text,
    make_router,
    sse,
    whole,
)
from tests.unit.router.test_proxy import ANSWER, CHAT, MODEL, chat, delta, serving
from tests.unit.supervise.shell.test_evidence import FakeClock, FakeHttp, FakeProcs

EMBED_MODEL = "org/embed-model"
EMBEDDINGS = entry_text("embed", 18003, id=EMBED_MODEL, model_type="embeddings")


# Every test here runs twice: through plain ASGI and through the door (its fast path).
pytestmark = pytest.mark.usefixtures("via")


def run(scenario: Any) -> None:
    asyncio.run(asyncio.wait_for(scenario, 20))


def failures(router: Router) -> list[dict[str, Any]]:
    return router.events.named("backend_failure")


def verdicts(router: Router) -> list[tuple[str, ...]]:
    """What the watchdog heard against the backend: each failure's class and detail,
    and each restart request written."""
    return [
        (e["event"], e.get("reason", ""), str(e.get("streak", "")), e.get("detail", ""))
        for e in router.events.events
        if e["event"] in ("backend_failure", "restart_requested")
    ]


# ---------------------------------------------------------------------------------------
# 1. A client that does not read: the stream's head cannot go out, so the router never
#    reads the backend's first chunk, and the backend is blamed for the silence.
# ---------------------------------------------------------------------------------------


def not_reading(router: Router) -> Any:
    """The router's app behind a client whose connection's write buffer is full (as
    uvicorn's ``send`` awaits ``flow.drain()`` when writing is paused): the stream's
    head never goes out. The client stays connected."""
    never = asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        async def held_send(message: Any) -> None:
            if message["type"] == "http.response.start":
                await never.wait()  # uvicorn: `if self.flow.write_paused: await drain()`
            await send(message)

        await router.app(scope, receive, held_send)

    return app


def healthy_stream(_sent: Sent) -> Any:
    async def answer() -> FakeResponse:
        # The backend answers at once: first token ready, rest of the answer ready.
        return sse(delta("Hello"), delta(" there", "stop"))

    return answer()


def test_a_client_that_reads_nothing_gets_a_healthy_stream_counted_as_timeouts(
    tmp_path: Path,
) -> None:
    """Two non-reading clients, each on a healthy backend that had its first chunk
    ready at once: the model's deadline cuts the relay while its head waits for the
    client, and ``deadline_outcome`` sees "nothing delivered" (the router never read)."""
    router = make_router(tmp_path, healthy_stream, timeout=0.3)

    async def scenario() -> None:
        async with serving(router):
            app = not_reading(router)
            for _ in range(2):
                await call(cast(Any, app), CHAT, chat(stream=True))
            # The backend had its whole answer ready within microseconds both times.
            assert verdicts(router) == []

    run(scenario())


def test_a_client_that_reads_nothing_trips_a_stall_on_a_healthy_backend(tmp_path: Path) -> None:
    """With SLM_WATCHDOG_STALL_SECONDS below the deadline (the setting the docs advise
    to catch a silent backend on its first stream), one non-reading client is enough:
    the first-byte timer runs while the first chunk sits unread in the router."""
    router = make_router(
        tmp_path, healthy_stream, timeout=1.0, env={"SLM_WATCHDOG_STALL_SECONDS": "0.1"}
    )

    async def scenario() -> None:
        async with serving(router):
            await call(cast(Any, not_reading(router)), CHAT, chat(stream=True))
            assert verdicts(router) == []

    run(scenario())


def post(path: str, body: dict[str, Any]) -> bytes:
    raw = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1:8000\r\ncontent-type: application/json\r\n"
        f"content-length: {len(raw)}\r\n\r\n"
    ).encode()
    return head + raw


def test_through_the_real_door_two_unread_keep_alive_requests_spare_a_healthy_backend(
    tmp_path: Path,
) -> None:
    """The same through uvicorn's httptools protocol as the router's door serves it: on
    one keep-alive connection a client sends a request with a large answer, then a
    stream, and reads nothing. The first answer fills the connection's buffer; the
    stream's head then waits for a drain that never comes. Two such connections used
    to trip a restart request against a backend that answered everything at once, and
    each cut stream kept its backend response and admission slot while the client
    held the send of its error event."""
    big = {
        **ANSWER,
        "choices": [
            {
                **cast(list[dict[str, Any]], ANSWER["choices"])[0],
                "message": {"role": "assistant", "content": "x" * 200_000},
            }
        ],
    }

    async def script(sent: Sent) -> FakeResponse:
        if sent.json().get("stream"):
            return sse(delta("Hello"), delta(" there", "stop"))
        return whole(big)

    router = make_router(tmp_path, script, timeout=0.3)

    async def scenario() -> None:
        async with serving(router):
            protocols = []
            for _ in range(2):
                transport = Unread()
                protocol = door_for(router.app, transport)
                protocol.data_received(post(CHAT, chat()) + post(CHAT, chat(stream=True)))
                protocols.append((protocol, transport))
            # Both streams are cut at their deadline (0.3 s), their heads never sent:
            # each backend response is closed then.
            loop = asyncio.get_running_loop()
            until = loop.time() + 5
            try:
                while len(router.transport.responses) < 4 or not all(
                    r.closed.is_set() for r in router.transport.responses
                ):
                    assert loop.time() < until, "the streams were never cut"
                    await asyncio.sleep(0.01)
                assert all(t.paused for _, t in protocols)
                assert verdicts(router) == []
                # ... and their admission slots are free again, though the client
                # never reads the error event that follows the cut.
                assert router.gate_active() == 0
            finally:
                for protocol, _ in protocols:
                    protocol.connection_lost(None)
                tasks = [task for protocol, _ in protocols for task in protocol.tasks]
                await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 5)

    run(scenario())


# ---------------------------------------------------------------------------------------
# 2. A body the router lets through, on which the pinned llama-server answers 500.
# ---------------------------------------------------------------------------------------


async def llama_server_at_the_pin(sent: Sent) -> FakeResponse:
    """What llama-server at config/llama.cpp.pin answers: ``oaicompat_chat_params_parse``
    (tools/server/server-common.cpp) throws ``std::runtime_error("Cannot use both
    json_schema and grammar")`` outside ``handle_completions_impl``'s try, and
    ``ex_wrapper`` (server.cpp) turns any non-``invalid_argument`` into a 500."""
    body = sent.json()
    if body.get("json_schema") is not None and body.get("grammar"):
        error = {
            "code": 500,
            "message": "Cannot use both json_schema and grammar",
            "type": "server_error",
        }
        return whole({"error": error}, status=500)
    return whole(ANSWER)


def test_a_client_body_the_backend_fails_on_is_refused_not_counted(tmp_path: Path) -> None:
    router = make_router(tmp_path, llama_server_at_the_pin)
    hostile = chat(json_schema={"type": "object"}, grammar='root ::= "a"')

    async def scenario() -> None:
        async with serving(router):
            for _ in range(2):
                await call(router.app, CHAT, hostile)
            ok = await call(router.app, CHAT, chat())
            assert ok.status == 200  # the backend is healthy
            assert verdicts(router) == []

    run(scenario())


def a_broken_history(arguments: str) -> list[dict[str, Any]]:
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": arguments}}
    return [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c", "content": "x"},
    ]


# Tool-call mistakes llama-server answers 500 (tests/integration/test_tool_call_refusals.py
# measures each), on each API shape: (path, body, where the answer names the field).
TOOL_CALL_MISTAKES: list[tuple[str, dict[str, Any], str]] = [
    (
        CHAT,
        chat(messages=a_broken_history("{oops")),
        "messages[1].tool_calls[0].function.arguments",
    ),
    (CHAT, chat(tools=[{"type": "function", "name": "f"}]), "tools[0].function"),
    (
        "/v1/responses",
        {
            "model": MODEL,
            "input": [
                {"role": "user", "content": "hi"},
                {"type": "function_call", "call_id": "c", "name": "f", "arguments": "[1]"},
                {"type": "function_call_output", "call_id": "c", "output": "x"},
            ],
        },
        "input[1].arguments",
    ),
    (
        "/v1/messages",
        {
            "model": MODEL,
            "max_tokens": 8,
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"name": "f", "input_schema": {"properties": {"a": {"$ref": "#/x"}}}}],
        },
        "tools[0].input_schema",
    ),
]


def test_tool_call_mistakes_are_refused_on_every_shape_never_sent_nor_counted(
    tmp_path: Path,
) -> None:
    router = make_router(tmp_path, llama_server_at_the_pin)

    async def scenario() -> None:
        async with serving(router):
            for path, body, param in TOOL_CALL_MISTAKES:
                for _ in range(2):
                    refused = await call(router.app, path, body)
                    assert refused.status == 400, refused.body
                    error = refused.json()["error"]
                    if path == "/v1/messages":
                        assert f"`{param}`" in error["message"]
                    else:
                        assert error["param"] == param
            assert router.transport.sent == []
            ok = await call(router.app, CHAT, chat())
            assert ok.status == 200
            assert verdicts(router) == []

    run(scenario())


# ---------------------------------------------------------------------------------------
# 3. "stream": true on an endpoint that never streams arms the first-byte stall timer.
# ---------------------------------------------------------------------------------------


def test_stream_true_on_embeddings_arms_a_stall_timer_that_trips(tmp_path: Path) -> None:
    """llama-server ignores ``stream`` on /v1/embeddings and sends its head only once
    the vectors are computed; the router still arms the first-byte timer (``exchange.
    stream`` is the client's flag, whatever the endpoint), so a large batch taking
    longer than the stall limit is a stall that trips at once."""

    async def embeddings(sent: Sent) -> FakeResponse:
        await asyncio.sleep(0.3)  # a big batch being computed; no head until done
        return whole({"object": "list", "data": [{"embedding": [0.1], "index": 0}]})

    router = make_router(
        tmp_path, embeddings, more=EMBEDDINGS, env={"SLM_WATCHDOG_STALL_SECONDS": "0.1"}
    )

    async def scenario() -> None:
        async with serving(router):
            got = await call(
                router.app,
                "/v1/embeddings",
                {"model": EMBED_MODEL, "input": ["a"] * 1000, "stream": True},
            )
            assert got.status == 200
            assert verdicts(router) == []

    run(scenario())


# ---------------------------------------------------------------------------------------
# 5. Forged request files.
# ---------------------------------------------------------------------------------------

ROLE, PORT, PID = "whisper", 8520, 4242
W_START = 1_700_000_000.0
GRACE = 180.0


def life(model_id: str = "whisper-small") -> Lifecycle:
    return Lifecycle(
        role=ROLE,
        model_id=model_id,
        port=PORT,
        budget=RestartBudget(5, 600.0, 10.0),
        phase=Ready(),
        since=W_START,
        pid=PID,
        alive=True,
        started_wall=W_START,
    )


POLICY = Policy(
    watchdog_enabled=True,
    restart_window_seconds=600.0,
    startup_grace_seconds=GRACE,
    ready_timeout_seconds=60.0,
    confirm=True,
)


def forge(directory: Path, requested_at: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    text = (
        f'{{"role": "{ROLE}", "model_id": "whisper-small", "port": {PORT}, '
        f'"reason": "5xx", "requested_at": {requested_at}, "detail": null}}'
    )
    (directory / f"{PORT}-{ROLE}-1.json").write_text(text)


def test_a_forged_file_never_gets_an_idle_healthy_whisper_backend_restarted(
    tmp_path: Path,
) -> None:
    """Whisper, image-generation and image-edit models get no canary; an idle healthy
    one shows no progress. Confirmation used to restart it on a forged file."""
    requests = tmp_path / "logs" / "watchdog-requests"
    wall = W_START + GRACE + 60  # well past the grace
    forge(requests, repr(wall - 1))
    lives = {ROLE: life()}
    [request] = take_requests(requests)
    actions = decide(lives, Requested(request), 5000.0, wall, POLICY)
    assert any(isinstance(a, Confirm) for a in actions)

    clock = FakeClock()
    http = FakeHttp(clock, {"/health": (200, b'{"status":"ok"}')})
    procs = FakeProcs(cpu=[3.0, 3.0])  # idle: serving nobody, healthy
    target = Target(PID, None, "whisper-small", "whisper", has_slots=False)
    evidence = asyncio.run(gather(target, http, procs, 10.0, clock))
    verdict = judge(evidence)
    actions = decide(
        lives,
        Judged(ROLE, verdict.restart, verdict.rule, verdict.reason, evidence.to_fields()),
        5010.0,
        wall + 10,
        POLICY,
    )
    stops = [a for a in actions if isinstance(a, Stop)]
    assert (verdict.rule, verdict.restart, stops) == ("no_canary_for_type_idle", False, [])


@pytest.mark.parametrize("stamp", ["NaN", "Infinity", "-Infinity"])
def test_a_forged_stamp_that_is_no_number_is_an_unreadable_file(tmp_path: Path, stamp: str) -> None:
    """``requested_at: NaN`` (Python's json reads it) compares false both ways: it was
    neither "in the future" nor "before start plus grace", so a file forged in the
    startup grace went to confirmation. Now it is unreadable, and discarded."""
    requests = tmp_path / "logs" / "watchdog-requests"
    forge(requests, stamp)
    assert take_requests(requests) == [f"{PORT}-{ROLE}-1.json"]
    assert list(requests.iterdir()) == []
