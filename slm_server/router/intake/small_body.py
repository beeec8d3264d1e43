"""A small JSON request body (an admin endpoint's, ``/api/show``'s), read within its
limit: 415 unless it says it is JSON, 413 past ``limit`` bytes (read no further), then
parsed as every body is."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request

from slm_server.errors import PayloadTooLarge
from slm_server.router.intake.payload import check_json_type, header_value, parse_body


async def read_small_json(request: Request, limit: int, too_large: str) -> dict[str, Any]:
    """The body as a JSON object; ``too_large`` is the 413's message."""
    check_json_type(header_value(request.scope["headers"], b"content-type"))
    parts: list[bytes] = []
    size = 0
    async for part in request.stream():
        size += len(part)
        if size > limit:
            raise PayloadTooLarge(too_large)
        parts.append(part)
    return parse_body(b"".join(parts))


__all__ = ["read_small_json"]
