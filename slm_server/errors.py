"""One exception tree for everything the gateway reports to a caller.

    GatewayError                 status  type                    code
    ├── InvalidRequest            400    invalid_request_error   invalid_request / <given>
    │   └── UnsupportedEndpoint   400    invalid_request_error   unsupported_endpoint
    ├── Unauthorized              401    invalid_request_error   invalid_api_key
    ├── ModelNotFound             404    invalid_request_error   model_not_found
    ├── AmbiguousModel            409    invalid_request_error   ambiguous_model
    ├── MisdirectedRequest        421    invalid_request_error   host_not_allowed
    ├── PayloadTooLarge           413    invalid_request_error   request_too_large
    ├── UnsupportedMediaType      415    invalid_request_error   unsupported_media_type
    ├── Overloaded                429    rate_limit_error        queue_full
    ├── ClientDisconnected        499    client_closed_request   client_disconnected
    ├── BodiesOverBudget          503    overloaded_error        bodies_over_budget
    ├── BackendUnavailable        503    backend_unavailable     backend_unreachable / <given>
    ├── BackendTimeout            504    timeout_error           backend_timeout
    └── BackendProtocolError      502    backend_error           bad_backend_response / <given>
        └── AnswerTooLarge        502    backend_error           upstream_too_large / <given>

Each error renders two ways: an HTTP status with an OpenAI-shaped JSON body before the
first byte of a response, and an in-band ``data: {"error": ...}`` SSE event after it.
On the Anthropic Messages API's routes the same error takes Anthropic's shape instead
(:meth:`GatewayError.anthropic_body`, :meth:`GatewayError.anthropic_sse_event`): the same
status, the type named by :func:`anthropic_error_type`; on Ollama's routes (``/api/...``)
Ollama's (:meth:`GatewayError.ollama_body`, :meth:`GatewayError.ollama_line`):
``{"error": "<message>"}`` and the same status. Built-in exceptions are never
mapped to 4xx: only these classes are.
"""

from __future__ import annotations

import json
import math
from typing import Any, ClassVar

# Anthropic's error types by HTTP status (its API's conventions: docs.anthropic.com,
# "Errors"); every other 4xx is an invalid request, every other 5xx an api_error.
ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def anthropic_error_type(status: int) -> str:
    """The ``error.type`` Anthropic's API gives an error of ``status``."""
    found = ANTHROPIC_ERROR_TYPES.get(status)
    if found is not None:
        return found
    return "api_error" if status >= 500 else "invalid_request_error"


def anthropic_error_body(status: int, message: str) -> dict[str, Any]:
    """Anthropic's error object: ``{"type": "error", "error": {"type", "message"}}``."""
    return {"type": "error", "error": {"type": anthropic_error_type(status), "message": message}}


class GatewayError(Exception):
    """Base of every error the router answers with; carries its own HTTP rendering."""

    status: int = 500  # a class's own; an instance may carry another (see HttpStatusError)
    error_type: ClassVar[str] = "server_error"
    default_code: ClassVar[str] = "internal_error"

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code
        self.param = param
        self.retry_after = retry_after

    def body(self) -> dict[str, Any]:
        """The OpenAI error object: ``{"error": {"message", "type", "code", "param"}}``."""
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "code": self.code,
                "param": self.param,
            }
        }

    def anthropic_body(self) -> dict[str, Any]:
        """The error in the Anthropic Messages API's shape, the code kept in the message."""
        return anthropic_error_body(self.status, f"{self.message} ({self.code})")

    def ollama_body(self) -> dict[str, Any]:
        """The error in Ollama's shape: ``{"error": "<message>"}``."""
        return {"error": self.message}

    def ollama_line(self) -> bytes:
        """The in-band end of an Ollama stream: the error object as one JSON line."""
        return json.dumps(self.ollama_body(), ensure_ascii=False).encode() + b"\n"

    def anthropic_sse_event(self) -> bytes:
        """The Anthropic stream's in-band ``error`` event."""
        data = json.dumps(self.anthropic_body()).encode()
        return b"event: error\ndata: " + data + b"\n\n"

    def headers(self) -> dict[str, str]:
        """Extra response headers (``Retry-After`` for retryable refusals)."""
        if self.retry_after is None:
            return {}
        return {"Retry-After": str(max(1, math.ceil(self.retry_after)))}

    def sse_event(self) -> bytes:
        """The in-band rendering, for a stream whose headers were already sent."""
        return b"data: " + json.dumps(self.body()).encode() + b"\n\n"


class HttpStatusError(GatewayError):
    """A refusal with a status of its own (Starlette's 404/405 for unknown routes and
    methods, the door's 408/414/431): ``invalid_request_error``, never retried."""

    error_type = "invalid_request_error"

    def __init__(self, status: int, message: str, code: str) -> None:
        super().__init__(message, code=code)
        self.status = status


class InvalidRequest(GatewayError):
    status = 400
    error_type = "invalid_request_error"
    default_code = "invalid_request"


class UnsupportedEndpoint(InvalidRequest):
    default_code = "unsupported_endpoint"


class Unauthorized(GatewayError):
    status = 401
    error_type = "invalid_request_error"
    default_code = "invalid_api_key"

    def headers(self) -> dict[str, str]:
        return {"WWW-Authenticate": "Bearer"}


class PayloadTooLarge(GatewayError):
    status = 413
    error_type = "invalid_request_error"
    default_code = "request_too_large"


class UnsupportedMediaType(GatewayError):
    status = 415
    error_type = "invalid_request_error"
    default_code = "unsupported_media_type"


class Overloaded(GatewayError):
    status = 429
    error_type = "rate_limit_error"
    default_code = "queue_full"


class BodiesOverBudget(GatewayError):
    """The router holds as many request bodies as its budget allows."""

    status = 503
    error_type = "overloaded_error"
    default_code = "bodies_over_budget"


class ClientDisconnected(GatewayError):
    """The client went away first; nobody reads this answer (nginx's 499)."""

    status = 499
    error_type = "client_closed_request"
    default_code = "client_disconnected"


class ModelNotFound(GatewayError):
    status = 404
    error_type = "invalid_request_error"
    default_code = "model_not_found"


class MisdirectedRequest(GatewayError):
    status = 421
    error_type = "invalid_request_error"
    default_code = "host_not_allowed"


class AmbiguousModel(GatewayError):
    status = 409
    error_type = "invalid_request_error"
    default_code = "ambiguous_model"


class ModelConflict(GatewayError):
    """The model exists but cannot take this action (disabled, or ``load: always``)."""

    status = 409
    error_type = "invalid_request_error"
    default_code = "model_conflict"


class BackendUnavailable(GatewayError):
    status = 503
    error_type = "backend_unavailable"
    default_code = "backend_unreachable"


class BackendTimeout(GatewayError):
    status = 504
    error_type = "timeout_error"
    default_code = "backend_timeout"


class BackendProtocolError(GatewayError):
    status = 502
    error_type = "backend_error"
    default_code = "bad_backend_response"


class AnswerTooLarge(BackendProtocolError):
    """A backend's answer (or one stream event) past the router's size limit. The
    limit is the router's own: the watchdog never counts it against the backend."""

    default_code = "upstream_too_large"
