"""A request's body in its own shape is serialised anew only when the router changed its
fields, and only when asked for: the paths that send a translation (Messages, Responses
on a backend without its own route) never pay for an agent's 90 KB body."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from slm_server.registry.schema import ModelSpec
from slm_server.router.intake import reception
from slm_server.router.intake.reception import OFF_LOOP_BYTES, Intake
from slm_server.router.intake.strict_json import dumps_body


def intake(payload: dict[str, Any], rewritten: bool) -> Intake:
    raw = json.dumps(payload).encode()
    spec: ModelSpec = None  # type: ignore[assignment]  # not read by body()
    return Intake(spec, payload, raw, hidden_usage=False, rewritten=rewritten)


def test_an_unchanged_request_goes_as_it_came() -> None:
    taken = intake({"model": "m", "messages": []}, rewritten=False)
    taken.payload["model"] = "changed after the fact"
    assert asyncio.run(taken.body()) is taken.raw


@pytest.mark.parametrize("size", [10, OFF_LOOP_BYTES + 10])
def test_a_changed_request_is_serialised_when_asked_small_or_large(size: int) -> None:
    taken = intake({"model": "alias", "pad": "x" * size}, rewritten=True)
    taken.payload["model"] = "the-id"
    assert json.loads(asyncio.run(taken.body())) == {"model": "the-id", "pad": "x" * size}


def test_nothing_is_serialised_until_a_path_asks(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    def counted(payload: dict[str, Any]) -> bytes:
        calls.append(1)
        return dumps_body(payload)

    monkeypatch.setattr(reception, "dumps_body", counted)
    taken = intake({"model": "m"}, rewritten=True)
    assert calls == []
    asyncio.run(taken.body())
    assert calls == [1]
