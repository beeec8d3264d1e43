"""The router's Prometheus metrics (``GET /metrics``): every name, label and bucket.

Each app owns its own ``CollectorRegistry``, so several apps can live in one process.
Label values are bounded: ``model`` is a model id from the registry (``unknown`` for a
request that never named a known model), ``emit_path`` one of the emit sites,
``outcome`` and ``status_class`` small fixed sets, ``reason`` and ``state`` the
watchdog's and the supervisor's own vocabularies, ``replica`` a backend's replica
number (1 to the entry's ``replicas``) and ``rule`` one of ``balance.RULES``. Nothing
a client sends becomes a label value.

Request metrics are recorded once per request, from its finished
:class:`~slm_server.router.call.exchange.Exchange`. In-flight counts, backend states and
restarts are read at scrape time (:class:`LiveState`), so they cost nothing per request.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Final, Protocol, TypeVar

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector
from starlette.requests import Request
from starlette.responses import Response

from slm_server.contracts.records import budget_view
from slm_server.contracts.states import State
from slm_server.contracts.verdicts import FailureClass, Outcome
from slm_server.registry.schema import ModelSpec
from slm_server.router.call.backend_state import StateSource
from slm_server.router.call.exchange import Exchange
from slm_server.router.dispatch.lookup import Registry
from slm_server.router.observe.tally import Counts, Spread

UNKNOWN_MODEL: Final = "unknown"

# Outcomes of a request, decided by :func:`outcome_of`.
OUTCOMES: Final = (
    "ok",
    "client_error",
    "rejected",
    "cancelled",
    "backend_error",
    "timeout",
    "unavailable",
    "stream_error",
    "router_error",
)
# What ``slm_backend_state`` can report: the supervisor's states, plus ``ejected``
# (a remote the watchdog keeps traffic off), ``unsupervised`` (published by a launcher
# that is gone) and ``unknown`` (never published).
BACKEND_STATES: Final = (*(s.value for s in State), "ejected", "unsupervised", "unknown")
RESTART_REASONS: Final = frozenset(
    {"exited", "exited while starting", "launch_failed", *(f.value for f in FailureClass)}
)

DURATION_BUCKETS: Final = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0,
)  # fmt: skip
FIRST_TOKEN_BUCKETS: Final = (
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
)  # fmt: skip
TOKENS_PER_SECOND_BUCKETS: Final = (
    1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 50.0, 75.0, 100.0, 150.0, 200.0, 300.0, 500.0, 1000.0,
)  # fmt: skip
OVERHEAD_BUCKETS: Final = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
)  # fmt: skip
QUEUE_BUCKETS: Final = (
    0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
)  # fmt: skip


def model_label(exchange: Exchange) -> str:
    """The bounded ``model`` label: the registry id the request was routed to."""
    return exchange.spec.entry.id if exchange.spec is not None else UNKNOWN_MODEL


def status_class(status: int | None) -> str:
    """``2xx`` .. ``5xx``; ``none`` when no response was started."""
    if status is None or not 100 <= status <= 599:
        return "none"
    return f"{status // 100}xx"


def outcome_of(exchange: Exchange) -> str:
    """How a finished request ended, as one of :data:`OUTCOMES`:

    ok             answered with 2xx/3xx and no error inside the stream
    cancelled      the client went away before the answer ended, or it was cancelled
    stream_error   the status was 200 but the stream ended with an error event
    rejected       the router refused it for capacity or credentials (401, 413, 429)
    client_error   any other 4xx (malformed, unknown model, wrong endpoint)
    unavailable    503: the backend is down, starting or abandoned
    timeout        504 (or 408): the backend did not answer in time
    backend_error  502 or another 5xx answered by the backend
    router_error   500 raised by the router itself, or its error after a 2xx/3xx head
    """
    status = exchange.status
    if exchange.disconnected or status == 499 or exchange.error_type == "cancelled":
        return "cancelled"
    if status is None:
        return "router_error"
    if status < 400:
        if exchange.error_type == "internal_error":  # the router failed after its head
            return "router_error"
        return "stream_error" if exchange.error_type is not None else "ok"
    if status in (401, 403, 413, 429):
        return "rejected"
    if status in (408, 504):
        return "timeout"
    if status < 500:
        return "client_error"
    if status == 503:
        return "unavailable"
    if status == 500 and exchange.error_type == "internal_error":
        return "router_error"
    return "backend_error"


class EngineSource(Protocol):
    """The engines' own metrics
    (:class:`slm_server.router.observe.engine_metrics.EngineMetrics`)."""

    async def refresh(self) -> None: ...

    def exposition(self) -> bytes: ...


# The families every router exports: name, help, labels (and a histogram's buckets).
REQUESTS: Final = (
    "slm_requests_total",
    "Requests answered, by model, emit path, outcome and status class.",
    ["model", "emit_path", "outcome", "status_class"],
)
DURATION: Final = (
    "slm_request_duration_seconds",
    "Time from the request's arrival to the end of its answer (streams included).",
    ["model", "emit_path", "status_class"],
    DURATION_BUCKETS,
)
FIRST_TOKEN: Final = (
    "slm_time_to_first_token_seconds",
    "Streams: time from the request's arrival to the backend's first chunk.",
    ["model"],
    FIRST_TOKEN_BUCKETS,
)
TOKENS_PER_SECOND: Final = (
    "slm_output_tokens_per_second",
    "Streams: completion tokens per second between the first and the last chunk.",
    ["model"],
    TOKENS_PER_SECOND_BUCKETS,
)
PROMPT_TOKENS: Final = (
    "slm_prompt_tokens_total",
    "Prompt (input) tokens the backends reported.",
    ["model"],
)
COMPLETION_TOKENS: Final = (
    "slm_completion_tokens_total",
    "Completion (output) tokens the backends reported, streams included.",
    ["model"],
)
CACHED_TOKENS: Final = (
    "slm_prompt_cached_tokens_total",
    "Prompt tokens the backends reported reading from their prompt cache (a part of "
    "slm_prompt_tokens_total).",
    ["model"],
)
OVERHEAD: Final = (
    "slm_router_overhead_seconds",
    "Time a request spent in the router: duration minus backend time minus queue wait.",
    ["model"],
    OVERHEAD_BUCKETS,
)
QUEUE_WAIT: Final = (
    "slm_queue_wait_seconds",
    "Time a request waited for a free backend slot before it was sent.",
    ["model"],
    QUEUE_BUCKETS,
)
WATCHDOG_FAILURES: Final = (
    "slm_watchdog_failures_total",
    "Watchdog verdicts of failure on a backend's answer, by failure class.",
    ["model", "replica", "reason"],
)
ROUTED: Final = (
    "slm_routed_requests_total",
    "Requests to an entry with replicas, by the replica chosen and the rule that chose it.",
    ["model", "replica", "rule"],
)

TOOL_ANSWERS: Final = (
    "slm_tool_answers_total",
    "Answers to requests offering tools whose calls the router settled, by what became of "
    "them: valid, repaired, retried (asked again under a constraint), text (no valid call "
    "could be had), no_call.",
    ["model", "mode", "outcome"],
)
TOOL_REPAIRS: Final = (
    "slm_tool_repairs_total",
    "Repairs made to the models' tool calls, by kind (name, arguments_json, "
    "arguments_schema, extracted).",
    ["model", "repair"],
)

_F = TypeVar("_F", Counts, Spread)


class Metrics:
    """The metrics of one router app; ``observe`` each finished exchange."""

    def __init__(self, registry: Registry, states: StateSource) -> None:
        self.engines: EngineSource | None = None
        self.registry = CollectorRegistry(auto_describe=False)
        self.live: dict[int, Exchange] = {}  # by id(): an Exchange is not hashable
        families: list[Counts | Spread] = []

        def family(made: _F) -> _F:
            families.append(made)
            return made

        self.requests = family(Counts(*REQUESTS))
        self.duration = family(Spread(*DURATION))
        self.first_token = family(Spread(*FIRST_TOKEN))
        self.tokens_per_second = family(Spread(*TOKENS_PER_SECOND))
        self.prompt_tokens = family(Counts(*PROMPT_TOKENS))
        self.completion_tokens = family(Counts(*COMPLETION_TOKENS))
        self.cached_tokens = family(Counts(*CACHED_TOKENS))
        self.overhead = family(Spread(*OVERHEAD))
        self.queue_wait = family(Spread(*QUEUE_WAIT))
        self.watchdog_failures = family(Counts(*WATCHDOG_FAILURES))
        self.routed = family(Counts(*ROUTED))
        self.tool_answers = family(Counts(*TOOL_ANSWERS))
        self.tool_repairs = family(Counts(*TOOL_REPAIRS))
        self.registry.register(_Families(families))
        self.registry.register(LiveState(registry, states, self.live))

    def begin(self, exchange: Exchange) -> None:
        """A request to a model endpoint has arrived."""
        self.live[id(exchange)] = exchange

    def observe(self, exchange: Exchange) -> str:
        """Record a finished request (after :meth:`begin`); returns its outcome."""
        self.live.pop(id(exchange), None)
        model = model_label(exchange)
        by_model = (model,)
        klass = status_class(exchange.status)
        outcome = outcome_of(exchange)
        self.requests.inc((model, exchange.emit_path, outcome, klass))
        duration = exchange.duration
        self.duration.observe((model, exchange.emit_path, klass), duration)
        queued = exchange.queue_seconds
        if queued is not None:
            self.queue_wait.observe(by_model, queued)
        overhead = duration - exchange.upstream_seconds - (queued or 0.0)
        self.overhead.observe(by_model, max(overhead, 0.0))
        if exchange.input_tokens:
            self.prompt_tokens.inc(by_model, exchange.input_tokens)
        if exchange.output_tokens:
            self.completion_tokens.inc(by_model, exchange.output_tokens)
        if exchange.cached_tokens:
            self.cached_tokens.inc(by_model, exchange.cached_tokens)
        rule = exchange.routing_rule
        if rule is not None and exchange.spec is not None:
            self.routed.inc((model, str(exchange.spec.replica), rule))
        tools = exchange.tool_outcome
        if tools is not None:
            self.tool_answers.inc((model, exchange.tool_mode or "", tools))
            for repair in exchange.tool_repairs:
                self.tool_repairs.inc((model, repair))
        first = exchange.time_to_first_chunk
        if first is not None:
            self.first_token.observe(by_model, first)
            rate = exchange.output_tokens_per_second
            if rate is not None:
                self.tokens_per_second.observe(by_model, rate)
        return outcome

    def count_failure(self, spec: ModelSpec, outcome: Outcome) -> None:
        """The tripwire's hook: one watchdog failure verdict on ``spec``'s backend."""
        reason = outcome.failure.value if outcome.failure is not None else "other"
        self.watchdog_failures.inc((spec.entry.id, str(spec.replica), reason))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def add_engines(self, engines: EngineSource) -> None:
        """Re-export each engine's own metrics after the router's."""
        self.engines = engines

    async def scrape(self, _request: Request) -> Response:
        """``GET /metrics``: the Prometheus text format, the router's own families and
        then the engines'."""
        body = self.exposition()
        if self.engines is not None:
            await self.engines.refresh()
            body += self.engines.exposition()
        return Response(body, media_type=CONTENT_TYPE_LATEST)


