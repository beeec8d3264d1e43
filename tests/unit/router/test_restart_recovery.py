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
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

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
