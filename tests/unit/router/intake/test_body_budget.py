"""The budget for request bodies in flight (router/intake/body_budget.py) and
Reception.body charging it, with the attacks on it: chunked bodies, bodies that stop
halfway, declared lengths and the budget's exact edge; holdings that must all come back
whatever ends the request."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any, cast

import pytest
from starlette.requests import ClientDisconnect, Request
from starlette.types import Message

from slm_server.errors import BodiesOverBudget, PayloadTooLarge
from slm_server.router.intake.body_budget import BodyBudget, Held
from slm_server.router.intake.reception import Reception

MIB = 1024 * 1024


def test_holdings_add_up_and_are_given_back() -> None:
    budget = BodyBudget(100)
    first, second = budget.hold(), budget.hold()
    first.take(60)
    second.take(30)
    second.take(10)
    assert budget.used == 100
    with pytest.raises(BodiesOverBudget) as refused:
        budget.hold().take(1)
    assert refused.value.status == 503
    assert refused.value.code == "bodies_over_budget"
    assert refused.value.headers() == {"Retry-After": "1"}
    first.release()
    assert budget.used == 40
    first.release()  # twice is harmless
    assert budget.used == 40
    second.release()
    assert budget.used == 0


def test_a_refused_take_holds_nothing() -> None:
    budget = BodyBudget(10)
    held = budget.hold()
    with pytest.raises(BodiesOverBudget):
        held.take(11)
    assert (budget.used, held.size) == (0, 0)


def make_request(parts: list[bytes], declared: int | None, disconnect: bool = False) -> Request:
    headers = [] if declared is None else [(b"content-length", str(declared).encode())]
    scope: dict[str, Any] = {"type": "http", "method": "POST", "path": "/", "headers": headers}
    messages: Iterator[Message] = iter(
        [{"type": "http.request", "body": p, "more_body": True} for p in parts]
        + [
            {"type": "http.disconnect"}
            if disconnect
            else {"type": "http.request", "body": b"", "more_body": False}
        ]
    )

    async def receive() -> Message:
        return next(messages)

    return Request(scope, receive)


def read_body(max_body: int, held: Held, request: Request) -> bytes:
    reception = cast(Reception, SimpleNamespace(max_body=max_body))
    return asyncio.run(Reception.body(reception, request, held))


def test_a_chunked_body_is_charged_as_it_arrives_and_refused_at_the_edge() -> None:
    budget = BodyBudget(2 * MIB + MIB // 2)
    held = budget.hold()
    with pytest.raises(BodiesOverBudget):
        read_body(10 * MIB, held, make_request([b"x" * MIB] * 3, None))
    assert held.size == 2 * MIB  # what had arrived; the caller's release gives it back
    held.release()
    assert budget.used == 0


def test_a_body_exactly_filling_the_budget_passes() -> None:
    budget = BodyBudget(3 * MIB)
    held = budget.hold()
    assert len(read_body(10 * MIB, held, make_request([b"x" * MIB] * 3, None))) == 3 * MIB
    assert budget.used == 3 * MIB
    with pytest.raises(BodiesOverBudget):
        budget.hold().take(1)
    held.release()


def test_a_declared_body_is_charged_once_not_again_as_it_arrives() -> None:
    budget = BodyBudget(3 * MIB)
    held = budget.hold()
    read_body(10 * MIB, held, make_request([b"x" * MIB] * 3, 3 * MIB))
    assert budget.used == 3 * MIB


def test_a_declared_body_over_the_size_limit_is_413_before_any_charge() -> None:
    budget = BodyBudget(100 * MIB)
    held = budget.hold()
    with pytest.raises(PayloadTooLarge):
        read_body(MIB, held, make_request([], MIB + 1))
    assert budget.used == 0


def test_a_chunked_body_over_the_size_limit_is_413_and_holds_only_what_came() -> None:
    budget = BodyBudget(100 * MIB)
    held = budget.hold()
    with pytest.raises(PayloadTooLarge):
        read_body(2 * MIB, held, make_request([b"x" * MIB] * 5, None))
    assert held.size <= 2 * MIB
    held.release()
    assert budget.used == 0


def test_a_client_that_leaves_mid_body_raises_and_its_holding_is_releasable() -> None:
    budget = BodyBudget(10 * MIB)
    held = budget.hold()
    with pytest.raises(ClientDisconnect):
        read_body(10 * MIB, held, make_request([b"x" * MIB], 5 * MIB, disconnect=True))
    assert budget.used == 5 * MIB  # charged on its Content-Length
    held.release()
    assert budget.used == 0


def test_cancelled_holders_all_give_back() -> None:
    budget = BodyBudget(100)

    async def holder(started: asyncio.Event) -> None:
        held = budget.hold()
        try:
            held.take(10)
            started.set()
            await asyncio.Event().wait()  # until cancelled
        finally:
            held.release()

    async def main() -> None:
        events = [asyncio.Event() for _ in range(10)]
        tasks = [asyncio.create_task(holder(e)) for e in events]
        for event in events:
            await event.wait()
        assert budget.used == 100
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(main())
    assert budget.used == 0
