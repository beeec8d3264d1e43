"""``GET /metrics`` of a real router process in front of fake backends: it parses as
Prometheus text, and its counters and histograms move as requests pass."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from slm_server.contracts.records import BackendState, write_state
from tests.fakes.control import FakeBackend
from tests.processes import RunningRouter, StartRouter, poll
from tests.registry_entries import registry_entry

# Its module-scoped stack starts once: one worker runs the whole module.
pytestmark = pytest.mark.xdist_group("test_metrics")

CHAT = "/v1/chat/completions"
HELLO = [{"role": "user", "content": "count my words"}]
FAKE_ROLES = ("alpha", "embed", "sick")
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def published(role: str, port: int, state: str, **extra: Any) -> BackendState:
    return BackendState(
        role=role,
        model_id=role,
        backend="llamacpp",
        port=port,
        state=state,
        pid=os.getpid(),
        since=time.time(),
        started_at=time.time(),
        exit_status=None,
        restarts=sum(extra.get("restarts_by_reason", {}).values()),
        reason=None,
        log_path="-",
        **extra,
    )


@pytest.fixture(scope="module")
def router_process(
    fakes: dict[str, FakeBackend],
    start_router: StartRouter,
    tmp_path_factory: pytest.TempPathFactory,
) -> RunningRouter:
    workdir: Path = tmp_path_factory.mktemp("metrics")
    models = {
        "alpha": registry_entry("alpha", fakes["alpha"].port),
        "embed": registry_entry("embed", fakes["embed"].port, model_type="embeddings"),
        "sick": registry_entry("sick", fakes["sick"].port),
        "off": registry_entry("off", fakes["sick"].port + 1, enabled=False),
    }
    # The state a live launcher (this test process) published for the backends.
    write_state(
        workdir / "logs" / "backends.state.json",
        os.getpid(),
        [
            published("alpha", fakes["alpha"].port, "ready", restarts_by_reason={"stall": 2}),
            published(
                "sick", fakes["sick"].port, "ready", restarts_by_reason={"5xx": 1, "exited": 3}
            ),
        ],
    )
    return start_router(models, workdir=workdir, SLM_OTEL_ENABLED="false")


def scrape(http: httpx.Client) -> Samples:
    response = http.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples: Samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def moved(before: Samples, after: Samples, name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


def test_metrics_parse_and_name_every_family(http: httpx.Client) -> None:
    response = http.get("/metrics")
    names = {family.name for family in text_string_to_metric_families(response.text)}
    assert {
        "slm_requests",
        "slm_request_duration_seconds",
        "slm_time_to_first_token_seconds",
        "slm_output_tokens_per_second",
        "slm_prompt_tokens",
        "slm_completion_tokens",
        "slm_router_overhead_seconds",
        "slm_queue_wait_seconds",
        "slm_watchdog_failures",
        "slm_requests_in_flight",
        "slm_backend_state",
        "slm_backend_restarts",
    } <= names


def test_counters_and_histograms_move_as_requests_pass(
    http: httpx.Client, fakes: dict[str, FakeBackend]
) -> None:
    before = scrape(http)
    chat = http.post(CHAT, json={"model": "alpha", "messages": HELLO}).json()
    fakes["alpha"].script(chunks=5, chunk_interval_seconds=0.02)
    stream = {"model": "alpha", "messages": HELLO, "stream": True}
    with http.stream("POST", CHAT, json=stream) as response:
        lines = list(response.iter_lines())
    assert not [line for line in lines if '"usage"' in line]  # kept from the client
    embedded = http.post("/v1/embeddings", json={"model": "embed", "input": "a b c"}).json()
    assert http.post(CHAT, json={"model": "nope", "messages": HELLO}).status_code == 404
    after = scrape(http)

    ok_chat = {"model": "alpha", "emit_path": "chat", "outcome": "ok", "status_class": "2xx"}
    assert moved(before, after, "slm_requests_total", **ok_chat) == 1
    streamed = {**ok_chat, "emit_path": "streaming"}
    assert moved(before, after, "slm_requests_total", **streamed) == 1
    embeddings = {"model": "embed", "emit_path": "embeddings", "outcome": "ok"}
    assert moved(before, after, "slm_requests_total", **embeddings, status_class="2xx") == 1
    unknown = {"model": "unknown", "emit_path": "chat", "outcome": "client_error"}
    assert moved(before, after, "slm_requests_total", **unknown, status_class="4xx") == 1

    duration = {"model": "alpha", "emit_path": "streaming", "status_class": "2xx"}
    assert moved(before, after, "slm_request_duration_seconds_count", **duration) == 1
    assert moved(before, after, "slm_request_duration_seconds_sum", **duration) > 0.08
    inf = {**duration, "le": "+Inf"}
    assert moved(before, after, "slm_request_duration_seconds_bucket", **inf) == 1

    assert moved(before, after, "slm_time_to_first_token_seconds_count", model="alpha") == 1
    assert moved(before, after, "slm_output_tokens_per_second_count", model="alpha") == 1
    rate = moved(before, after, "slm_output_tokens_per_second_sum", model="alpha")
    assert 0 < rate < 5 / 0.02 * 2  # five tokens, at least ~80 ms apart in all

    prompt = chat["usage"]["prompt_tokens"] + 3  # the stream's prompt: three words
    assert moved(before, after, "slm_prompt_tokens_total", model="alpha") == prompt
    completion = chat["usage"]["completion_tokens"] + 5  # five streamed chunks
    assert moved(before, after, "slm_completion_tokens_total", model="alpha") == completion
    embed_tokens = embedded["usage"]["prompt_tokens"]
    assert moved(before, after, "slm_prompt_tokens_total", model="embed") == embed_tokens

    assert moved(before, after, "slm_router_overhead_seconds_count", model="alpha") == 2
    assert moved(before, after, "slm_router_overhead_seconds_count", model="unknown") == 1
    assert moved(before, after, "slm_queue_wait_seconds_count", model="alpha") == 2
    assert value(after, "slm_requests_in_flight", model="alpha") == 0


def test_in_flight_counts_a_stream_until_it_ends(
    http: httpx.Client, router: str, fakes: dict[str, FakeBackend]
) -> None:
    fakes["alpha"].script(chunks=40, chunk_interval_seconds=0.05)
    stream = {"model": "alpha", "messages": HELLO, "stream": True}
    with (
        httpx.Client(base_url=router, timeout=10.0) as other,
        other.stream("POST", CHAT, json=stream) as response,
    ):
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data: {"))
        assert value(scrape(http), "slm_requests_in_flight", model="alpha") == 1
        assert list(lines)
    poll(
        lambda: value(scrape(http), "slm_requests_in_flight", model="alpha") == 0,
        5,
        "the stream to leave the in-flight gauge",
    )


def test_backend_state_and_restarts_come_from_the_supervisor(http: httpx.Client) -> None:
    samples = scrape(http)
    states = {
        (labels["model"], labels["state"]): v
        for (name, label_set), v in samples.items()
        if name == "slm_backend_state"
        for labels in [dict(label_set)]
        if v == 1
    }
    assert states == {
        ("alpha", "ready"): 1,
        ("sick", "ready"): 1,
        ("embed", "unknown"): 1,
        ("off", "disabled"): 1,
    }
    assert (
        value(
            samples,
            "slm_backend_restarts_total",
            model="alpha",
            role="alpha",
            replica="1",
            reason="stall",
        )
        == 2
    )
    sick = {"model": "sick", "role": "sick", "replica": "1"}
    assert value(samples, "slm_backend_restarts_total", **sick, reason="exited") == 3
    assert value(samples, "slm_backend_restarts_total", **sick, reason="5xx") == 1


def test_watchdog_failure_verdicts_are_counted(
    http: httpx.Client, fakes: dict[str, FakeBackend]
) -> None:
    before = scrape(http)
    fakes["sick"].script(status=500)
    assert http.post(CHAT, json={"model": "sick", "messages": HELLO}).status_code == 500
    after = scrape(http)
    assert (
        moved(before, after, "slm_watchdog_failures_total", model="sick", replica="1", reason="5xx")
        == 1
    )
    failed = {"model": "sick", "emit_path": "chat", "status_class": "5xx"}
    assert moved(before, after, "slm_requests_total", **failed, outcome="backend_error") == 1
