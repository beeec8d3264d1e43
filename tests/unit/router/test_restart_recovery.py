"""Through a backend's restart the client sees a delay, not an error: a request that
comes while its backend is starting or restarting waits for it within its deadline,
and one the backend stranded (nothing of its answer came, and the process it was sent
to is gone) is sent again, once, to the new process. Never a retry while the process
it was sent to runs, nor without a supervisor to say it is gone.

The router in-process on a scripted upstream and a settable state file, through plain
ASGI and through the door.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Literal

import pytest

from slm_server.errors import BackendProtocolError
from tests.unit.router.inprocess import (
    FakeResponse,
    Router,
    Script,
    Sent,
    backend_state,
    call,
    make_router,
    until,
    whole,
)
from tests.unit.router.test_proxy import ANSWER, CHAT, chat, serving

pytestmark = pytest.mark.usefixtures("via")


def run(scenario: Any) -> None:
    asyncio.run(asyncio.wait_for(scenario, 20))


def gone_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def publish(router: Router, state: str, pid: int | None = None, **fields: Any) -> None:
    spec = router.spec
    router.states.states[(spec.role, spec.entry.port)] = backend_state(
        spec, state, **({"pid": pid} if pid is not None else {}), **fields
    )
    router.states.alive = True


async def answering(_sent: Sent) -> FakeResponse:
    return whole(ANSWER)


@pytest.mark.parametrize("state", ["restarting", "starting"])
def test_a_request_for_a_restarting_backend_waits_and_is_answered(
    tmp_path: Path, state: str
) -> None:
    router = make_router(tmp_path, answering, timeout=5.0)
    publish(router, state)

    async def scenario() -> None:
        async with serving(router):
            task = asyncio.ensure_future(call(router.app, CHAT, chat()))
            await until(lambda: router.gate_active() == 1, "the request admitted")
            assert router.transport.sent == []  # it waits, holding its slot
            assert not task.done()
            publish(router, "ready", pid=4343)
            got = await task
            assert got.status == 200
            assert got.json() == ANSWER
            assert len(router.transport.sent) == 1

    run(scenario())


def test_a_restart_longer_than_the_deadline_is_503_with_retry_after(tmp_path: Path) -> None:
    router = make_router(tmp_path, answering, timeout=0.3)
    publish(router, "restarting", reason="stall")

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, CHAT, chat())
            assert got.status == 503
            error = got.json()["error"]
            assert error["code"] == "backend_restarting"
            assert "not ready within the request's deadline" in error["message"]
            assert got.headers["retry-after"] == "5"
            assert router.transport.sent == []
            assert router.events.named("backend_failure") == []

    run(scenario())


def test_a_backend_given_up_while_a_request_waits_is_refused_with_why(tmp_path: Path) -> None:
    router = make_router(tmp_path, answering, timeout=5.0)
    publish(router, "restarting")

    async def scenario() -> None:
        async with serving(router):
            task = asyncio.ensure_future(call(router.app, CHAT, chat()))
            await until(lambda: router.gate_active() == 1, "the request admitted")
            publish(router, "abandoned", reason="restart budget spent")
            got = await task
            assert got.status == 503
            assert got.json()["error"]["code"] == "backend_abandoned"
            assert router.transport.sent == []

    run(scenario())


def stranding_once(router_box: list[Router], new_pid: int) -> Script:
    """A backend whose process dies under the first request (the connection breaks
    with nothing of the answer): the supervisor publishes it restarting, then ready with
    a new process, which answers."""

    async def script(sent: Sent) -> FakeResponse:
        router = router_box[0]
        if len(router.transport.sent) == 1:
            publish(router, "restarting", reason="stall")
            asyncio.get_running_loop().call_later(0.1, publish, router, "ready", new_pid)
            raise BackendProtocolError("The backend broke the connection")
        return whole(ANSWER)

    return script


def test_a_stranded_request_is_sent_again_to_the_new_process(tmp_path: Path) -> None:
    box: list[Router] = []
    router = make_router(tmp_path, stranding_once(box, new_pid=4343), timeout=5.0)
    box.append(router)
    publish(router, "ready", pid=gone_pid())

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, CHAT, chat())
            assert got.status == 200
            assert got.json() == ANSWER
            first, again = router.transport.sent
            assert again.body == first.body
            [retried] = router.events.named("request_retried")
            assert retried["reason"] == "bad_backend_response"
            assert retried["waited_seconds"] >= 0.1
            assert router.gate_active() == 0

    run(scenario())


def test_a_stream_stranded_before_its_head_is_sent_again(tmp_path: Path) -> None:
    box: list[Router] = []
    router = make_router(tmp_path, stranding_once(box, new_pid=4343), timeout=5.0)
    box.append(router)
    publish(router, "ready", pid=gone_pid())
    chunks = [b'data: {"choices":[{"delta":{"content":"hi"},"index":0}]}\n\n', b"data: [DONE]\n\n"]

    async def stream_after(sent: Sent) -> FakeResponse:
        if len(router.transport.sent) == 1:
            return await stranding_once(box, 4343)(sent)
        return FakeResponse(200, {"content-type": "text/event-stream"}, list(chunks))

    router.transport.script = stream_after

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, CHAT, chat(stream=True))
            assert got.status == 200
            assert got.events()[-1] == "[DONE]"
            assert len(router.transport.sent) == 2

    run(scenario())


def test_no_retry_while_the_process_it_was_sent_to_runs(tmp_path: Path) -> None:
    async def broken(_sent: Sent) -> FakeResponse:
        raise BackendProtocolError("The backend broke the connection")

    router = make_router(tmp_path, broken, timeout=5.0)
    publish(router, "ready", pid=os.getpid())  # alive: the connection broke on its own

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, CHAT, chat())
            assert got.status == 502
            assert len(router.transport.sent) == 1
            assert router.events.named("request_retried") == []

    run(scenario())


def test_no_retry_without_a_supervisor(tmp_path: Path) -> None:
    async def broken(_sent: Sent) -> FakeResponse:
        raise BackendProtocolError("The backend broke the connection")

    router = make_router(tmp_path, broken, timeout=5.0)  # nothing published

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, CHAT, chat())
            assert got.status == 502
            assert len(router.transport.sent) == 1

    run(scenario())


def test_a_request_is_sent_again_only_once(tmp_path: Path) -> None:
    """The new process strands it too: the error, not a third try."""
    box: list[Router] = []
    pids = iter([gone_pid(), gone_pid()])

    async def always_broken(_sent: Sent) -> FakeResponse:
        router = box[0]
        publish(router, "restarting")
        asyncio.get_running_loop().call_later(0.05, publish, router, "ready", next(pids, 4343))
        raise BackendProtocolError("The backend broke the connection")

    router = make_router(tmp_path, always_broken, timeout=5.0)
    box.append(router)
    publish(router, "ready", pid=gone_pid())

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, CHAT, chat())
            assert got.status == 502
            assert len(router.transport.sent) == 2
            assert len(router.events.named("request_retried")) == 1

    run(scenario())


def test_a_stranded_request_whose_backend_is_not_back_in_time_is_504(tmp_path: Path) -> None:
    box: list[Router] = []

    async def dies(_sent: Sent) -> FakeResponse:
        publish(box[0], "restarting")
        raise BackendProtocolError("The backend broke the connection")

    router = make_router(tmp_path, dies, timeout=0.4)
    box.append(router)
    publish(router, "ready", pid=gone_pid())

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, CHAT, chat())
            assert got.status == 504
            error = got.json()["error"]
            assert error["code"] == "deadline_exceeded"
            assert "was not back within the request's deadline" in error["message"]
            assert len(router.transport.sent) == 1

    run(scenario())


# Broken after the head, before the answer: a stream whose head (and the engine's hidden
# progress reports) came, or a whole answer being gathered, is stranded all the same.

STREAM_HEAD = {"content-type": "text/event-stream"}


def report(processed: int) -> bytes:
    chunk = {
        "choices": [{"finish_reason": None, "index": 0, "delta": {"role": "assistant"}}],
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "org/chat-model",
        "prompt_progress": {"total": 9, "cache": 0, "processed": processed, "time_ms": 1.0},
    }
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


def token(text: str, finish: str | None = None) -> dict[str, Any]:
    return {
        "choices": [{"finish_reason": finish, "index": 0, "delta": {"content": text}}],
        "id": "chatcmpl-2",
        "object": "chat.completion.chunk",
        "created": 2,
        "model": "org/chat-model",
    }


USAGE = {
    "choices": [],
    "id": "chatcmpl-2",
    "object": "chat.completion.chunk",
    "created": 2,
    "model": "org/chat-model",
    "usage": {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11},
}
SECOND = [
    report(0),
    *(
        b"data: " + json.dumps(c).encode() + b"\n\n"
        for c in (token("Hi"), token("!", "stop"), USAGE)
    ),
    b"data: [DONE]\n\n",
]


class Gone(asyncio.Event):
    """A step of the first answer: its process is gone here (the supervisor publishes
    the backend restarting, then ready with a new process a moment later); the break
    follows."""

    def __init__(self, router: Router) -> None:
        super().__init__()
        self.router = router

    async def wait(self) -> Literal[True]:
        publish(self.router, "restarting", reason="stall", kind="llama-server")
        asyncio.get_running_loop().call_later(0.1, publish, self.router, "ready", 4343)
        return True


BREAK = object()  # where the first answer breaks, its process gone


def llama_stranding(tmp_path: Path, first: list[Any], timeout: float = 5.0) -> Router:
    """A native llama-server whose first answer plays ``first`` and breaks at
    :data:`BREAK` (its process gone, then back); the request sent again gets
    :data:`SECOND`."""
    box: list[Router] = []

    async def script(_sent: Sent) -> FakeResponse:
        router = box[0]
        if len(router.transport.sent) == 1:
            steps: list[Any] = []
            for step in first:
                if step is BREAK:
                    steps += [
                        Gone(router),
                        BackendProtocolError("The backend broke the connection"),
                    ]
                else:
                    steps.append(step)
            return FakeResponse(200, STREAM_HEAD, steps)
        return FakeResponse(200, STREAM_HEAD, list(SECOND))

    router = make_router(tmp_path, script, timeout=timeout)
    box.append(router)
    publish(router, "ready", pid=gone_pid(), kind="llama-server")
    return router


def test_a_stream_broken_while_its_prompt_was_read_goes_on_from_the_new_process(
    tmp_path: Path,
) -> None:
    router = llama_stranding(tmp_path, [report(0), report(5), BREAK])

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, CHAT, chat(stream=True))
            assert got.status == 200
            assert got.events() == [token("Hi"), token("!", "stop"), "[DONE]"]
            first, again = router.transport.sent
            assert again.body == first.body
            [retried] = router.events.named("request_retried")
            assert retried["reason"] == "bad_backend_response"
            assert router.gate_active() == 0

    run(scenario())


def test_a_messages_stream_broken_before_its_first_token_goes_on(tmp_path: Path) -> None:
    router = llama_stranding(tmp_path, [report(0), BREAK])
    body = {
        "model": "org/chat-model",
        "max_tokens": 16,
        "stream": True,
        "messages": [{"role": "user", "content": "hi"}],
    }

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, "/v1/messages", body)
            text = got.body.decode()
            assert text.count("event: message_start") == 1
            assert "event: error" not in text
            assert '"text":"Hi"' in text.replace(" ", "") and "message_stop" in text
            assert len(router.transport.sent) == 2

    run(scenario())


def test_a_stream_whose_answer_had_begun_is_never_sent_again(tmp_path: Path) -> None:
    began = b"data: " + json.dumps(token("Hel")).encode() + b"\n\n"
    router = llama_stranding(tmp_path, [report(0), began, BREAK])

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, CHAT, chat(stream=True))
            events = got.events()
            assert events[0] == token("Hel")
            assert "error" in events[-1]
            assert len(router.transport.sent) == 1
            assert router.events.named("request_retried") == []

    run(scenario())


def test_a_whole_answer_broken_while_gathered_is_gathered_again(tmp_path: Path) -> None:
    began = b"data: " + json.dumps(token("Hel")).encode() + b"\n\n"
    router = llama_stranding(tmp_path, [report(0), began, BREAK])

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, CHAT, chat())
            assert got.status == 200
            assert got.json()["choices"][0]["message"]["content"] == "Hi!"
            assert len(router.transport.sent) == 2
            assert len(router.events.named("request_retried")) == 1

    run(scenario())


def test_a_process_that_dies_just_after_its_connection_broke_strands_the_request(
    tmp_path: Path,
) -> None:
    """Killed, a process closes its sockets a moment before it is gone: the broken
    connection comes first, and the request is still sent again."""
    dying = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    box: list[Router] = []

    def die() -> None:
        dying.kill()
        dying.wait()
        publish(box[0], "restarting", reason="stall")
        asyncio.get_running_loop().call_later(0.05, publish, box[0], "ready", 4343)

    async def script(_sent: Sent) -> FakeResponse:
        if len(box[0].transport.sent) == 1:
            asyncio.get_running_loop().call_later(0.2, die)
            raise BackendProtocolError("The backend broke the connection")
        return whole(ANSWER)

    router = make_router(tmp_path, script, timeout=5.0)
    box.append(router)
    publish(router, "ready", pid=dying.pid)

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, CHAT, chat())
            assert got.status == 200
            assert len(router.transport.sent) == 2
            [retried] = router.events.named("request_retried")
            assert retried["waited_seconds"] >= 0.2

    try:
        run(scenario())
    finally:
        dying.kill()
        dying.wait()


def test_a_whole_answer_gathered_again_keeps_its_slot_meanwhile(tmp_path: Path) -> None:
    """One slot: while the broken request waits to be sent again, the one queued behind
    it stays in the queue (let in, the backend would see two at once)."""
    began = b"data: " + json.dumps(token("Hel")).encode() + b"\n\n"
    router = llama_stranding(tmp_path, [report(0), began, BREAK])
    gate = router.deps.gates[router.spec.role]
    gate.limit = 1

    async def scenario() -> None:
        async with serving(router):
            first = asyncio.ensure_future(call(router.app, CHAT, chat()))
            await until(lambda: len(router.transport.responses) == 1, "the first sent")
            second = asyncio.ensure_future(call(router.app, CHAT, chat()))
            await until(lambda: gate.queued == 1, "the second queued")
            broken = router.transport.responses[0]
            await until(broken.closed.is_set, "the first answer broken")
            assert gate.queued == 1 and gate.active == 1  # the broken one keeps its slot
            assert (await first).status == 200
            assert (await second).status == 200
            assert len(router.events.named("request_retried")) == 1

    run(scenario())


def test_a_client_that_leaves_after_its_stream_was_sent_again_ends_it(tmp_path: Path) -> None:
    hang = asyncio.Event()
    router = llama_stranding(tmp_path, [report(0), BREAK], timeout=60.0)  # no deadline cut
    script = router.transport.script

    async def hanging(sent: Sent) -> FakeResponse:
        if len(router.transport.sent) == 2:
            return FakeResponse(200, STREAM_HEAD, [report(0), hang])
        return await script(sent)

    router.transport.script = hanging

    async def scenario() -> None:
        async with serving(router):
            leave = asyncio.Event()
            task = asyncio.ensure_future(call(router.app, CHAT, chat(stream=True), leave=leave))
            await until(lambda: len(router.transport.responses) == 2, "sent again")
            again = router.transport.responses[1]
            await until(lambda: again.steps == [], "the report read, the hang waited on")
            leave.set()
            await task
            await until(again.closed.is_set, "the backend's response closed")
            await until(lambda: router.gate_active() == 0, "the slot freed")

    run(scenario())


def test_a_stream_whose_first_event_the_client_saw_is_never_sent_again(tmp_path: Path) -> None:
    """Whatever the first event is (here a comment), once the client has it the answer
    has begun."""
    router = llama_stranding(tmp_path, [b": hello\n\n", BREAK])

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, CHAT, chat(stream=True))
            assert got.body.startswith(b": hello\n\n")
            assert "error" in got.events()[-1]
            assert len(router.transport.sent) == 1

    run(scenario())


def test_a_partial_event_of_the_broken_stream_is_dropped(tmp_path: Path) -> None:
    router = llama_stranding(tmp_path, [report(0), b'data: {"choices": [{"del', BREAK])

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, CHAT, chat(stream=True))
            assert got.events() == [token("Hi"), token("!", "stop"), "[DONE]"]
            assert b"prompt_progress" not in got.body

    run(scenario())
