"""The budget for request bodies in flight (router/intake/body_budget.py) and the JSON
content-type check under attack, on a real router in front of a real fake backend: bodies
declared and never sent, clients that leave mid-body, chunked bodies past the budget
or the size limit, refused bodies; every holding must come back."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import ExitStack

import httpx
import pytest

from tests import one_shot
from tests.fakes.control import FakeBackend
from tests.integration.attack_wire import Wire, request
from tests.processes import RunningRouter, StartRouter, poll
from tests.registry_entries import registry_entry

# Its module-scoped stack starts once: one worker runs the whole module.
pytestmark = pytest.mark.xdist_group("test_body_budget")

MODEL = "bodies-attack"
FAKE_ROLES = (MODEL,)
MIB = 1024 * 1024
MAX_BODY_MB = 6
# A 5 MiB body is charged about 20 MiB (itself and its parsed cost): one fits, not two.
BUDGET_MB = 24
HEADER_TIMEOUT = 1.0
IDLE_TIMEOUT = 1.5
BODY_STALL = 2.0  # the door's timer that frees a body declared and never sent


@pytest.fixture(scope="module")
def router_process(fake: FakeBackend, start_router: StartRouter) -> RunningRouter:
    entry = registry_entry(MODEL, fake.port, default_timeout=30, max_concurrency=4, max_queue=16)
    return start_router(
        {MODEL: entry},
        SLM_MAX_BODY_MB=str(MAX_BODY_MB),
        SLM_MAX_BODIES_IN_FLIGHT_MB=str(BUDGET_MB),
        SLM_HEADER_TIMEOUT_SECONDS=str(HEADER_TIMEOUT),
        SLM_IDLE_TIMEOUT_SECONDS=str(IDLE_TIMEOUT),
        SLM_BODY_STALL_SECONDS=str(BODY_STALL),
    )


def body_of(mib: float) -> bytes:
    text = "x" * max(1, int(mib * MIB) - 200)
    return json.dumps({"model": MODEL, "messages": [{"role": "user", "content": text}]}).encode()


SMALL = body_of(0)


def post(url: str, body: bytes, content_type: str | None = "application/json") -> httpx.Response:
    headers = {} if content_type is None else {"content-type": content_type}
    return one_shot.post(f"{url}/v1/chat/completions", content=body, headers=headers, timeout=60)


def budget_free(url: str, mib: float) -> bool:
    """Whether a body of ``mib`` fits the budget now (the fake answers it at once)."""
    return post(url, body_of(mib)).status_code == 200


def head_only(url: str, stack: ExitStack, declared: int) -> Wire:
    wire = stack.enter_context(Wire(url))
    full = request("POST", "/v1/chat/completions", b"x" * declared, content_type="application/json")
    wire.send(full[:-declared])  # the head, saying Content-Length, and none of the body
    return wire


def test_bodies_declared_and_never_sent_do_not_lock_out_other_clients(router: str) -> None:
    with ExitStack() as stack:
        for _ in range(BUDGET_MB // MAX_BODY_MB):  # declared: the whole budget
            head_only(router, stack, MAX_BODY_MB * MIB)
        # Nothing of either body ever arrives. Once the body stall timer has closed
        # both (with the header and idle timers long past), a small request from
        # someone else must get through.
        statuses: list[int] = []

        def small_served() -> bool:
            statuses.append(post(router, SMALL).status_code)
            return statuses[-1] == 200

        try:
            timers = HEADER_TIMEOUT + IDLE_TIMEOUT + BODY_STALL
            poll(small_served, 4 * timers, "a small POST to pass")
        finally:
            assert statuses, "no request was tried"
        assert statuses[-1] == 200


def test_a_client_that_leaves_mid_body_gives_its_holding_back(router: str) -> None:
    with Wire(router) as wire:
        body = body_of(5)
        full = request("POST", "/v1/chat/completions", body, content_type="application/json")
        wire.send(full[: len(full) - len(body) // 2])  # head and half the body
        # While it is held, 5 MiB more do not fit...
        assert post(router, body_of(5)).status_code == 503
    # ... and once the client has gone they do.
    poll(lambda: budget_free(router, 5), 10, "the half-sent body's holding to come back")


def test_a_chunked_body_past_the_size_limit_is_413_and_gives_its_holding_back(
    router: str,
) -> None:
    def chunks() -> Iterator[bytes]:
        for _ in range(MAX_BODY_MB + 2):
            yield b" " * MIB

    response = one_shot.post(
        f"{router}/v1/chat/completions",
        content=chunks(),
        headers={"content-type": "application/json"},
        timeout=60,
    )
    assert response.status_code in (413, 503)
    assert response.json()["error"]["code"] in ("request_too_large", "bodies_over_budget")
    poll(lambda: budget_free(router, 5), 10, "the budget to be given back")


def test_a_chunked_body_past_the_budget_is_503_as_its_bytes_arrive(
    router: str, fake: FakeBackend
) -> None:
    fake.script(delay_seconds=3)
    first: list[int] = []
    holder = threading.Thread(target=lambda: first.append(post(router, body_of(5)).status_code))
    holder.start()
    try:
        fake.wait_for(lambda reqs: len(reqs) == 1, timeout=20)

        def chunks() -> Iterator[bytes]:
            for _ in range(5):
                yield b" " * MIB

        response = one_shot.post(
            f"{router}/v1/chat/completions",
            content=chunks(),
            headers={"content-type": "application/json"},
            timeout=60,
        )
        assert response.status_code == 503
        assert response.json()["error"]["code"] == "bodies_over_budget"
        assert response.headers["retry-after"] == "1"
    finally:
        holder.join(30)
    assert first == [200]
    fake.script()
    poll(lambda: budget_free(router, 5), 10, "both holdings to come back")


@pytest.mark.parametrize(
    "bad",
    [b"{" * 5 * MIB, b"[1]" + b" " * 5 * MIB, b'{"model": "nope", "x": "' + b"y" * 5 * MIB + b'"}'],
    ids=["invalid-json", "not-an-object", "unknown-model"],
)
def test_refused_large_bodies_give_their_holdings_back(router: str, bad: bytes) -> None:
    for _ in range(3):  # 3 x 5 MiB charged 20 > the 24 MiB budget if anything stayed held
        response = post(router, bad)
        # 5 MiB of "{" would cost far more than the budget parsed: 413 before parsing.
        assert response.status_code in (400, 404, 413), response.text[:200]
    assert budget_free(router, 5)


def test_a_declared_length_over_the_size_limit_is_413_without_holding(router: str) -> None:
    with Wire(router) as wire:
        declared = (MAX_BODY_MB + 1) * MIB
        wire.send(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % declared
        )
        assert wire.response().status == 413
        assert budget_free(router, 5)  # while that connection is still open


# -- content types ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "content_type",
    [
        "APPLICATION/JSON ;charset=x",
        "application/json; charset=utf-8",
        "application/json-patch+json",
        "Application/Vnd.Api+JSON",
    ],
)
def test_json_content_types_pass(router: str, content_type: str | None) -> None:
    assert post(router, SMALL, content_type).status_code == 200


@pytest.mark.parametrize(
    "content_type",
    [
        None,  # a Blob in a no-cors fetch: no type at all
        "text/plain",
        "text/plain; charset=utf-8",
        "text/plain;application/json",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/jsonp",
        "application/json+x",
        "text/json",
        "",
    ],
)
def test_other_content_types_are_415_and_never_reach_the_backend(
    router: str, fake: FakeBackend, content_type: str | None
) -> None:
    response = post(router, SMALL, content_type)
    assert response.status_code == 415
    assert response.json()["error"]["code"] == "unsupported_media_type"
    assert fake.requests() == []
