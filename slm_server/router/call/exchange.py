"""What the router learns about one request while serving it: the record that the
access log, the OpenTelemetry span and the Prometheus metrics are all made from.

The middleware creates an :class:`Exchange` per request (``exchange_of(scope)``); the
handlers fill it in as they go — the model, the request's sampling fields, the status,
usage and finish reasons, the time of the first streamed chunk and the time spent
waiting on the backend.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from starlette.types import Scope

from slm_server.errors import GatewayError
from slm_server.registry.schema import ModelSpec
from slm_server.router.call.error_shape import Dialect
from slm_server.router.call.shape import Shape

_SCOPE_KEY = "slm.exchange"

# The stages a request waits at, in the order they come (docs/api.md, "Keep-alives and
# progress"): in the admission queue, for a backend starting or restarting, for an
# on-demand load, for the backend's first bytes, while the engine reads the prompt, and
# once the answer's first bytes have come.
QUEUED: Final = "queued"
RESTARTING: Final = "waiting_for_backend"
LOADING: Final = "loading"
SENT: Final = "sent"
READING_PROMPT: Final = "reading_prompt"
ANSWERING: Final = "answering"
STAGES: Final = (QUEUED, RESTARTING, LOADING, SENT, READING_PROMPT, ANSWERING)
# An error's message as kept for the dashboard's request detail.
MAX_ERROR_CHARS: Final = 500
_ID_PREFIX = uuid.uuid4().hex[:16]
_ID_COUNTER = itertools.count(1)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _count(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def _cached_tokens(body: dict[str, Any]) -> int | None:
    """The prompt tokens an answer says its engine read from its cache: usage's
    ``prompt_tokens_details.cached_tokens`` (chat, llama-server),
    ``input_tokens_details.cached_tokens`` (Responses) or ``cache_read_input_tokens``
    (Messages), else llama-server's ``timings.cache_n``; None when it says nothing."""
    usage = body.get("usage")
    if isinstance(usage, dict):
        for name in ("prompt_tokens_details", "input_tokens_details"):
            details = usage.get(name)
            count = _count(details.get("cached_tokens")) if isinstance(details, dict) else None
            if count is not None:
                return count
        count = _count(usage.get("cache_read_input_tokens"))
        if count is not None:
            return count
    timings = body.get("timings")
    return _count(timings.get("cache_n")) if isinstance(timings, dict) else None


