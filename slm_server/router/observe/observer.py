"""The pure-ASGI middleware around the router: request ids, access log, span, metrics.

For every HTTP request it

* takes ``X-Request-ID`` from the request when it is a short printable token (else
  makes one), echoes it on the response and keeps it in a context variable, so each
  log line written while serving the request carries it (the response also names the
  hosted tools left out of a Responses request: ``answer_headers``);
* creates the request's :class:`~slm_server.router.call.exchange.Exchange` before any
  handler runs;
* for the model endpoints, opens the request's span and counts it in flight, and once
  the answer has ended — a relayed stream included — closes the span and records the
  request's metrics and keeps it among the recent requests the dashboard shows;
* writes one access log line on ``slm_server.access``.

Nothing is buffered: messages pass straight through, and the only work per message is
a look at its type. A client that disconnects before the answer ends is noted on the
exchange (``disconnected``).
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any, Final

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from slm_server.errors import GatewayError
from slm_server.logging_setup import REQUEST_ID, direct_line_handler
from slm_server.router.apis.table import TABLE
from slm_server.router.call.exchange import (
    REQUEST_ID_HEADER,
    Exchange,
    answer_headers,
    attach_exchange,
    new_request_id,
)
from slm_server.router.call.reject import reject
from slm_server.router.observe.metrics import Metrics
from slm_server.router.observe.recent import RecentRequests
from slm_server.router.observe.telemetry import Inbound, Telemetry

access_log = logging.getLogger("slm_server.access")
log = logging.getLogger("slm_server.router")

# A request id we accept from a client: short, printable, no spaces or quotes.
VALID_REQUEST_ID: Final = re.compile(rb"[A-Za-z0-9._:@/+=-]{1,128}")
# Requests polled by machines; their access lines are logged at DEBUG.
QUIET_PATHS: Final = frozenset({"/health", "/metrics"})
MAX_SHOWN: Final = 128


def shown(text: str) -> str:
    """``text`` as an access line may show it: as it is when short and printable, else
    its first ``MAX_SHOWN`` characters with every non-printable one escaped."""
    if len(text) <= MAX_SHOWN and text.isprintable():
        return text
    return "".join(
        c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
        for c in text[:MAX_SHOWN]
    )


def unexpected() -> GatewayError:
    """The answer to a request the router failed on unexpectedly."""
    return GatewayError("The router failed unexpectedly; see its log for details")


def request_id_from(value: bytes | None) -> str:
    """The client's request id when it is acceptable, else a fresh one."""
    if value is not None and VALID_REQUEST_ID.fullmatch(value):
        return value.decode("ascii")
    return new_request_id()


def arriving(scope: Scope) -> tuple[Exchange, Inbound]:
    """The exchange of a request as it arrives (its id, the API shape at its path), and
    the trace context it came with."""
    path: str = scope["path"]
    inbound_id = traceparent = tracestate = legacy = None
    for name, value in scope["headers"]:
        if name == REQUEST_ID_HEADER:
            inbound_id = value
        elif name == b"traceparent":
            traceparent = value.decode("latin-1")
        elif name == b"tracestate":
            tracestate = value.decode("latin-1")
        elif name == b"x-trace-id":
            legacy = value.decode("latin-1")
    shape = TABLE.at(path)
    exchange = Exchange(
        request_id=request_id_from(inbound_id),
        method=scope["method"],
        path=path,
        shape=shape,
        errors=shape.errors if shape is not None else TABLE.dialect_at(path),
    )
    return exchange, Inbound(traceparent, tracestate, legacy)


