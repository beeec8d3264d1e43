"""Remote replicas in-process: a remote joined to a local entry with ``replica_of``
gets its own model name, none while the supervisor publishes it ejected, and with no
replica left the client gets 503 ``backend_ejected`` with ``Retry-After``."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from tests.unit.router.inprocess import Router, call, make_router
from tests.unit.router.test_proxy_replicas import CHAT, MODEL, answer

REMOTE = """  far:
    id: org/chat-model
    replica_of: chat
    backend: remote
    url: http://10.0.0.5:8080/v1
    remote_model: Qwen/Qwen3-8B
    default_timeout: 5
"""
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}


# Every test here runs twice: through plain ASGI and through the door (its fast path).
pytestmark = pytest.mark.usefixtures("via")


def mixed(tmp_path: Path) -> Router:
    router = make_router(tmp_path, answer, concurrency=1, queue=4, more=REMOTE)
    router.states.alive = True
    for spec in router.registry.models:
        router.supervisor.publish(spec, "ready")
    return router


def test_the_remote_replica_is_sent_its_own_model_name(tmp_path: Path) -> None:
    router = mixed(tmp_path)

    async def scenario() -> None:
        for _ in range(4):
            assert (await call(router.app, CHAT, BODY)).status == 200

    asyncio.run(scenario())
    by_role = {sent.spec.role: sent.json()["model"] for sent in router.transport.sent}
    assert by_role == {"chat": MODEL, "far": "Qwen/Qwen3-8B"}


def test_an_ejected_remote_gets_nothing_while_the_local_replica_serves(tmp_path: Path) -> None:
    router = mixed(tmp_path)
    far = next(s for s in router.registry.models if s.role == "far")
    router.supervisor.publish(far, "ejected", ejected_until=time.time() + 30)

    async def scenario() -> None:
        for _ in range(4):
            assert (await call(router.app, CHAT, BODY)).status == 200

        listed = (await call(router.app, "/v1/models", b"", method="GET")).json()["data"]
        replicas = listed[0]["status"]["replicas"]
        assert [(r["role"], r["backend"], r["port"], r["url"], r["state"]) for r in replicas] == [
            ("chat", "llamacpp", 18001, None, "ready"),
            ("far", "remote", None, "http://10.0.0.5:8080/v1", "ejected"),
        ]
        assert listed[0]["status"]["state"] == "ready"

    asyncio.run(scenario())
    assert {sent.spec.role for sent in router.transport.sent} == {"chat"}


def test_with_no_replica_left_the_client_gets_503_with_retry_after(tmp_path: Path) -> None:
    router = mixed(tmp_path)
    local, far = router.registry.models
    router.supervisor.publish(local, "abandoned", reason="budget spent")
    router.supervisor.publish(far, "ejected", ejected_until=time.time() + 30, reason="5xx")

    async def scenario() -> None:
        refused = await call(router.app, CHAT, BODY)
        assert refused.status == 503
        assert refused.json()["error"]["code"] == "backend_ejected"
        assert 28 <= float(refused.headers["retry-after"]) <= 30

    asyncio.run(scenario())
    assert router.transport.sent == []
