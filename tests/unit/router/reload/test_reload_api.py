"""``POST /v1/config/reload`` in-process: the supervisor's answer relayed (200 with
what changed, or the refusal with every problem), and once it answers ok the router
routes by the new registry before it answers, so the next request for an added model
is served."""

from __future__ import annotations

import asyncio
from pathlib import Path

from slm_server.contracts.applied_registry import version_of
from slm_server.contracts.commands import Command, Reply
from tests.unit.router.inprocess import (
    FakeResponse,
    Router,
    Sent,
    call,
    entry_text,
    make_router,
    registry_text,
    run,
    serving,
    whole,
)
from tests.unit.router.reload.reloading import ANSWER, CHAT, chat_body, publish

RELOAD = "/v1/config/reload"
WITH_EXTRA = registry_text(more=entry_text("extra", 18002))


async def answer_whole(_sent: Sent) -> FakeResponse:
    return whole(ANSWER)


def supervised(tmp_path: Path, **env: str) -> Router:
    router = make_router(tmp_path, answer_whole, env=env, follow_seconds=3600)
    router.states.alive = True
    return router


def applied(router: Router, text: str, generation: int = 2, delay: float = 0.0) -> Reply:
    """What the supervisor answers for a reload to ``text`` that it publishes after
    ``delay`` seconds."""
    if delay:
        asyncio.get_running_loop().call_later(delay, publish, router, text, generation)
    else:
        publish(router, text, generation)
    return Reply(
        True,
        version=version_of(text),
        generation=generation,
        added=("extra",),
        removed=(),
        replaced=(),
        unchanged=("chat",),
    )


def test_an_applied_reload_is_answered_once_the_router_routes_by_it(tmp_path: Path) -> None:
    router = supervised(tmp_path)
    # Published a moment after the answer: the router waits for it before answering.
    router.supervisor.on_reload = lambda: applied(router, WITH_EXTRA, delay=0.1)

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, RELOAD, b"")
            assert got.status == 200, got.body
            assert got.json() == {
                "object": "registry.reload",
                "version": version_of(WITH_EXTRA),
                "generation": 2,
                "added": ["extra"],
                "removed": [],
                "replaced": [],
                "unchanged": ["chat"],
            }
            assert router.supervisor.sent("reload") == [Command("reload")]
            served = await call(router.app, CHAT, chat_body("extra-model"))
            assert served.status == 200, served.body

    run(scenario())


def test_an_empty_object_is_a_body_like_none(tmp_path: Path) -> None:
    router = supervised(tmp_path)
    router.supervisor.on_reload = lambda: applied(router, WITH_EXTRA)

    async def scenario() -> None:
        async with serving(router):
            assert (await call(router.app, RELOAD, {})).status == 200

    run(scenario())


def test_an_invalid_registry_is_a_400_naming_every_problem(tmp_path: Path) -> None:
    router = supervised(tmp_path)
    problems = (
        "models.yaml: 'a' (id 'x'): port: port 8501 is also used by 'b'",
        "models.yaml: 'b' (id 'y'): colour: unknown field",
    )
    router.supervisor.on_reload = lambda: Reply(
        False, error="2 problems", problems=problems, refused="invalid"
    )

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, RELOAD, b"")
            assert got.status == 400
            assert got.json() == {
                "error": {
                    "message": "; ".join(problems),
                    "type": "invalid_request_error",
                    "param": None,
                    "code": "registry_invalid",
                    "problems": list(problems),
                }
            }

    run(scenario())


def test_a_registry_that_does_not_fit_the_machine_is_a_409(tmp_path: Path) -> None:
    router = supervised(tmp_path)
    problem = "models.yaml: 'a' (id 'x'): port 8501 is held by a process that is not ours"
    router.supervisor.on_reload = lambda: Reply(False, problems=(problem,), refused="conflict")

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, RELOAD, b"")
            assert got.status == 409
            assert got.json()["error"] == {
                "message": problem,
                "type": "invalid_request_error",
                "param": None,
                "code": "registry_conflict",
                "problems": [problem],
            }

    run(scenario())


def test_a_supervisor_shutting_down_is_a_503(tmp_path: Path) -> None:
    router = supervised(tmp_path)
    router.supervisor.on_reload = lambda: Reply(
        False, error="the supervisor is stopping", refused="stopping"
    )

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, RELOAD, b"")
            assert got.status == 503
            assert got.json()["error"]["code"] == "supervisor_stopping"
            assert got.json()["error"]["message"] == "the supervisor is stopping"

    run(scenario())


def test_without_a_supervisor_it_is_a_503_to_retry(tmp_path: Path) -> None:
    router = supervised(tmp_path)
    router.supervisor.unreachable = True

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, RELOAD, b"")
            assert got.status == 503
            assert got.json()["error"]["code"] == "supervisor_not_running"
            assert got.headers["retry-after"] == "5"

    run(scenario())


def test_the_api_keys_apply(tmp_path: Path) -> None:
    router = supervised(tmp_path, SLM_API_KEYS="secret")
    router.supervisor.on_reload = lambda: applied(router, WITH_EXTRA)

    async def scenario() -> None:
        async with serving(router):
            assert (await call(router.app, RELOAD, b"")).status == 401
            assert router.supervisor.sent("reload") == []
            keyed = {"authorization": "Bearer secret"}
            assert (await call(router.app, RELOAD, b"", headers=keyed)).status == 200

    run(scenario())
