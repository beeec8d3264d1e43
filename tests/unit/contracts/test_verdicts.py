"""Sorting proxied outcomes into health, failure and ignore verdicts."""

from __future__ import annotations

import pytest

from slm_server.contracts.verdicts import (
    BROKEN,
    FAILURE_4XX,
    HEALTH_STATUSES,
    HEALTHY,
    PROGRESSING,
    STALLED,
    TIMED_OUT,
    UNREACHABLE,
    FailureClass,
    Outcome,
    Verdict,
    classify_engine_status,
    classify_status,
    deadline_outcome,
    judged_answer,
)

HEALTH = [200, 201, 202, 204, 206, 250, 299, 400, 404, 422]
FAILURES = {
    408: FailureClass.TIMEOUT,
    425: FailureClass.SATURATED,
    429: FailureClass.SATURATED,
    500: FailureClass.SERVER_ERROR,
    502: FailureClass.SERVER_ERROR,
    503: FailureClass.SERVER_ERROR,
    504: FailureClass.SERVER_ERROR,
    507: FailureClass.SERVER_ERROR,
    550: FailureClass.SERVER_ERROR,
    599: FailureClass.SERVER_ERROR,
}
IGNORED = [
    100,
    101,
    103,
    199,
    300,
    301,
    302,
    304,
    307,
    308,
    399,
    401,
    402,
    403,
    405,
    406,
    407,
    409,
    410,
    411,
    412,
    413,
    414,
    415,
    416,
    417,
    418,
    421,
    423,
    424,
    426,
    428,
    431,
    451,
    499,
]


@pytest.mark.parametrize("status", HEALTH)
def test_health_statuses(status: int) -> None:
    outcome = classify_status(status)
    assert outcome == Outcome(Verdict.HEALTH, None, status)
    assert outcome.failure is None
    assert outcome.status == status
    assert outcome.reason == "health"


@pytest.mark.parametrize(("status", "kind"), sorted(FAILURES.items()))
def test_failure_statuses(status: int, kind: FailureClass) -> None:
    outcome = classify_status(status)
    assert outcome == Outcome(Verdict.FAILURE, kind, status)
    assert outcome.reason == kind.value


@pytest.mark.parametrize("status", IGNORED)
def test_ignored_statuses(status: int) -> None:
    outcome = classify_status(status)
    assert outcome == Outcome(Verdict.IGNORE, None, status)
    assert outcome.reason == "ignore"


def test_every_status_from_100_to_599_has_the_documented_verdict() -> None:
    for status in range(100, 600):
        verdict = classify_status(status).verdict
        if 200 <= status <= 299 or status in (400, 404, 422):
            assert verdict is Verdict.HEALTH, status
        elif status in (408, 425, 429) or (500 <= status <= 599 and status != 501):
            assert verdict is Verdict.FAILURE, status
        else:
            assert verdict is Verdict.IGNORE, status


def test_2xx_boundaries() -> None:
    assert classify_status(199).verdict is Verdict.IGNORE
    assert classify_status(200).verdict is Verdict.HEALTH
    assert classify_status(299).verdict is Verdict.HEALTH
    assert classify_status(300).verdict is Verdict.IGNORE


def test_5xx_boundaries() -> None:
    assert classify_status(499).verdict is Verdict.IGNORE
    assert classify_status(500).failure is FailureClass.SERVER_ERROR
    assert classify_status(599).failure is FailureClass.SERVER_ERROR


@pytest.mark.parametrize("status", [600, 999])
def test_statuses_above_5xx_are_ignored(status: int) -> None:
    assert classify_status(status).verdict is Verdict.IGNORE


def test_408_is_a_timeout_and_425_429_are_saturation() -> None:
    assert classify_status(408).reason == "timeout"
    assert classify_status(425).reason == "saturated"
    assert classify_status(429).reason == "saturated"


def test_failure_4xx_table_matches_the_classes() -> None:
    assert set(FAILURE_4XX) == {408, 425, 429}
    for status, name in FAILURE_4XX.items():
        assert classify_status(status).reason == name


def test_health_status_set() -> None:
    assert frozenset({400, 404, 422}) == HEALTH_STATUSES


@pytest.mark.parametrize(
    ("outcome", "verdict", "kind", "reason"),
    [
        (HEALTHY, Verdict.HEALTH, None, "health"),
        (UNREACHABLE, Verdict.FAILURE, FailureClass.UNREACHABLE, "unreachable"),
        (TIMED_OUT, Verdict.FAILURE, FailureClass.TIMEOUT, "timeout"),
        (BROKEN, Verdict.FAILURE, FailureClass.BROKEN, "broken_connection"),
        (STALLED, Verdict.FAILURE, FailureClass.STALL, "stall"),
    ],
)
def test_transport_outcomes(
    outcome: Outcome, verdict: Verdict, kind: FailureClass | None, reason: str
) -> None:
    assert outcome.verdict is verdict
    assert outcome.failure is kind
    assert outcome.status is None
    assert outcome.reason == reason


