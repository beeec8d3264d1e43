"""The endpoints proxied as they are — chat completions, completions, embeddings,
rerank, image generations, and the multipart image edits and audio transcriptions:
the request goes to the backend's own endpoint and its answer comes back."""

from __future__ import annotations

from starlette.responses import Response
from starlette.types import ASGIApp

from slm_server.router.answer.reply import Replies
from slm_server.router.answer.translation import Translation
from slm_server.router.call.admitted_call import Call
from slm_server.router.upstream.sender import Sender


class PassThrough:
    """Sends a call's body to a backend path and answers with what comes back."""

    def __init__(self, sender: Sender, replies: Replies) -> None:
        self.sender = sender
        self.replies = replies

    async def __call__(
        self, call: Call, path: str, body: bytes, translation: Translation | None = None
    ) -> Response | ASGIApp:
        """``body`` to ``path`` under the call's deadline; the answer converted by
        ``translation`` when the request came in another API's shape."""
        progress = self.sender.progress(call)
        upstream, timer = await self.sender.open(call, path, body, progress)
        return await self.replies.reply(call, upstream, timer, progress, translation)


__all__ = ["PassThrough"]