class RequestObserver:
    """Wraps ``app``; see the module docstring."""

    def __init__(
        self,
        app: ASGIApp,
        telemetry: Telemetry,
        metrics: Metrics,
        recent: RecentRequests | None = None,
    ) -> None:
        self.app = app
        self.telemetry = telemetry
        self.metrics = metrics
        self.recent = recent

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        exchange, inbound = arriving(scope)
        request_id = exchange.request_id
        attach_exchange(scope, exchange)
        model_endpoint = exchange.shape is not None
        span = None
        token = REQUEST_ID.set(request_id)

        async def observed_send(message: Message) -> None:
            kind = message["type"]
            if kind == "http.response.start":
                exchange.status = message["status"]
                headers = [*message.get("headers", ()), *answer_headers(exchange)]
                message = {**message, "headers": headers}
            elif kind == "http.response.body" and not message.get("more_body", False):
                exchange.answered = True  # before the send: a disconnect may follow it
                try:
                    await send(message)
                except BaseException:
                    exchange.answered = False  # the last piece never went out
                    raise
                return
            await send(message)

        async def observed_receive() -> Message:
            message = await receive()
            if message["type"] == "http.disconnect" and not exchange.answered:
                exchange.disconnected = True
            return message

        error: BaseException | None = None
        try:
            if model_endpoint:
                span = self.telemetry.open_span(exchange, inbound)
                self.metrics.begin(exchange)
                if self.recent is not None:
                    self.recent.begin(exchange)
            await self.app(scope, observed_receive, observed_send)
        except BaseException as exc:
            error = exc
            started = exchange.status is not None
            if not started:
                exchange.status = 500
            if not isinstance(exc, Exception):
                # Cancelled (the server shutting down, a task cancelled): no bug of ours.
                exchange.error_type = "cancelled"
                raise
            exchange.error_type = "internal_error"
            # Answered here, once, with its traceback: raised on, the error would be
            # logged again by the server, whose own 500 carries no request id, and
            # answered twice when a whole answer went out straight through the door.
            if exchange.answered:
                log.error("request %s failed after its answer was sent", request_id, exc_info=exc)
            elif started:
                # The server closes the connection: the client sees the answer cut.
                log.error("request %s failed during its answer", request_id, exc_info=exc)
            else:
                log.error("request %s failed unexpectedly", request_id, exc_info=exc)
                await reject(scope, observed_send, unexpected())
        finally:
            exchange.finished = time.perf_counter()
            self._record(exchange, span, model_endpoint, error)
            REQUEST_ID.reset(token)

    def _record(
        self, exchange: Exchange, span: Any, model_endpoint: bool, error: BaseException | None
    ) -> None:
        """The request's span, metrics, recent entry and access line, each written
        even when one before it fails: a failure to record is logged, never raised (it
        would take the place of the request's own error, or fail an answer already
        sent), and the request is never missing from the access log."""
        outcome = None
        if model_endpoint:
            if self.recent is not None:
                self.recent.end(exchange)
            if span is not None:
                try:
                    self.telemetry.close_span(span, exchange, error)
                except Exception:
                    log.exception("closing the span of request %s failed", exchange.request_id)
            try:
                outcome = self.metrics.observe(exchange)
            except Exception:
                log.exception("recording the metrics of request %s failed", exchange.request_id)
            if self.recent is not None:
                try:
                    self.recent.record(exchange, outcome)
                except Exception:
                    log.exception(
                        "keeping request %s among the recent ones failed", exchange.request_id
                    )
        try:
            self._log(exchange, outcome)
        except Exception:
            log.exception("writing the access line of request %s failed", exchange.request_id)

    @staticmethod
    def _log(exchange: Exchange, outcome: str | None) -> None:
        level = logging.DEBUG if exchange.path in QUIET_PATHS else logging.INFO
        direct = direct_line_handler(access_log, level)
        if direct is None and not access_log.isEnabledFor(level):
            return
        model = exchange.spec.entry.id if exchange.spec is not None else exchange.model
        # Never let a client's string (a path with %0d%0a, a model id) forge a line.
        model = None if model is None else shown(model)
        path = shown(exchange.path)
        duration_ms = round(exchange.duration * 1000, 1)
        status = exchange.status if exchange.status is not None else "-"
        message = f"{exchange.method} {path} {status} {duration_ms:.1f}ms model={model or '-'}"
        fields: dict[str, Any] = {
            "method": exchange.method,
            "path": path,
            "model": model,
            "status": exchange.status,
            "duration_ms": duration_ms,
            "outcome": outcome,
        }
        alias = exchange.alias
        if alias is not None:  # the model was named by an alias: the line says by which
            fields["alias"] = shown(alias)
            message += f" alias={fields['alias']}"
        rule = exchange.routing_rule
        if rule is not None and exchange.spec is not None:
            # An entry with replicas: which one served it, and why.
            fields.update(replica=exchange.spec.role, routing=rule)
            message += f" replica={exchange.spec.role} routing={rule}"
            matched = exchange.prefix_match_chars
            if matched is not None:
                fields["prefix_match_chars"] = matched
                message += f" match={matched:d}"
        recovery = exchange.recovery
        if recovery is not None:  # it waited for its backend's restart, or was sent again
            seconds = round(exchange.recovery_seconds or 0.0, 3)
            fields.update(recovery=recovery, recovery_seconds=seconds)
            message += f" recovery={recovery} recovery_seconds={seconds:g}"
        tools = exchange.tool_summary
        if tools is not None:  # the router settled the answer's tool calls
            fields["tools"] = tools
            message += f" tools={tools.replace(' ', ';')}"
        if exchange.dropped_tools:
            fields["dropped_tools"] = list(exchange.dropped_tools)
            message += f" dropped_tools={','.join(exchange.dropped_tools)}"
        if direct is not None:  # the line the record would have made, without the record
            name = logging.getLevelName(level)
            line = direct.lines.line(
                time.time(), name, access_log.name, message, exchange.request_id, fields
            )
            direct.write_line(line, level)
            return
        # The record is made here rather than by ``access_log.log``, which would first
        # walk the stack for a caller no formatter shows. (``message`` is made already:
        # no client string in it can be taken for a format.)
        record = access_log.makeRecord(
            access_log.name, level, __file__, 0, "%s", (message,), None, extra=fields
        )
        access_log.handle(record)