@dataclass
class Exchange:
    """One request's record. Times are ``time.perf_counter()`` seconds."""

    request_id: str
    method: str
    path: str
    started: float = field(default_factory=time.perf_counter)
    # The API shape served at ``path`` (None for the router's own routes), and the
    # shape errors take there; set at the door.
    shape: Shape | None = None
    errors: Dialect = Dialect.OPENAI
    spec: ModelSpec | None = None
    model: str | None = None
    stream: bool = False
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    status: int | None = None
    response_id: str | None = None
    response_model: str | None = None
    finish_reasons: list[str] = field(default_factory=list)
    input_tokens: int | None = None
    output_tokens: int | None = None
    # Prompt tokens the engine read from its cache, as its answer said (None: it did not).
    cached_tokens: int | None = None
    first_chunk: float | None = None
    last_chunk: float | None = None
    chunks: int = 0
    upstream_seconds: float = 0.0
    queue_seconds: float | None = None
    error_type: str | None = None
    # Why it failed, when the router answered or cut it with an error of its own.
    error_message: str | None = None
    finished: float | None = None
    # Extra headers for the upstream request (trace context), set by the middleware.
    upstream_headers: dict[str, str] = field(default_factory=dict)
    # The client went away before the answer ended (set by the middleware).
    disconnected: bool = False
    # The answer's last byte was handed to the server (set by the middleware, or by a
    # whole answer written straight to the connection): nothing is left to send.
    answered: bool = False
    # For an entry with replicas: the rule that chose ``spec`` (balance.RULES) and the
    # leading characters its prefix index matched (prefix_affinity only).
    routing_rule: str | None = None
    prefix_match_chars: int | None = None
    # The hosted tools a Responses request offered that were left out of what the model
    # sees (their types, each once), named in the answer's header and the access line.
    dropped_tools: tuple[str, ...] = ()
    # The tools of a chat request as the router handled them (slm_server.router.toolcalls):
    # the mode that applied ("native", "render"; None: not guarded), the calls that
    # reached the client, the repairs made, whether a call was asked again, and why the
    # answer is text in the place of a call.
    tool_mode: str | None = None
    tool_calls: int = 0
    tool_repairs: tuple[str, ...] = ()
    tool_retried: bool = False
    tool_failed: str | None = None
    # How the request got through its backend's restart: "waited" (it came while the
    # backend was starting or restarting, and waited for it to be ready) or "retried"
    # (the backend stranded it: sent again, once, to the new process); the seconds that
    # took.
    recovery: str | None = None
    recovery_seconds: float | None = None
    # How long the request waited for its model's on-demand load (None: it did not).
    load_seconds: float | None = None
    # Where the request waits for its answer (one of STAGES; None before it is routed),
    # since when, its place in the admission queue (asked when reported) and the prompt
    # tokens its engine has read of the total (from the engine's progress reports).
    stage: str | None = None
    stage_since: float | None = None
    queue_ahead: Callable[[], int] | None = None
    prompt_read: tuple[int, int] | None = None

    @property
    def tool_outcome(self) -> str | None:
        """What became of a guarded request's calls, in one word: ``text`` (a call was
        due or made and could not be had: the answer is text, with the reason),
        ``retried`` (a call asked again made it), ``repaired``, ``valid``, ``no_call``
        (the model answered text where it could); None for a request not guarded."""
        if self.tool_mode is None:
            return None
        if self.tool_failed is not None:
            return "text"
        if self.tool_retried:
            return "retried"
        if self.tool_repairs:
            return "repaired"
        return "valid" if self.tool_calls else "no_call"

    @property
    def tool_summary(self) -> str | None:
        """The guard's work on this request in a few words, for the dashboard and the
        access line: ``render valid calls=1``, ``native repaired calls=2
        repairs=name,arguments_json``...; None for a request not guarded."""
        outcome = self.tool_outcome
        if outcome is None:
            return None
        summary = f"{self.tool_mode} {outcome} calls={self.tool_calls}"
        if self.tool_repairs:
            summary += " repairs=" + ",".join(dict.fromkeys(self.tool_repairs))
        return summary

    @property
    def emit_path(self) -> str:
        """One distinct value per emit site: chat, completions, responses, messages,
        count_tokens, embeddings, rerank, image_generations, image_edits,
        transcriptions, or streaming for any streamed chat or text completion."""
        shape = self.shape
        if shape is None:
            return "other"
        return "streaming" if self.stream and shape.token_stream else shape.name

    @property
    def operation(self) -> str:
        return self.shape.operation if self.shape is not None else "other"

    @property
    def routed(self) -> bool:
        """Whether the request reached the point of naming a known model."""
        return self.spec is not None

    @property
    def alias(self) -> str | None:
        """The name the client gave the model it was routed to when that is not the
        entry's id (one of its aliases); None otherwise, or when it was not routed."""
        spec, asked = self.spec, self.model
        if spec is None or asked is None or asked == spec.entry.id:
            return None
        return asked

    def note_request(self, payload: dict[str, Any]) -> None:
        """The request fields telemetry reports."""
        model = payload.get("model")
        self.model = model if isinstance(model, str) else None
        shape = self.shape
        asked = payload.get("stream")
        if asked is None:  # not given, or null: the shape's default (Ollama's: a stream)
            asked = shape is not None and shape.stream_default
        self.stream = asked is True and shape is not None and shape.streams
        self.note_sampling(payload)

    def note_sampling(self, payload: dict[str, Any]) -> None:
        """The sampling fields telemetry reports: the client's, then again as the
        registry's presets left them."""
        self.max_tokens = _count(payload.get("max_tokens", payload.get("max_output_tokens")))
        self.temperature = _number(payload.get("temperature"))
        self.top_p = _number(payload.get("top_p"))

    def note_response(self, body: dict[str, Any]) -> None:
        """Fold in what a response object (or one stream chunk) says: id, model,
        finish reasons and token usage, in the chat, completions, embeddings,
        Responses-API or Messages-API shapes, or llama-server's own."""
        if self.response_id is None and isinstance(body.get("id"), str):
            self.response_id = body["id"]
        if self.response_model is None and isinstance(body.get("model"), str):
            self.response_model = body["model"]
        choices = body.get("choices")
        if isinstance(choices, list):
            for choice in choices:
                reason = choice.get("finish_reason") if isinstance(choice, dict) else None
                if isinstance(reason, str):
                    self.finish_reasons.append(reason)
        status = body.get("status")
        if body.get("object") == "response" and isinstance(status, str):
            self.finish_reasons.append(status)
        stop_reason = body.get("stop_reason")
        if body.get("type") == "message" and isinstance(stop_reason, str):
            self.finish_reasons.append(stop_reason)
        usage = body.get("usage")
        if isinstance(usage, dict):
            prompt = _count(usage.get("prompt_tokens", usage.get("input_tokens")))
            if prompt is not None:  # Anthropic's input_tokens leave out the cache's
                for cached in ("cache_read_input_tokens", "cache_creation_input_tokens"):
                    prompt += _count(usage.get(cached)) or 0
            completion = _count(usage.get("completion_tokens", usage.get("output_tokens")))
            if prompt is not None:
                self.input_tokens = prompt
            if completion is not None:
                self.output_tokens = completion
        from_cache = _cached_tokens(body)
        if from_cache is not None:
            self.cached_tokens = from_cache
        if body.get("stop") is True and "stop_type" in body:
            self._note_native_end(body)

    def _note_native_end(self, body: dict[str, Any]) -> None:
        """llama-server's own answer (``/infill``, ``/completion``), whole or its
        stream's last event: its token counts, and why it ended (``limit`` is
        OpenAI's ``length``)."""
        prompt = _count(body.get("tokens_evaluated"))
        completion = _count(body.get("tokens_predicted"))
        if prompt is not None:
            self.input_tokens = prompt
        if completion is not None:
            self.output_tokens = completion
        stop = body.get("stop_type")
        if isinstance(stop, str):
            self.finish_reasons.append("length" if stop == "limit" else "stop")

    def note_error(self, error: GatewayError) -> None:
        """The router answers (or ends the answer) with ``error``: its code and why."""
        self.error_type = error.code
        self.error_message = error.message[:MAX_ERROR_CHARS]

    def enter(self, stage: str) -> None:
        """The request waits at ``stage`` (one of :data:`STAGES`) from now."""
        self.stage = stage
        self.stage_since = time.perf_counter()
        if stage != QUEUED:
            self.queue_ahead = None

    def placed(self, ahead: Callable[[], int]) -> None:
        """In the admission queue: ``ahead`` tells how many wait before it."""
        self.queue_ahead = ahead

    def waiting(self, now: float) -> dict[str, Any]:
        """Where the request is: its stage, for how long, and the stage's progress (the
        requests ahead in the queue; the prompt tokens read of the total)."""
        since = self.stage_since if self.stage_since is not None else self.started
        report: dict[str, Any] = {
            "stage": self.stage or "arriving",
            "stage_seconds": round(max(0.0, now - since), 3),
            "waited_seconds": round(max(0.0, now - self.started), 3),
        }
        if self.stage == QUEUED and self.queue_ahead is not None:
            report["ahead"] = self.queue_ahead()
        if self.stage == READING_PROMPT and self.prompt_read is not None:
            report["prompt_tokens_read"], report["prompt_tokens"] = self.prompt_read
        return report

    def note_chunk(self, now: float | None = None) -> None:
        """A piece of the answer arrived (at ``now``, ``time.perf_counter()``)."""
        if now is None:
            now = time.perf_counter()
        if self.first_chunk is None:
            self.first_chunk = now
        self.last_chunk = now
        self.chunks += 1

    @property
    def duration(self) -> float:
        end = self.finished if self.finished is not None else time.perf_counter()
        return end - self.started

    @property
    def time_to_first_chunk(self) -> float | None:
        return None if self.first_chunk is None else self.first_chunk - self.started

    @property
    def output_tokens_per_second(self) -> float | None:
        """Streamed completion tokens per second after the first chunk."""
        if not self.output_tokens or self.first_chunk is None or self.last_chunk is None:
            return None
        span = self.last_chunk - self.first_chunk
        return self.output_tokens / span if span > 0 else None


