"""A minimal, fast OpenAI-style backend for the overhead benchmarks.

    uv run python -m benchmarks.fastfake --port 8601 [--chunks 64] [--chunk-interval 0]
        [--record FILE]

It answers ``POST /v1/chat/completions`` and ``/v1/completions`` with a fixed answer,
whole (JSON with ``Content-Length``) or as ``--chunks`` server-sent events followed by a
finish event, a usage event when ``stream_options.include_usage`` asks for one, and
``data: [DONE]`` (chunked transfer encoding). ``GET /health`` and ``GET /v1/models``
answer too. Connections are kept alive.

A body up to 4 KiB is parsed as JSON (and answered 400 when it is not); a larger one,
an agent's 20k-token prompt and tools, is not parsed: ``"stream": true`` and
``"include_usage": true`` are looked for in its bytes, so that the fake stays cheap
beside a gateway that parses it. ``--record FILE`` appends each request to ``FILE``, one
JSON line ``{"path": ..., "body": ...}`` with the body exactly as sent (what a gateway
in front of the fake sends upstream), flushed at once.

It is a bare ``asyncio.Protocol`` over httptools' parser on uvloop, with every response
prepared once at start, so that serving a request costs a few tens of microseconds:
much less than any gateway put in front of it. ``tests/fakes/fake_backend.py`` is the
scriptable fake for tests; this one only has to be fast.

Each streamed event is its own write, the first one at once and the next ones
``--chunk-interval`` seconds apart, as a model server sends tokens; at 0 the stream
only yields to the event loop between events and otherwise runs flat out (a reader that
is slower than that gets several events per read).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import socket
from pathlib import Path
from typing import IO, Final, cast

import httptools
import uvloop

MODEL_ID: Final = "bench"
TOKEN: Final = " tok"
_CREATED: Final = 1_700_000_000
# Bodies above this size are scanned for the two flags the fake reads, not parsed.
PARSED_BODY_BYTES: Final = 4096
_STREAM: Final = re.compile(rb'"stream"\s*:\s*true')
_INCLUDE_USAGE: Final = re.compile(rb'"include_usage"\s*:\s*true')


def _sse(payload: dict[str, object]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def _http_chunk(data: bytes) -> bytes:
    """One piece of a chunked-encoding body."""
    return b"%x\r\n%s\r\n" % (len(data), data)


def _response(status: str, content_type: str, body: bytes) -> bytes:
    head = (
        f"HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


class Answers:
    """Every byte the fake sends, prepared once for ``chunks`` tokens per answer."""

    def __init__(self, chunks: int) -> None:
        self.chunks = chunks
        text = TOKEN * chunks
        usage = {"prompt_tokens": 16, "completion_tokens": chunks, "total_tokens": 16 + chunks}
        chat = {
            "id": "chatcmpl-bench",
            "object": "chat.completion",
            "created": _CREATED,
            "model": MODEL_ID,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "length",
                }
            ],
            "usage": usage,
        }
        completion = {
            "id": "cmpl-bench",
            "object": "text_completion",
            "created": _CREATED,
            "model": MODEL_ID,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}],
            "usage": usage,
        }
        self.whole = {
            b"/v1/chat/completions": _response(
                "200 OK", "application/json", json.dumps(chat).encode()
            ),
            b"/v1/completions": _response(
                "200 OK", "application/json", json.dumps(completion).encode()
            ),
        }
        self.stream_head = (
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"cache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        chat_chunk: dict[str, object] = {"id": "chatcmpl-bench", "object": "chat.completion.chunk"}
        chat_chunk |= {"created": _CREATED, "model": MODEL_ID}
        text_chunk: dict[str, object] = {"id": "cmpl-bench", "object": "text_completion"}
        text_chunk |= {"created": _CREATED, "model": MODEL_ID}
        self.token = {
            b"/v1/chat/completions": _http_chunk(
                _sse(
                    chat_chunk
                    | {
                        "choices": [
                            {"index": 0, "delta": {"content": TOKEN}, "finish_reason": None}
                        ]
                    }
                )
            ),
            b"/v1/completions": _http_chunk(
                _sse(text_chunk | {"choices": [{"index": 0, "text": TOKEN, "finish_reason": None}]})
            ),
        }
        self.finish = {
            b"/v1/chat/completions": _http_chunk(
                _sse(
                    chat_chunk | {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}
                )
            ),
            b"/v1/completions": _http_chunk(
                _sse(
                    text_chunk | {"choices": [{"index": 0, "text": "", "finish_reason": "length"}]}
                )
            ),
        }
        self.usage = {
            b"/v1/chat/completions": _http_chunk(
                _sse(chat_chunk | {"choices": [], "usage": usage})
            ),
            b"/v1/completions": _http_chunk(_sse(text_chunk | {"choices": [], "usage": usage})),
        }
        self.done = _http_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"
        self.health = _response("200 OK", "application/json", b'{"status":"ok"}')
        models = {"object": "list", "data": [{"id": MODEL_ID, "object": "model", "owned_by": "x"}]}
        self.models = _response("200 OK", "application/json", json.dumps(models).encode())
        self.not_found = _response(
            "404 Not Found", "application/json", b'{"error":{"message":"not found"}}'
        )
        self.bad_request = _response(
            "400 Bad Request", "application/json", b'{"error":{"message":"bad json"}}'
        )


class FakeConnection(asyncio.Protocol):
    """One client connection; requests on it are answered one at a time."""

    def __init__(self, answers: Answers, interval: float, record: IO[str] | None = None) -> None:
        self.answers = answers
        self.interval = interval
        self.record = record
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.body: list[bytes] = []
        self.streaming: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.streaming is not None:
            self.streaming.cancel()
        self.transport = None

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if self.transport is not None:
                self.transport.close()

    # httptools callbacks
    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        url, self.url = self.url, b""
        body, self.body = b"".join(self.body), []
        keep_alive = self.parser.should_keep_alive()
        self.answer(url.split(b"?", 1)[0], body)
        if not keep_alive and self.streaming is None and self.transport is not None:
            self.transport.close()

    def answer(self, path: bytes, body: bytes) -> None:
        transport = self.transport
        if transport is None:
            return
        answers = self.answers
        if self.record is not None:
            line = {"path": path.decode(), "body": body.decode("utf-8", "replace")}
            self.record.write(json.dumps(line) + "\n")
            self.record.flush()
        if path in answers.whole:
            flags = _flags(body)
            if flags is None:
                transport.write(answers.bad_request)
                return
            stream, usage = flags
            if not stream:
                transport.write(answers.whole[path])
                return
            self.streaming = asyncio.ensure_future(self.stream(transport, path, usage))
        elif path == b"/health":
            transport.write(answers.health)
        elif path == b"/v1/models":
            transport.write(answers.models)
        else:
            transport.write(answers.not_found)

    async def stream(self, transport: asyncio.Transport, path: bytes, usage: bool) -> None:
        answers = self.answers
        token = answers.token[path]
        interval = self.interval
        transport.write(answers.stream_head)
        for index in range(answers.chunks):
            if index:
                await asyncio.sleep(interval)
                if transport.is_closing():
                    return
            transport.write(token)
        transport.write(answers.finish[path])
        if usage:
            transport.write(answers.usage[path])
        transport.write(answers.done)
        self.streaming = None


def _flags(body: bytes) -> tuple[bool, bool] | None:
    """Whether the request asks for a stream, and for a usage event in it; None when a
    small body is not JSON (a large one is scanned, not parsed)."""
    if len(body) > PARSED_BODY_BYTES:
        stream = _STREAM.search(body) is not None
        return stream, stream and _INCLUDE_USAGE.search(body) is not None
    try:
        request = json.loads(body)
    except ValueError:
        return None
    if not isinstance(request, dict) or request.get("stream") is not True:
        return False, False
    options = request.get("stream_options")
    return True, isinstance(options, dict) and options.get("include_usage") is True


async def serve(
    host: str, port: int, chunks: int, interval: float, record: IO[str] | None = None
) -> None:
    answers = Answers(chunks)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: FakeConnection(answers, interval, record),
        host,
        port,
        backlog=1024,
        reuse_address=True,
    )
    for sock in server.sockets:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    await serve_until_signalled(server, f"fastfake pid {os.getpid()} on http://{host}:{port}")


async def serve_until_signalled(server: asyncio.AbstractServer, banner: str) -> None:
    """Print ``banner``, then serve until SIGTERM or SIGINT."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(banner, flush=True)
    async with server:
        await stop.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--chunks", type=int, default=64, help="tokens per answer")
    parser.add_argument(
        "--chunk-interval", type=float, default=0.0, help="seconds between streamed events"
    )
    parser.add_argument("--record", type=Path, help="append each request to this file")
    args = parser.parse_args()
    if args.record is None:
        uvloop.run(serve(args.host, args.port, args.chunks, args.chunk_interval))
        return
    with args.record.open("a", encoding="utf-8") as record:
        uvloop.run(serve(args.host, args.port, args.chunks, args.chunk_interval, record))


if __name__ == "__main__":
    main()
