"""What every API shape's endpoint sends and answers with (:class:`Relay`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from starlette.responses import Response
from starlette.types import ASGIApp

from slm_server.registry.schema import ModelSpec
from slm_server.router.answer.reply import Replies
from slm_server.router.answer.translation import Translation
from slm_server.router.call.admitted_call import Call
from slm_server.router.upstream.sender import Sender


@dataclass(frozen=True)
class Relay:
    """What every API shape's endpoint is built from: the one sender and the replies of
    the router, the sampling defaults the launcher published for a backend, and the
    server it runs for an entry (None when no launcher has said)."""

    sender: Sender
    replies: Replies
    sampling_defaults: Callable[[ModelSpec], dict[str, Any]]
    server_kind: Callable[[ModelSpec], str | None]

    async def relay(
        self, call: Call, path: str, body: bytes, translation: Translation | None = None
    ) -> Response | ASGIApp:
        """``body`` to the backend's ``path`` under the call's deadline; the answer
        converted by ``translation`` when the request came in another API's shape."""
        progress = self.sender.progress(call)
        upstream, timer = await self.sender.open(call, path, body, progress)
        return await self.replies.reply(call, upstream, timer, progress, translation)


__all__ = ["Relay"]
