"""The Host allow-list (router/edge/hosts.py) under attack on a real router, from raw sockets:
name variants, two Host headers, absolute-form request targets."""

from __future__ import annotations

import pytest

from tests.integration.attack_wire import Wire
from tests.processes import RunningRouter, StartRouter, free_port
from tests.registry_entries import registry_entry

# Its module-scoped stack starts once: one worker runs the whole module.
pytestmark = pytest.mark.xdist_group("test_hosts")


@pytest.fixture(scope="module")
def router_process(start_router: StartRouter) -> RunningRouter:
    entry = registry_entry("hosts", free_port())  # no backend: only the door is tested
    return start_router({"hosts": entry}, SLM_ALLOWED_HOSTS="gpu-box.lan")


def status(url: str, raw: bytes) -> int:
    with Wire(url) as wire:
        wire.send(raw)
        return wire.response().status


def get(host: bytes, target: bytes = b"/health") -> bytes:
    return b"GET " + target + b" HTTP/1.1\r\nHost: " + host + b"\r\n\r\n"


@pytest.mark.parametrize(
    "host",
    [
        b"localhost.evil.example", b"localhost.evil.example.", b"evil.example.",
        b"EVIL.EXAMPLE:8000", b"evil.localhost.evil.example", b"[evil.example]:8000",
        b"evil.example:8000:1", b"localhost@evil.example", b"gpu-box.lan.evil.example",
        b"evil-gpu-box.lan", b"127.0.0.1.nip.io", b"0x7f000001", b"2130706433", b"",
    ],
)  # fmt: skip
def test_names_that_only_look_local_are_421_on_every_path(router: str, host: bytes) -> None:
    for path in (b"/health", b"/metrics", b"/v1/models"):
        assert status(router, get(host, path)) == 421, (host, path)


@pytest.mark.parametrize(
    "host",
    [
        b"LOCALHOST", b"localhost.:1", b"Foo.LocalHost", b"GPU-BOX.LAN.", b"[::1]:8000",
        b"[fe80::1%25eth0]:8000", b"[::ffff:127.0.0.1]", b"127.0.0.1",
    ],
)  # fmt: skip
def test_local_names_and_addresses_in_any_spelling_pass(router: str, host: bytes) -> None:
    assert status(router, get(host)) == 200


def test_a_second_host_header_cannot_smuggle_a_bad_name_behind_a_good_one_reversed(
    router: str,
) -> None:
    raw = b"GET /health HTTP/1.1\r\nHost: evil.example\r\nHost: localhost\r\n\r\n"
    assert status(router, raw) in (400, 421)


def test_two_host_headers_are_refused(router: str) -> None:
    raw = b"GET /health HTTP/1.1\r\nHost: localhost\r\nHost: evil.example\r\n\r\n"
    assert status(router, raw) in (400, 421)


def test_an_absolute_form_target_naming_another_host_is_refused(router: str) -> None:
    raw = get(b"127.0.0.1", b"http://evil.example/health")
    assert status(router, raw) in (400, 421)
