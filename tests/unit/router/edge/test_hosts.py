"""The Host allow-list against DNS rebinding: addresses and localhost pass, names only
when listed, anything else is a 421 before the app runs."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from starlette.types import Message, Receive, Scope, Send

from slm_server.router.call.exchange import Exchange, attach_exchange
from slm_server.router.edge.hosts import HostCheck, host_name


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def call(check: HostCheck, host: bytes | None) -> tuple[int, dict[str, Any] | None]:
    headers = [] if host is None else [(b"host", host)]
    scope: dict[str, Any] = {"type": "http", "path": "/v1/models", "headers": headers}
    attach_exchange(scope, Exchange(request_id="r", method="GET", path="/v1/models"))
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    asyncio.run(check(scope, receive, send))
    status = sent[0]["status"]
    body = sent[1]["body"]
    return status, (json.loads(body) if status != 200 else None)


@pytest.mark.parametrize(
    "host",
    [
        b"127.0.0.1", b"127.0.0.1:8000", b"localhost:8000", b"LOCALHOST", b"localhost.",
        b"app.localhost:8000", b"[::1]:8000", b"[::1]", b"10.1.2.3:8000", b"192.168.1.20",
        b"[fe80::1]:8000",
    ],
)  # fmt: skip
def test_addresses_and_localhost_pass(host: bytes) -> None:
    assert call(HostCheck(app, ()), host) == (200, None)


def test_a_request_without_host_passes() -> None:
    assert call(HostCheck(app, ()), None) == (200, None)


@pytest.mark.parametrize(
    "host", [b"evil.example", b"evil.example:8000", b"localhost.evil.example", b"127.0.0.1.nip.io"]
)
def test_other_names_are_421(host: bytes) -> None:
    status, body = call(HostCheck(app, ()), host)
    assert status == 421
    assert body is not None
    assert body["error"]["code"] == "host_not_allowed"
    assert body["error"]["type"] == "invalid_request_error"
    assert "SLM_ALLOWED_HOSTS" in body["error"]["message"]


def test_listed_names_and_the_configured_host_pass() -> None:
    check = HostCheck(app, ("gpu-box.lan", "Studio.Local.", "my-mac"))
    for host in (b"gpu-box.lan:8000", b"studio.local", b"MY-MAC"):
        assert call(check, host) == (200, None), host
    assert call(check, b"other.lan")[0] == 421


def test_a_star_turns_the_check_off() -> None:
    assert call(HostCheck(app, ("*",)), b"evil.example") == (200, None)


def test_a_hostile_host_is_shown_escaped() -> None:
    status, body = call(HostCheck(app, ()), b"evil\r\nX-Forged: 1")
    assert status == 421
    assert body is not None
    assert "\r" not in body["error"]["message"] and "\\r\\n" in body["error"]["message"]


@pytest.mark.parametrize(
    ("header", "name"),
    [("Example.COM:80", "example.com"), ("[::1]:8000", "::1"), ("::1", "::1"), ("a.b.", "a.b")],
)
def test_host_name(header: str, name: str) -> None:
    assert host_name(header) == name