def new_request_id() -> str:
    """32 hex digits, unique: a random prefix per process and a counter (``uuid4`` would
    read the system's random source on every request)."""
    return f"{_ID_PREFIX}{next(_ID_COUNTER):016x}"


REQUEST_ID_HEADER = b"x-request-id"
DROPPED_TOOLS_HEADER = b"x-slm-dropped-tools"
TOOL_REPAIRS_HEADER = b"x-slm-tool-repairs"
TOOL_FAILED_HEADER = b"x-slm-tool-failed"


def echoed_id(exchange: Exchange) -> tuple[bytes, bytes]:
    """The header that gives the client its request's id back."""
    return (REQUEST_ID_HEADER, exchange.request_id.encode("ascii"))


def answer_headers(exchange: Exchange) -> list[tuple[bytes, bytes]]:
    """The headers the router adds to every answer: the request's id, the hosted tools
    left out of a Responses request (``x-slm-dropped-tools: web_search, mcp``), and for
    a whole answer whose tool calls the router changed, what it did
    (``x-slm-tool-repairs: name, arguments_json, retried``) or why the answer is text
    in the place of a call (``x-slm-tool-failed``)."""
    headers = [echoed_id(exchange)]
    if exchange.dropped_tools:
        value = ", ".join(exchange.dropped_tools).encode("latin-1", "replace")
        headers.append((DROPPED_TOOLS_HEADER, value))
    repairs = (*exchange.tool_repairs, *(("retried",) if exchange.tool_retried else ()))
    if repairs:
        headers.append((TOOL_REPAIRS_HEADER, ", ".join(dict.fromkeys(repairs)).encode()))
    if exchange.tool_failed is not None:
        printable = "".join(c if " " <= c < "\x7f" else " " for c in exchange.tool_failed)
        reason = printable[:300].encode("ascii")
        headers.append((TOOL_FAILED_HEADER, reason))
    return headers


def exchange_of(scope: Scope) -> Exchange:
    """The request's exchange; created on first use when no middleware made one."""
    state = scope.setdefault("state", {})
    exchange = state.get(_SCOPE_KEY)
    if not isinstance(exchange, Exchange):
        exchange = Exchange(
            request_id=new_request_id(), method=scope.get("method", ""), path=scope.get("path", "")
        )
        state[_SCOPE_KEY] = exchange
    return exchange


def attach_exchange(scope: Scope, exchange: Exchange) -> None:
    scope.setdefault("state", {})[_SCOPE_KEY] = exchange
