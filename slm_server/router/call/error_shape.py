"""Which shape an error takes on a path: Anthropic's on the Messages API's routes
(``/v1/messages`` and everything under it), OpenAI's everywhere else."""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse

from slm_server.errors import GatewayError

MESSAGES_PATH = "/v1/messages"


def anthropic_shaped(path: str) -> bool:
    """Whether errors on ``path`` take the Anthropic Messages API's shape."""
    return path == MESSAGES_PATH or path.startswith(MESSAGES_PATH + "/")


def error_body(error: GatewayError, path: str) -> dict[str, Any]:
    """``error``'s JSON body as a client of ``path`` expects it."""
    return error.anthropic_body() if anthropic_shaped(path) else error.body()


def error_response(error: GatewayError, path: str) -> JSONResponse:
    """``error`` as a whole JSON answer to a request for ``path``."""
    return JSONResponse(error_body(error, path), status_code=error.status, headers=error.headers())


__all__ = ["MESSAGES_PATH", "anthropic_shaped", "error_body", "error_response"]
