"""What the in-process tests of reloads share: publishing an applied registry as the
supervisor would (snapshot, then stamp), and waiting on a condition."""

from __future__ import annotations

from typing import Any

from slm_server.contracts.applied_registry import (
    RegistryStamp,
    Retiring,
    version_of,
    write_snapshot,
)
from tests.unit.router.inprocess import Router

CHAT = "/v1/chat/completions"
CHAT_ID = "org/chat-model"
APPLIED_AT = 1_700_000_000.0
APPLIED_FROM = "/srv/slm/models.yaml"
ANSWER = {
    "id": "x",
    "object": "chat.completion",
    "created": 1,
    "model": "m",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
}


def chat_body(model: str, stream: bool = False) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": stream}


def publish(
    router: Router, text: str, generation: int = 2, retiring: tuple[Retiring, ...] = ()
) -> RegistryStamp:
    """Publish ``text`` as the registry in force, as the supervisor does: its snapshot
    first, then its stamp (and the backends it retires) in the state file."""
    write_snapshot(router.settings.log_dir, text)
    stamp = RegistryStamp(version_of(text), generation, APPLIED_AT, APPLIED_FROM)
    router.states.registry = stamp
    router.states.retired = list(retiring)
    return stamp


def retiring(role: str, pid: int = 4242, reason: str = "removed") -> Retiring:
    assert reason in ("removed", "replaced")
    return Retiring(
        role,
        f"{role}-model",
        18001,
        pid,
        "removed" if reason == "removed" else "replaced",
        APPLIED_AT,
        APPLIED_AT + 30,
    )
