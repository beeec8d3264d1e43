"""The router the history's in-process tests run: the production app over one chat
model whose backend streams a short answer with its usage (prompt tokens, some read
from the cache), the history sampled every 0.2 s, one API key."""

from __future__ import annotations

from pathlib import Path

from tests.unit.router.inprocess import FakeResponse, Router, Sent, make_router, sse

HISTORY = "/v1/ui/history"
CHAT = "/v1/chat/completions"
MODEL = "org/chat-model"
KEY = {"authorization": "Bearer secret"}
CHUNK = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": MODEL}
USAGE = {"prompt_tokens": 10, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 6}}


async def streamed(_sent: Sent) -> FakeResponse:
    return sse(
        {**CHUNK, "choices": [{"index": 0, "delta": {"content": "hi"}}]},
        {**CHUNK, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        {**CHUNK, "choices": [], "usage": USAGE},
    )


def router_at(tmp_path: Path) -> Router:
    return make_router(
        tmp_path,
        streamed,
        env={"SLM_HISTORY_INTERVAL_SECONDS": "0.2", "SLM_API_KEYS": "secret"},
    )
