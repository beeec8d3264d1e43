"""Which shape an error takes (its :class:`Dialect`): Anthropic's on the Messages API's
routes (and every path under them), Ollama's on its routes (``/api/...``), OpenAI's
everywhere else, as the table of shapes
says for each path (``Exchange.errors``, set at the door)."""

from __future__ import annotations

from enum import Enum
from typing import Any

from starlette.responses import JSONResponse

from slm_server.errors import GatewayError


class Dialect(Enum):
    """The error shape of one family of routes."""

    OPENAI = "openai"
    ANTHROPIC = "anthropic"
    OLLAMA = "ollama"


def error_body(error: GatewayError, dialect: Dialect) -> dict[str, Any]:
    """``error``'s JSON body as the clients of ``dialect``'s routes expect it."""
    if dialect is Dialect.ANTHROPIC:
        return error.anthropic_body()
    if dialect is Dialect.OLLAMA:
        return error.ollama_body()
    return error.body()


def error_response(error: GatewayError, dialect: Dialect) -> JSONResponse:
    """``error`` as a whole JSON answer."""
    return JSONResponse(
        error_body(error, dialect), status_code=error.status, headers=error.headers()
    )


__all__ = ["Dialect", "error_body", "error_response"]
