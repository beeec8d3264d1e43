"""The watchdog's half on the routes that reach an engine by its own paths: nothing a
client sends through ``/upstream/<model>/...`` counts against a backend or resets a
streak its model's own routes are building (a raw stream whose first byte the engine
holds back by the client's choice, a 200 from ``/health`` answered while generation is
wedged), a 501 says what an engine can do, not how it is, and an engine's 500 for an
input too large for its batch is the client's. Each against a control that counts, so
the stall limit and the threshold are shown to be live."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.fakes.control import FakeBackend
from tests.processes import RunningRouter, StartRouter, poll
from tests.registry_entries import registry_entry

pytestmark = pytest.mark.xdist_group("test_upstream_watchdog")

FAKE_ROLES = ("coder", "embed")
STALL = 0.5
TOO_LARGE = (
    "input (900 tokens) is too large to process. increase the physical batch size "
    "(current batch size: 512)"
)


@pytest.fixture(scope="module")
def router_process(fakes: dict[str, FakeBackend], start_router: StartRouter) -> RunningRouter:
    models = {
        "coder": registry_entry("coder", fakes["coder"].port, infill=True, max_concurrency=2),
        "embed": registry_entry("embed", fakes["embed"].port, model_type="embeddings"),
    }
    return start_router(
        models,
        SLM_OTEL_ENABLED="false",
        SLM_WATCHDOG_STALL_SECONDS=str(STALL),
        SLM_WATCHDOG_FAILURE_THRESHOLD="100",  # streaks are read, never tripped
    )


@pytest.fixture(autouse=True)
def _reset(fakes: dict[str, FakeBackend]) -> None:
    for fake in fakes.values():
        fake.reset()


def streak(http: httpx.Client, role: str) -> int:
    failures: int = http.get("/v1/backends/health").json()[role]["failure_streak"]
    return failures


def healthy(http: httpx.Client, fakes: dict[str, FakeBackend], role: str) -> None:
    """End ``role``'s streak with an answer of its own route."""
    fakes[role].reset()
    path = "/v1/embeddings" if role == "embed" else "/v1/completions"
    body = {"model": role, "input": "x"} if role == "embed" else {"model": role, "prompt": "x"}
    assert http.post(path, json=body).status_code == 200
    assert streak(http, role) == 0


def stalls(router_process: RunningRouter) -> int:
    """The stalls the watchdog has counted against ``coder``."""
    path = router_process.workdir / "logs" / "watchdog.jsonl"
    if not path.exists():
        return 0
    records = [json.loads(line) for line in path.read_text().splitlines() if line]
    return sum(
        1
        for r in records
        if r["event"] == "backend_failure" and r["role"] == "coder" and r["reason"] == "stall"
    )


def test_a_raw_stream_held_back_past_the_stall_limit_is_not_a_stall(
    http: httpx.Client, fakes: dict[str, FakeBackend], router_process: RunningRouter
) -> None:
    healthy(http, fakes, "coder")
    before = stalls(router_process)
    fakes["coder"].script(delay_seconds=STALL * 3, chunks=2)
    raw = http.post("/upstream/coder/completion", json={"prompt": "x", "stream": True})
    assert raw.status_code == 200 and b"data:" in raw.content
    assert stalls(router_process) == before and streak(http, "coder") == 0
    # The control: the same wait on the model's own route is a stall.
    answer = http.post("/v1/completions", json={"model": "coder", "prompt": "x", "stream": True})
    assert answer.status_code == 200
    poll(lambda: stalls(router_process) > before, 5, "the control's stall to count")


def test_a_raw_200_does_not_end_a_streak(http: httpx.Client, fakes: dict[str, FakeBackend]) -> None:
    healthy(http, fakes, "coder")
    fakes["coder"].script(status=500, paths=["/v1/completions"])
    assert http.post("/v1/completions", json={"model": "coder", "prompt": "x"}).status_code == 500
    assert streak(http, "coder") == 1
    assert http.get("/upstream/coder/health").status_code == 200
    assert streak(http, "coder") == 1  # what /health says ends no streak
    fakes["coder"].script(status=503)
    raw = http.post("/upstream/coder/completion", json={"prompt": "x"})
    assert raw.status_code == 503
    assert streak(http, "coder") == 1  # nor does the engine's 5xx to a raw body count


def test_a_501_neither_counts_nor_resets(http: httpx.Client, fakes: dict[str, FakeBackend]) -> None:
    """An entry says ``infill: true`` of a model without the tokens: llama-server's 501
    on /infill, on completions' suffix and on /api/generate's suffix."""
    healthy(http, fakes, "coder")
    fakes["coder"].script(infill=False)
    for path, body in (
        ("/infill", {"model": "coder", "input_prefix": "a", "input_suffix": "b"}),
        ("/v1/completions", {"model": "coder", "prompt": "a", "suffix": "b"}),
        ("/api/generate", {"model": "coder", "prompt": "a", "suffix": "b", "stream": False}),
    ):
        assert http.post(path, json=body).status_code == 501, path
    assert streak(http, "coder") == 0


def test_an_input_too_large_for_the_engine_is_the_client_s(
    http: httpx.Client, fakes: dict[str, FakeBackend]
) -> None:
    healthy(http, fakes, "embed")
    fakes["embed"].script(status=500, error_message=TOO_LARGE)
    for path, body in (
        ("/v1/embeddings", {"model": "embed", "input": "long " * 900}),
        ("/api/embed", {"model": "embed", "input": ["long " * 900]}),
    ):
        answer = http.post(path, json=body)
        assert answer.status_code == 500 and "too large" in answer.text, path
    assert streak(http, "embed") == 0
    # The control: any other 500 counts.
    fakes["embed"].script(status=500)
    assert http.post("/v1/embeddings", json={"model": "embed", "input": "x"}).status_code == 500
    assert streak(http, "embed") == 1
