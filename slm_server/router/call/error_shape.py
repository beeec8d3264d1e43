"""Which shape an error takes: Anthropic's on the Messages API's routes (and every path
under them, as the table of shapes says: ``Exchange.anthropic``), OpenAI's everywhere
else."""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse

from slm_server.errors import GatewayError


def error_body(error: GatewayError, anthropic: bool) -> dict[str, Any]:
    """``error``'s JSON body as the client expects it (``anthropic``: on the Messages
    API's routes)."""
    return error.anthropic_body() if anthropic else error.body()


def error_response(error: GatewayError, anthropic: bool) -> JSONResponse:
    """``error`` as a whole JSON answer."""
    return JSONResponse(
        error_body(error, anthropic), status_code=error.status, headers=error.headers()
    )


__all__ = ["error_body", "error_response"]