def test_reason_prefers_the_failure_class() -> None:
    assert Outcome(Verdict.FAILURE, FailureClass.SERVER_ERROR, 503).reason == "5xx"
    assert Outcome(Verdict.FAILURE).reason == "failure"
    assert Outcome(Verdict.IGNORE, status=418).reason == "ignore"
    assert Outcome(Verdict.HEALTH, status=200).reason == "health"


def test_failure_class_values() -> None:
    assert {c.value for c in FailureClass} == {
        "unreachable",
        "timeout",
        "5xx",
        "saturated",
        "broken_connection",
        "stall",
    }


def test_outcome_is_frozen() -> None:
    outcome = classify_status(200)
    with pytest.raises(AttributeError):
        outcome.status = 500  # type: ignore[misc]


# --- deadlines: which cuts are backend timeouts ---------------------------------------


@pytest.mark.parametrize(
    ("silence", "delivered", "stall_seconds", "deadline", "expected"),
    [
        pytest.param(1.5, False, 1.5, 3.0, TIMED_OUT, id="nothing-for-the-threshold"),
        pytest.param(2.9, False, 1.5, 3.0, TIMED_OUT, id="nothing-for-the-whole-deadline"),
        pytest.param(0.4, False, 1.5, 3.0, PROGRESSING, id="nothing-yet-queue-ate-the-deadline"),
        pytest.param(1.49, False, 1.5, 3.0, PROGRESSING, id="nothing-just-under-the-threshold"),
        pytest.param(1.0, False, 1.5, 2.0, TIMED_OUT, id="nothing-for-half-a-short-deadline"),
        pytest.param(0.99, False, 1.5, 2.0, PROGRESSING, id="nothing-under-half-the-deadline"),
        pytest.param(60.0, False, 300.0, 120.0, TIMED_OUT, id="defaults-nothing-for-half"),
        pytest.param(120.0, False, 300.0, 120.0, TIMED_OUT, id="defaults-nothing-at-all"),
        pytest.param(59.9, False, 300.0, 120.0, PROGRESSING, id="defaults-queued-past-half"),
        pytest.param(1.5, True, 1.5, 3.0, TIMED_OUT, id="silent-for-the-threshold"),
        pytest.param(4.0, True, 1.5, 9.0, TIMED_OUT, id="silent-past-the-threshold"),
        pytest.param(1.49, True, 1.5, 3.0, PROGRESSING, id="silent-just-under-the-threshold"),
        pytest.param(0.3, True, 1.5, 3.0, PROGRESSING, id="tokens-still-flowing"),
        pytest.param(0.0, True, 1.5, 3.0, PROGRESSING, id="not-waiting-on-the-backend"),
        pytest.param(119.0, True, 300.0, 120.0, PROGRESSING, id="defaults-mid-stream-silence"),
    ],
)
def test_a_deadline_is_a_backend_timeout_only_without_progress(
    silence: float, delivered: bool, stall_seconds: float, deadline: float, expected: Outcome
) -> None:
    assert deadline_outcome(silence, delivered, stall_seconds, deadline) == expected


def test_a_cut_that_was_progressing_neither_counts_nor_resets() -> None:
    assert PROGRESSING.verdict is Verdict.IGNORE
    assert PROGRESSING.failure is None
    assert PROGRESSING.status is None


@pytest.mark.parametrize(
    "status", [200, 204, 301, 400, 401, 403, 404, 405, 408, 413, 422, 429, 499, 500, 503, 599]
)
def test_no_engine_status_on_a_raw_request_counts_or_resets(status: int) -> None:
    """A raw path's 200 may be /health answered while generation is wedged; its 500 a
    malformed body the router never read."""
    assert classify_engine_status(status).verdict is Verdict.IGNORE


def test_a_501_says_what_the_engine_can_do_not_how_it_is() -> None:
    assert classify_status(501).verdict is Verdict.IGNORE


@pytest.mark.parametrize(
    "content",
    [
        b'{"error":{"code":500,"message":"input (900 tokens) is too large to process. '
        b'increase the physical batch size (current batch size: 512)","type":"server_error"}}',
        b'{"error":{"code":500,"message":"input (9000 tokens) is larger than the max '
        b'context size (2048 tokens). skipping","type":"server_error"}}',
    ],
)
def test_an_input_too_large_for_the_engine_is_the_client_s(content: bytes) -> None:
    """An embedding longer than the batch (as Ollama's clients send RAG chunks, counting
    on truncation) makes llama-server answer 500: it must not count."""
    assert judged_answer(classify_status(500), content).verdict is Verdict.IGNORE
    assert judged_answer(classify_status(500), b'{"error":"boom"}').verdict is Verdict.FAILURE
    assert judged_answer(classify_status(200), content).verdict is Verdict.HEALTH
