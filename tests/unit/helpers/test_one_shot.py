"""Tests and benchmarks send their one-off requests through :mod:`tests.one_shot`, not
httpx's module-level helpers, each of which builds a client and an SSL context (about
30 ms of CPU) for a single request."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable
from typing import Any

import httpx

from tests import one_shot
from tests.processes import ROOT

HELPER_CALL = re.compile(r"\bhttpx\.(get|post|put|delete|patch|head|options|request|stream)\(")


def test_no_test_or_benchmark_calls_httpx_s_one_request_helpers() -> None:
    sources = [*(ROOT / "tests").rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py")]
    assert len(sources) > 100
    callers = [
        f"{path.relative_to(ROOT)}:{text[: found.start()].count(chr(10)) + 1}"
        for path in sources
        for text in [path.read_text()]
        for found in HELPER_CALL.finditer(text)
        if path.name != "test_one_shot.py"
    ]
    assert callers == []


def test_a_request_costs_no_ssl_context() -> None:
    """The shared client's requests cost a fraction of a millisecond of CPU where
    httpx.get costs tens (measured on a port nobody listens on, 20 of each)."""

    def cpu_per_call(call: Callable[..., Any]) -> float:
        started = time.process_time()
        for _ in range(20):
            with contextlib.suppress(httpx.HTTPError):
                call("http://127.0.0.1:9/", timeout=1.0)
        return (time.process_time() - started) / 20

    assert cpu_per_call(one_shot.get) * 10 < cpu_per_call(httpx.get)
