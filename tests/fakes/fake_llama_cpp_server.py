"""A stand-in for llama-cpp-python's server (``python -m llama_cpp.server``), the
llama.cpp fallback, in what matters to the watchdog: its one model lock.

In llama-cpp-python 0.3.36 (``llama_cpp/server/app.py``) every route that names the
model, ``GET /v1/models`` included, takes the model's lock before it runs
(``Depends(get_llama_proxy)``), and a generation holds it until its last token, whether
or not its client is still there. Routes FastAPI serves itself (``/docs``,
``/openapi.json``) take no lock. So, here:

* ``GET /v1/models`` waits for the lock, then lists ``--model_alias``;
* ``GET /docs`` answers at once;
* ``POST /v1/chat/completions`` waits for the lock, then "generates" ``max_tokens``
  tokens of :data:`TOKEN_SECONDS` of CPU each in a worker thread (the event loop stays
  free, as the real server's ``run_in_threadpool`` leaves it), and answers whole.

Started by a test through a ``llama_cpp/server/__main__.py`` shim it writes on
``PYTHONPATH`` (:func:`write_shim`); takes the real server's flags and ignores those it
does not use.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse
from starlette.routing import Route

TOKEN_SECONDS = 0.1


def _burn(seconds: float) -> None:
    """Use the CPU for ``seconds``, as decoding a token does."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def make_app(alias: str) -> Starlette:
    lock = asyncio.Lock()

    async def models(_request: Request) -> JSONResponse:
        async with lock:
            return JSONResponse(
                {"object": "list", "data": [{"id": alias, "object": "model", "owned_by": "me"}]}
            )

    async def docs(_request: Request) -> HTMLResponse:
        return HTMLResponse("<!doctype html><title>docs</title>")

    async def chat(request: Request) -> JSONResponse:
        body = await request.json()
        tokens = int(body.get("max_tokens") or 16)
        async with lock:
            await asyncio.to_thread(_burn, tokens * TOKEN_SECONDS)
        message = {"role": "assistant", "content": " tok" * tokens}
        return JSONResponse(
            {
                "id": "chatcmpl-fake",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": alias,
                "choices": [{"index": 0, "message": message, "finish_reason": "length"}],
                "usage": {
                    "prompt_tokens": 4,
                    "completion_tokens": tokens,
                    "total_tokens": 4 + tokens,
                },
            }
        )

    routes = [
        Route("/v1/models", models, methods=["GET"]),
        Route("/docs", docs, methods=["GET"]),
        Route("/v1/chat/completions", chat, methods=["POST"]),
    ]
    return Starlette(routes=routes)


def write_shim(site: Path) -> Path:
    """``site/llama_cpp/server/__main__.py`` running this fake; put ``site`` (and the
    project's root) on ``PYTHONPATH``."""
    server = site / "llama_cpp" / "server"
    server.mkdir(parents=True, exist_ok=True)
    (site / "llama_cpp" / "__init__.py").write_text("")
    (server / "__init__.py").write_text("")
    shim = "from tests.fakes.fake_llama_cpp_server import main\n\nmain()\n"
    (server / "__main__.py").write_text(shim)
    return site


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model_alias", default="model")
    args, _ = parser.parse_known_args()
    uvicorn.run(make_app(args.model_alias), host=args.host, port=args.port, log_level="warning")