class _Families(Collector):
    """The router's own counter and histogram families, exposed in this order."""

    def __init__(self, families: list[Counts | Spread]) -> None:
        self.families = families

    def collect(self) -> Iterable[Metric]:
        return [family.family() for family in self.families]


class LiveState(Collector):
    """Gauges computed at scrape time: requests in flight, each backend's state as the
    supervisor published it, and its restarts by reason."""

    def __init__(self, registry: Registry, states: StateSource, live: dict[int, Exchange]) -> None:
        self.registry = registry  # read at each scrape: a reload may have replaced it
        self.states = states
        self.live = live

    def describe(self) -> Iterable[Metric]:
        return list(self._families())

    def collect(self) -> Iterable[Metric]:
        families = self._families()
        in_flight, state, restarts, remaining, used, frees_in = families
        wall = time.time()
        registry = self.registry
        counts = dict.fromkeys((s.entry.id for s in registry.enabled), 0)
        for exchange in list(self.live.values()):
            label = model_label(exchange)
            counts[label] = counts.get(label, 0) + 1
        for model, count in counts.items():
            in_flight.add_metric([model], count)
        supervised = self.states.launcher_alive()
        for spec in registry.models:
            entry = spec.entry
            known = self.states.get(spec.role, entry.port) if entry.enabled else None
            if not entry.enabled:
                current = State.DISABLED.value
            elif known is None:
                current = "unknown"
            elif not supervised:
                current = "unsupervised"
            else:
                current = known.state if known.state in BACKEND_STATES else "unknown"
            replica = str(spec.replica)
            for value in BACKEND_STATES:
                on = 1.0 if value == current else 0.0
                state.add_metric([entry.id, spec.role, replica, value], on)
            by_reason = known.restarts_by_reason if known is not None else {}
            totals: dict[str, int] = {}
            for reason, count in by_reason.items():
                key = reason if reason in RESTART_REASONS else "other"
                totals[key] = totals.get(key, 0) + count
            for reason, count in totals.items():
                restarts.add_metric([entry.id, spec.role, replica, reason], count)
            if known is not None and not entry.remote:  # a remote has no restart budget
                budget = budget_view(known, wall)
                labels = [entry.id, spec.role, replica]
                remaining.add_metric(labels, 0 if budget.abandoned else budget.remaining)
                used.add_metric(labels, budget.used)
                if budget.frees_at is not None:
                    frees_in.add_metric(labels, max(0.0, budget.frees_at - wall))
        return families

    @staticmethod
    def _families() -> tuple[
        GaugeMetricFamily,
        GaugeMetricFamily,
        CounterMetricFamily,
        GaugeMetricFamily,
        GaugeMetricFamily,
        GaugeMetricFamily,
    ]:
        return (
            GaugeMetricFamily(
                "slm_requests_in_flight",
                "Requests to model endpoints being served now ('unknown' until routed).",
                labels=["model"],
            ),
            GaugeMetricFamily(
                "slm_backend_state",
                "1 for the backend's current supervisor state, 0 for the others.",
                labels=["model", "role", "replica", "state"],
            ),
            CounterMetricFamily(
                "slm_backend_restarts",
                "Restarts of the backend by the supervisor, by reason.",
                labels=["model", "role", "replica", "reason"],
            ),
            GaugeMetricFamily(
                "slm_restart_budget_remaining",
                "Restarts the backend may still have within the window (0 once abandoned).",
                labels=["model", "role", "replica"],
            ),
            GaugeMetricFamily(
                "slm_restart_budget_used",
                "Restarts of the backend within the sliding window.",
                labels=["model", "role", "replica"],
            ),
            GaugeMetricFamily(
                "slm_restart_budget_frees_in_seconds",
                "Seconds until the oldest restart in the window leaves it (absent: none).",
                labels=["model", "role", "replica"],
            ),
        )
