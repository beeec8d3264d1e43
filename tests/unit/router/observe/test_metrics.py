"""Request metrics from finished exchanges, bounded labels, and the scrape-time
collector of in-flight requests, backend states and restarts."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from slm_server.contracts.records import BackendState, write_state
from slm_server.contracts.verdicts import STALLED, TIMED_OUT
from slm_server.registry.schema import ModelSpec
from slm_server.router.apis.table import TABLE
from slm_server.router.call.backend_state import StateView
from slm_server.router.call.exchange import Exchange
from slm_server.router.dispatch.lookup import Registry
from slm_server.router.observe.metrics import OUTCOMES, Metrics, outcome_of, status_class
from tests.registry_entries import model_spec


def spec(role: str, port: int, **fields: Any) -> ModelSpec:
    return model_spec(role, role, port, index=port, **fields)


ALPHA = spec("alpha", 8501)
EMBED = spec("embed", 8502, model_type="embeddings")
OFF = spec("off", 8503, enabled=False)
REGISTRY = Registry([ALPHA, EMBED, OFF])


def metrics(tmp_path: Path) -> Metrics:
    return Metrics(REGISTRY, StateView(tmp_path / "state.json"))


def exchange(
    path: str = "/v1/chat/completions", target: ModelSpec | None = ALPHA, **fields: Any
) -> Exchange:
    record = Exchange(request_id="r", method="POST", path=path, started=100.0, shape=TABLE.at(path))
    record.spec = target
    record.finished = 101.0
    record.status = 200
    for name, value in fields.items():
        setattr(record, name, value)
    return record


def sample(m: Metrics, name: str, **labels: str) -> float:
    found = m.registry.get_sample_value(name, labels)
    return 0.0 if found is None else found


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, "ok"),
        ({"status": 200, "error_type": "backend_stream_error"}, "stream_error"),
        ({"status": 200, "error_type": "cancelled"}, "cancelled"),
        ({"status": 200, "error_type": "internal_error"}, "router_error"),
        ({"status": 200, "disconnected": True}, "cancelled"),
        ({"status": 499}, "cancelled"),
        ({"status": 400}, "client_error"),
        ({"status": 404}, "client_error"),
        ({"status": 401}, "rejected"),
        ({"status": 429}, "rejected"),
        ({"status": 413}, "rejected"),
        ({"status": 503}, "unavailable"),
        ({"status": 504}, "timeout"),
        ({"status": 502}, "backend_error"),
        ({"status": 500}, "backend_error"),
        ({"status": 500, "error_type": "internal_error"}, "router_error"),
        ({"status": None}, "router_error"),
    ],
)
def test_outcomes(fields: dict[str, Any], expected: str) -> None:
    assert outcome_of(exchange(**fields)) == expected
    assert expected in OUTCOMES


@pytest.mark.parametrize(
    ("status", "expected"), [(200, "2xx"), (302, "3xx"), (404, "4xx"), (599, "5xx"), (None, "none")]
)
def test_status_classes(status: int | None, expected: str) -> None:
    assert status_class(status) == expected


def test_a_plain_request_counts_once_with_its_duration_and_overhead(tmp_path: Path) -> None:
    m = metrics(tmp_path)
    done = exchange(upstream_seconds=0.6, queue_seconds=0.3, input_tokens=7, output_tokens=3)
    m.begin(done)
    assert m.observe(done) == "ok"
    labels = {"model": "alpha", "emit_path": "chat"}
    assert sample(m, "slm_requests_total", **labels, outcome="ok", status_class="2xx") == 1
    duration = {**labels, "status_class": "2xx"}
    assert sample(m, "slm_request_duration_seconds_sum", **duration) == pytest.approx(1.0)
    assert sample(m, "slm_router_overhead_seconds_sum", model="alpha") == pytest.approx(0.1)
    assert sample(m, "slm_queue_wait_seconds_sum", model="alpha") == pytest.approx(0.3)
    assert sample(m, "slm_prompt_tokens_total", model="alpha") == 7
    assert sample(m, "slm_completion_tokens_total", model="alpha") == 3
    assert sample(m, "slm_time_to_first_token_seconds_count", model="alpha") == 0
    assert m.live == {}


def test_prompt_tokens_read_from_the_cache_are_counted_by_model(tmp_path: Path) -> None:
    m = metrics(tmp_path)
    m.observe(exchange(input_tokens=40, cached_tokens=32))
    m.observe(exchange(input_tokens=10, cached_tokens=None))
    m.observe(exchange(input_tokens=20, cached_tokens=8))
    assert sample(m, "slm_prompt_cached_tokens_total", model="alpha") == 40
    assert sample(m, "slm_prompt_tokens_total", model="alpha") == 70


def test_a_stream_records_first_token_and_decode_speed(tmp_path: Path) -> None:
    m = metrics(tmp_path)
    streamed = exchange(stream=True, first_chunk=100.2, last_chunk=100.7, output_tokens=20)
    m.observe(streamed)
    assert sample(m, "slm_time_to_first_token_seconds_sum", model="alpha") == pytest.approx(0.2)
    assert sample(m, "slm_output_tokens_per_second_sum", model="alpha") == pytest.approx(40)
    labels = {"model": "alpha", "emit_path": "streaming", "outcome": "ok", "status_class": "2xx"}
    assert sample(m, "slm_requests_total", **labels) == 1


def test_no_queue_wait_is_recorded_when_the_request_never_queued(tmp_path: Path) -> None:
    m = metrics(tmp_path)
    m.observe(exchange(upstream_seconds=2.0))  # overhead never goes negative
    assert sample(m, "slm_queue_wait_seconds_count", model="alpha") == 0
    assert sample(m, "slm_router_overhead_seconds_sum", model="alpha") == 0


def test_unrouted_requests_are_labelled_unknown_never_with_client_input(tmp_path: Path) -> None:
    m = metrics(tmp_path)
    refused = exchange(target=None, status=404, model="attacker-chosen\nvalue")
    m.observe(refused)
    labels = {"model": "unknown", "emit_path": "chat", "outcome": "client_error"}
    assert sample(m, "slm_requests_total", **labels, status_class="4xx") == 1
    assert "attacker" not in m.exposition().decode()


def test_watchdog_failures_are_counted_by_class(tmp_path: Path) -> None:
    m = metrics(tmp_path)
    m.count_failure(ALPHA, STALLED)
    m.count_failure(ALPHA, TIMED_OUT)
    m.count_failure(ALPHA, TIMED_OUT)
    assert sample(m, "slm_watchdog_failures_total", model="alpha", replica="1", reason="stall") == 1
    alpha = {"model": "alpha", "replica": "1"}
    assert sample(m, "slm_watchdog_failures_total", **alpha, reason="timeout") == 2


def test_two_apps_keep_separate_registries(tmp_path: Path) -> None:
    first, second = metrics(tmp_path), metrics(tmp_path)
    first.observe(exchange())
    labels = {"model": "alpha", "emit_path": "chat", "outcome": "ok", "status_class": "2xx"}
    assert sample(first, "slm_requests_total", **labels) == 1
    assert sample(second, "slm_requests_total", **labels) == 0


def test_in_flight_is_counted_at_scrape_time(tmp_path: Path) -> None:
    m = metrics(tmp_path)
    routed, unrouted = exchange(), exchange(target=None)
    m.begin(routed)
    m.begin(unrouted)
    assert sample(m, "slm_requests_in_flight", model="alpha") == 1
    assert sample(m, "slm_requests_in_flight", model="unknown") == 1
    assert sample(m, "slm_requests_in_flight", model="embed") == 0
    m.observe(routed)
    assert sample(m, "slm_requests_in_flight", model="alpha") == 0


def published(role: str, port: int, state: str, **extra: Any) -> BackendState:
    return BackendState(
        role=role,
        model_id=role,
        backend="llamacpp",
        port=port,
        state=state,
        pid=1,
        since=time.time(),
        started_at=None,
        exit_status=None,
        restarts=0,
        reason=None,
        log_path="-",
        **extra,
    )


def current_states(m: Metrics) -> dict[str, str]:
    text = m.exposition().decode()
    [family] = [f for f in text_string_to_metric_families(text) if f.name == "slm_backend_state"]
    return {s.labels["model"]: s.labels["state"] for s in family.samples if s.value == 1}


def test_backend_states_and_restarts_come_from_the_published_state(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    reasons = {"stall": 2, "exited": 1, "made-up": 4}
    write_state(
        path, os.getpid(), [published("alpha", 8501, "restarting", restarts_by_reason=reasons)]
    )
    m = metrics(tmp_path)
    assert current_states(m) == {"alpha": "restarting", "embed": "unknown", "off": "disabled"}
    restarts = {"model": "alpha", "role": "alpha", "replica": "1"}
    assert sample(m, "slm_backend_restarts_total", **restarts, reason="stall") == 2
    assert sample(m, "slm_backend_restarts_total", **restarts, reason="exited") == 1
    assert sample(m, "slm_backend_restarts_total", **restarts, reason="other") == 4


def test_the_restart_budget_is_exported_as_it_stands_now(tmp_path: Path) -> None:
    now = time.time()
    spent = [now - 700.0, now - 100.0, now - 30.0]  # the first has left a 600 s window
    budget = {"budget_max": 5, "budget_window_seconds": 600.0, "budget_spent_at": spent}
    write_state(
        tmp_path / "state.json",
        os.getpid(),
        [
            published("alpha", 8501, "ready", **budget),
            published("embed", 8502, "abandoned", **{**budget, "budget_spent_at": [now] * 5}),
        ],
    )
    m = metrics(tmp_path)
    alpha = {"model": "alpha", "role": "alpha", "replica": "1"}
    assert sample(m, "slm_restart_budget_used", **alpha) == 2
    assert sample(m, "slm_restart_budget_remaining", **alpha) == 3
    frees_in = sample(m, "slm_restart_budget_frees_in_seconds", **alpha)
    assert frees_in is not None and 495 < frees_in <= 500
    embed = {"model": "embed", "role": "embed", "replica": "1"}
    assert sample(m, "slm_restart_budget_remaining", **embed) == 0
    assert sample(m, "slm_restart_budget_used", **embed) == 5


def test_a_dead_launcher_makes_its_states_unsupervised(tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    write_state(tmp_path / "state.json", gone.pid, [published("alpha", 8501, "ready")])
    assert current_states(metrics(tmp_path))["alpha"] == "unsupervised"


def test_every_family_has_help_and_parses(tmp_path: Path) -> None:
    m = metrics(tmp_path)
    m.observe(exchange())
    families = list(text_string_to_metric_families(m.exposition().decode()))
    assert all(f.documentation for f in families)
    assert {f.type for f in families} >= {"counter", "histogram", "gauge"}
