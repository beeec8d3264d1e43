"""A scriptable fake OpenAI-compatible backend, run as a real process on a real port.

    python -m tests.fakes.fake_backend --port PORT [--host 127.0.0.1] [--model-id NAME]
    python -m tests.fakes.fake_backend --llama-server-args LLAMA_SERVER_ARGV...

The second form (used by tests/fakes/fake-llama-server) takes llama-server's flags and
reads start-up behaviour from the --model file: see ``tests.fakes.startup``.

llama-server's own routes (``tests.fakes.native_routes``): /infill, /completion,
/tokenize, /detokenize, /apply-template, and /echo/... (any method) for passthrough tests.
Proxied endpoints: /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/rerank,
/v1/responses (404 unless scripted), /v1/images/generations (JSON), /v1/images/edits and
/v1/audio/transcriptions (multipart/form-data, answered like mlx-openai-server: b64 images;
json, text, srt, vtt or verbose_json transcripts, an SSE stream when ``stream`` is true),
GET /v1/models.  GET /health answers {"status":"ok"}.  GET /slots answers like
llama-server's (see ``slots_answer``) when the script sets ``slots``, else 404.
POST /slots/{id}?action=save|restore (as llama-server, given --slot-save-path): a slot
"holds" the last request's body size / 4 as tokens; saved as a small file of our own
format, which a restore checks (anything else: 400, like a corrupt file).
Every request is recorded with its content type, body size and SHA-256, and for a form
each part's name, filename, content type, size and SHA-256 (and its text, for a field
that is not a file).
Control endpoints used by tests: POST /_control (script, see ``Script``), GET /_requests,
GET /_health_requests, POST /_reset.  Tests drive it through ``tests.fakes.control``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import json
import logging
import math
import os
import signal
import struct
import sys
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import asdict, dataclass, field
from types import FrameType, UnionType
from typing import Any, get_args, get_origin, get_type_hints

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from tests.fakes import native_routes as native
from tests.fakes import startup

JSON = dict[str, Any]
Events = tuple[list[bytes], list[bytes], list[bytes]]  # SSE events: prefix, content, suffix
PROXIED_POST = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/rerank",
    "/v1/responses",
    "/v1/images/generations",
    "/v1/images/edits",
    "/v1/audio/transcriptions",
)
FORM_PATHS = ("/v1/images/edits", "/v1/audio/transcriptions")
TRANSCRIPT_TYPES = {
    "text": "text/plain; charset=utf-8",
    "srt": "application/x-subrip",
    "vtt": "text/vtt; charset=utf-8",
}


@dataclass
class Script:
    """Behaviour for subsequent requests; each POST /_control replaces the whole script.

    Order of effects for a matched request: exit_on_request, stall, next status
    (``statuses`` queue first, then ``status``), delay_seconds, then the answer. A
    request is matched when its path is in ``paths`` (if set), its raw body contains
    ``body_contains`` (if set) and does not contain ``body_lacks`` (if set); any other
    request is answered normally, in the script's answer shape (``chunks``, their pace
    and text, ``reply``, ``responses``) but with none of its effects.
    ``slots``: how many slots GET /slots shows (None: no /slots); the first
    ``busy_slots`` are busy, and each GET /slots advances their ``n_decoded`` by one
    while ``slots_progress``; ``slots_stall`` makes GET /slots hang.
    Streamed content is ``chunk_text`` repeated ``chunks`` times (``reply`` only
    affects non-streamed answers). ``tool_calls`` (each ``{"name", "arguments"}``)
    makes a matched chat request's answer call those tools instead (finish reason
    ``tool_calls``; streamed, each call's arguments in pieces of ``tool_piece``
    characters, ``TOOL_PIECE`` by default); an unmatched one is answered in text.
    """

    status: int | None = None
    statuses: list[int] = field(default_factory=list)
    # The message of a scripted error status's body (None: "scripted <status>").
    error_message: str | None = None
    delay_seconds: float = 0.0
    stall: bool = False
    chunks: int = 8
    chunk_interval_seconds: float = 0.0
    chunk_text: str = "tok "
    fail_mid_stream_after: int | None = None
    exit_on_request: bool = False
    health_status: int = 200
    health_stall: bool = False
    paths: list[str] | None = None
    body_contains: str | None = None
    body_lacks: str | None = None
    slots: int | None = None
    busy_slots: int = 0
    slots_progress: bool = True
    slots_stall: bool = False
    responses: bool = False
    reply: str | None = None
    tool_calls: list[JSON] | None = None
    # A chat answer that thinks this first (as ``reasoning_content``).
    reasoning: str | None = None
    # A stream that asks for ``return_progress`` gets llama-server's prompt progress
    # reports: one as it starts, one this often while ``delay_seconds`` runs (the
    # prompt being read), one when the prompt is read.
    progress_interval_seconds: float = 0.5
    # How many characters of a streamed call's arguments each chunk carries.
    tool_piece: int = 8  # TOOL_PIECE
    # False: a matched stream ends without its finish chunk (its usage and [DONE] still
    # sent), as a backend cut short may end one.
    finish_chunk: bool = True
    # What GET /props answers (llama-server's server properties, e.g.
    # ``{"chat_template_caps": {"supports_tools": false}}``); None: 404, as before.
    props: dict[str, Any] | None = None
    # Whether the model has the fill-in-the-middle tokens: /infill answers (False: 501,
    # as llama-server answers for a model without them).
    infill: bool = True

    @classmethod
    def parse(cls, data: Any) -> Script:
        """Build a script from decoded JSON, rejecting unknown fields and wrong types."""
        if not isinstance(data, dict):
            raise ValueError("script must be a JSON object")
        hints = get_type_hints(cls)
        for name, value in data.items():
            if name not in hints:
                raise ValueError(f"unknown script field {name!r}")
            if not _matches(value, hints[name]):
                raise ValueError(f"script field {name!r}: {value!r} is not {hints[name]}")
        return cls(**data)

    def shape_only(self) -> Script:
        """How a request this script does not match is answered: its answer shape,
        none of its effects."""
        return Script(
            chunks=self.chunks,
            chunk_interval_seconds=self.chunk_interval_seconds,
            chunk_text=self.chunk_text,
            responses=self.responses,
            reply=self.reply,
            reasoning=self.reasoning,
            infill=self.infill,
        )

    def applies_to(self, path: str, raw: bytes = b"") -> bool:
        if self.paths is not None and path not in self.paths:
            return False
        text = raw.decode("utf-8", "replace")
        if self.body_contains is not None and self.body_contains not in text:
            return False
        return self.body_lacks is None or self.body_lacks not in text

    def next_status(self) -> int | None:
        if self.statuses:
            return self.statuses.pop(0)
        return self.status


def _matches(value: Any, hint: Any) -> bool:
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if get_origin(hint) is list:
        return isinstance(value, list) and all(_matches(v, get_args(hint)[0]) for v in value)
    if get_origin(hint) is dict:
        return isinstance(value, dict)
    if get_origin(hint) is UnionType:
        return any(_matches(value, h) for h in get_args(hint))
    return isinstance(value, hint)


@dataclass
class Record:
    seq: int
    path: str
    method: str
    headers: dict[str, str]
    body: Any
    received_at: float
    completed: bool = False
    disconnected: bool = False
    chunks_sent: int = 0
    finished_at: float | None = None
    content_type: str | None = None
    body_size: int = 0
    body_sha256: str = ""
    form: list[JSON] | None = None  # the parts of a multipart form, in order
    query: str = ""


@dataclass
class State:
    model_id: str
    script: Script = field(default_factory=Script)
    requests: list[Record] = field(default_factory=list)
    health_requests: list[JSON] = field(default_factory=list)
    slots_decoded: dict[int, int] = field(default_factory=dict)  # per slot id
    seq: int = 0
    shutting_down: bool = False
    active: set[asyncio.Event] = field(default_factory=set)
    on_first_healthy: Callable[[], None] | None = None  # called at the first /health 200
    # As llama-server: --slot-save-path, --parallel, and the tokens each slot holds.
    slot_dir: str | None = None
    parallel: int = 1
    slot_tokens: dict[int, int] = field(default_factory=dict)

    def shutdown(self) -> None:
        self.shutting_down = True
        for stop in self.active:
            stop.set()


class AbortConnection(Exception):
    """Raised inside a response to make uvicorn drop the connection without finishing it."""


class _DropAbortLogs(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], AbortConnection))


def error_body(status: int, message: str | None = None, kind: str = "fake") -> JSON:
    return {"error": {"message": message or f"scripted {status}", "type": kind, "code": status}}


def _overflow(literal: str) -> float:
    value = float(literal)  # for an integer too: like llama-server, which stores it as a double
    if not math.isfinite(value):
        raise ValueError(f"number overflow parsing '{literal[:40]}'")
    return value


def _no_constant(literal: str) -> None:
    raise ValueError(f"syntax error while parsing value - invalid literal; last read: '{literal}'")


def llama_json_error(raw: bytes) -> str | None:
    """Mimics llama-server: why its JSON parser (nlohmann::json) refuses ``raw``, else None.
    llama-server answers such a body with 500 (see ``proxied``). Written apart from the
    router's own parser, so that a hole in that one is not also a hole here: not UTF-8
    (a leading UTF-8 BOM is skipped), NaN/Infinity, a number that overflows a double, a
    lone surrogate escape. Nesting too deep for Python counts too (a 500 either way)."""
    try:
        text = raw.decode("utf-8").removeprefix("\ufeff")
        value = json.loads(
            text, parse_constant=_no_constant, parse_float=_overflow, parse_int=_overflow
        )
        json.dumps(value, ensure_ascii=False).encode("utf-8")  # fails on a lone surrogate
    except (ValueError, RecursionError) as exc:
        return f"[json.exception.parse_error.101] parse error: {exc}"
    return None


def sse(data: JSON | str) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {text}\n\n".encode()


async def wait_event(event: asyncio.Event, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for ``event``; True if it was set."""
    try:
        await asyncio.wait_for(event.wait(), timeout)
    except TimeoutError:
        return False
    return True


class ScriptedResponse(Response):
    """Sends a JSON body or an SSE stream, honouring delay/stall/abort and client disconnects."""

    def __init__(
        self,
        state: State,
        record: Record | None,
        script: Script,
        *,
        status: int = 200,
        payload: Any = None,
        events: Events | None = None,
        stall: bool = False,
        headers: dict[str, str] | None = None,
        content: bytes | None = None,
        media_type: str = "application/json",
        progress: Callable[[int], bytes] | None = None,
    ) -> None:
        self.state, self.record, self.script, self.status_code = state, record, script, status
        self.progress = progress  # the report of a per-mille of the prompt read
        self.events, self.stall, self.final_sent = events, stall, False
        self.body = json.dumps(payload).encode() if events is None else b""
        if content is not None:
            self.body = content
        kind = {"content-type": media_type, "content-length": str(len(self.body))}
        if events is not None:
            kind = {"content-type": "text/event-stream", "cache-control": "no-cache"}
        self.extra_headers = {**kind, **(headers or {})}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        stop = asyncio.Event()
        if self.state.shutting_down:
            stop.set()
        self.state.active.add(stop)
        watcher = asyncio.create_task(self._watch(receive, stop))
        try:
            await self._run(send, stop)
        finally:
            self.state.active.discard(stop)
            watcher.cancel()
            with suppress(asyncio.CancelledError):
                await watcher
            if self.record is not None:
                self.record.finished_at = time.monotonic()

    async def _watch(self, receive: Receive, stop: asyncio.Event) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                if self.record is not None and not self.final_sent:
                    self.record.disconnected = True
                stop.set()
                return

    def _stopped(self) -> None:
        if self.state.shutting_down:
            raise AbortConnection("shutting down")
        # Otherwise the client went away: return quietly, nothing more can be sent.

    async def _run(self, send: Send, stop: asyncio.Event) -> None:
        raw_headers = [(k.encode(), v.encode()) for k, v in self.extra_headers.items()]
        start = {"type": "http.response.start", "status": self.status_code, "headers": raw_headers}
        if self.stall:
            await stop.wait()
        elif self.progress is not None:  # as llama-server: the head, then the reports
            await send(start)
            if not await self._read_prompt(send, stop, self.progress):
                return
        elif self.script.delay_seconds > 0:
            await wait_event(stop, self.script.delay_seconds)
        if stop.is_set():
            self._stopped()
            return
        if self.progress is None:
            await send(start)
        if self.events is not None:
            prefix, content, suffix = self.events
            for event in prefix:
                await send({"type": "http.response.body", "body": event, "more_body": True})
            if not await self._send_content(send, stop, content):
                return
            for event in suffix:
                await send({"type": "http.response.body", "body": event, "more_body": True})
        await asyncio.sleep(0)  # let a pending disconnect notification reach the watcher
        if stop.is_set():
            self._stopped()
            return
        self.final_sent = True
        await send({"type": "http.response.body", "body": self.body, "more_body": False})
        if self.record is not None:
            self.record.completed = True

    async def _read_prompt(
        self, send: Send, stop: asyncio.Event, report: Callable[[int], bytes]
    ) -> bool:
        """The prompt progress reports over ``delay_seconds``; False if stopped."""
        loop = asyncio.get_running_loop()
        delay, interval = self.script.delay_seconds, self.script.progress_interval_seconds
        begun = loop.time()
        await send({"type": "http.response.body", "body": report(0), "more_body": True})
        while (left := begun + delay - loop.time()) > 0:
            await wait_event(stop, min(left, interval))
            if stop.is_set():
                self._stopped()
                return False
            share = min(999, int(1000 * (loop.time() - begun) / delay))
            await send({"type": "http.response.body", "body": report(share), "more_body": True})
        await send({"type": "http.response.body", "body": report(1000), "more_body": True})
        return True

    async def _send_content(self, send: Send, stop: asyncio.Event, content: list[bytes]) -> bool:
        """Send the content chunks; False if stopped by a disconnect. Honours fail_after."""
        fail_after, interval = self.script.fail_mid_stream_after, self.script.chunk_interval_seconds
        for sent, event in enumerate(content):
            if fail_after is not None and sent >= fail_after:
                raise AbortConnection(f"scripted failure after {sent} chunks")
            if sent > 0 and interval > 0:
                await wait_event(stop, interval)
            if stop.is_set():
                self._stopped()
                return False
            await send({"type": "http.response.body", "body": event, "more_body": True})
            if self.record is not None:
                self.record.chunks_sent = sent + 1
        if fail_after is not None and len(content) >= fail_after:
            raise AbortConnection(f"scripted failure after {len(content)} chunks")
        return True


# ---------------------------------------------------------------- answer builders


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text", "") for p in content if isinstance(p, dict)]
        return " ".join(p for p in parts if isinstance(p, str))
    return ""


def prompt_text(path: str, body: JSON) -> str:
    """The last user message (chat, responses) or the prompt (completions)."""
    if path == "/v1/completions":
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt:
            prompt = prompt[-1]
        return prompt if isinstance(prompt, str) else ""
    items = body.get("messages") if path == "/v1/chat/completions" else body.get("input")
    if isinstance(items, str):
        return items
    if isinstance(items, list):
        for item in reversed(items):
            if isinstance(item, dict) and item.get("role", "user") == "user":
                return _text_of(item.get("content"))
    return ""


def count_words(text: str) -> int:
    return max(1, len(text.split()))


def usage(prompt: int, completion: int) -> JSON:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def generate(
    path: str, body: JSON, model: str, seq: int, script: Script
) -> tuple[JSON | None, Events | None]:
    """Return (payload, events) for a chat/text completion; events is None unless streaming."""
    chat = path == "/v1/chat/completions"
    prompt = prompt_text(path, body)
    created = int(time.time())
    base: JSON = {
        "id": f"{'chatcmpl' if chat else 'cmpl'}-fake-{seq}",
        "created": created,
        "model": model,
    }
    if not body.get("stream"):
        reply = script.reply if script.reply is not None else f"fake reply to: {prompt[:80]}"
        choice: JSON = {"index": 0, "logprobs": None, "finish_reason": "stop"}
        if chat and script.tool_calls is not None:
            calls = [_tool_call(seq, i, c) for i, c in enumerate(script.tool_calls)]
            choice["message"] = {"role": "assistant", "content": None, "tool_calls": calls}
            choice["finish_reason"] = "tool_calls"
        elif chat:
            choice["message"] = {"role": "assistant", "content": reply}
        if chat and script.reasoning is not None:
            choice["message"]["reasoning_content"] = script.reasoning
        if not chat:
            choice["text"] = reply
        return {
            **base,
            "object": "chat.completion" if chat else "text_completion",
            "system_fingerprint": "fake",
            "choices": [choice],
            "usage": usage(count_words(prompt), count_words(reply)),
        }, None
    kind = "chat.completion.chunk" if chat else "text_completion"

    def chunk(text: str | None, finish: str | None, role: bool = False) -> bytes:
        choice: JSON = {"index": 0, "logprobs": None, "finish_reason": finish}
        if chat:
            delta: JSON = {"role": "assistant", "content": ""} if role else {}
            choice["delta"] = {**delta, "content": text} if text is not None else delta
        else:
            choice["text"] = text or ""
        return sse({**base, "object": kind, "choices": [choice]})

    def delta(fields: JSON, finish: str | None = None) -> bytes:
        choice = {"index": 0, "logprobs": None, "finish_reason": finish, "delta": fields}
        return sse({**base, "object": kind, "choices": [choice]})

    prefix = [chunk(None, None, role=True)] if chat else []
    if chat and script.reasoning is not None:
        prefix.append(delta({"reasoning_content": script.reasoning}))
    content = [chunk(script.chunk_text, None) for _ in range(script.chunks)]
    suffix = [chunk(None, "stop")]
    if chat and script.tool_calls is not None:
        content = [
            sse({**base, "object": kind, "choices": [choice]})
            for choice in _tool_call_choices(seq, script.tool_calls, script.tool_piece)
        ]
        suffix = [sse({**base, "object": kind, "choices": [_finish("tool_calls")]})]
    if chat and not script.finish_chunk:
        suffix = []
    options = body.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage"):
        suffix.append(
            sse(
                {
                    **base,
                    "object": kind,
                    "choices": [],
                    "usage": usage(count_words(prompt), script.chunks),
                }
            )
        )
    suffix.append(sse("[DONE]"))
    return None, (prefix, content, suffix)


TOOL_PIECE = 8


def _tool_call(seq: int, index: int, call: JSON) -> JSON:
    function = {"name": call.get("name"), "arguments": call.get("arguments", "")}
    return {"id": f"call_fake_{seq}_{index}", "type": "function", "function": function}


def _finish(reason: str | None, delta: JSON | None = None) -> JSON:
    return {"index": 0, "logprobs": None, "finish_reason": reason, "delta": delta or {}}


def _tool_call_choices(seq: int, calls: list[JSON], size: int = TOOL_PIECE) -> list[JSON]:
    """The streamed choices of ``calls``: each opened with its id and name, then its
    arguments piece by piece, as llama-server streams them."""
    choices = []
    for index, call in enumerate(calls):
        whole = _tool_call(seq, index, call)
        opening = {**whole, "index": index, "function": {**whole["function"], "arguments": ""}}
        choices.append(_finish(None, {"tool_calls": [opening]}))
        arguments = str(whole["function"]["arguments"])
        for at in range(0, len(arguments), max(1, size)):
            piece = {"index": index, "function": {"arguments": arguments[at : at + max(1, size)]}}
            choices.append(_finish(None, {"tool_calls": [piece]}))
    return choices


def embedding(text: str) -> list[float]:
    digest = hashlib.sha256(text.encode()).digest()
    return [
        round(int.from_bytes(digest[i : i + 4], "big") / 2**31 - 1.0, 6) for i in range(0, 32, 4)
    ]


def embeddings(body: JSON, model: str) -> JSON:
    raw = body.get("input", "")
    inputs = [raw] if isinstance(raw, str) or (raw and isinstance(raw[0], int)) else list(raw)
    texts = [x if isinstance(x, str) else json.dumps(x) for x in inputs]
    data = []
    for index, text in enumerate(texts):
        vector: Any = embedding(text)
        if body.get("encoding_format") == "base64":
            vector = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
        data.append({"object": "embedding", "index": index, "embedding": vector})
    tokens = sum(count_words(t) for t in texts)
    return {
        "object": "list",
        "model": model,
        "data": data,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def rerank(body: JSON, model: str) -> JSON:
    query = set(str(body.get("query", "")).lower().split())
    documents = [
        _text_of([d]) if isinstance(d, dict) else str(d) for d in body.get("documents", [])
    ]
    scored = [
        {"index": i, "relevance_score": float(len(query & set(d.lower().split())))}
        for i, d in enumerate(documents)
    ]
    scored.sort(key=lambda r: -r["relevance_score"])
    top_n = body.get("top_n")
    if isinstance(top_n, int):
        scored = scored[:top_n]
    tokens = count_words(" ".join(query)) + sum(count_words(d) for d in documents)
    return {
        "model": model,
        "object": "list",
        "results": scored,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def responses_answer(body: JSON, model: str, seq: int, script: Script) -> JSON:
    prompt = prompt_text("/v1/responses", body)
    reply = script.reply if script.reply is not None else f"fake reply to: {prompt[:80]}"
    item = {
        "type": "message",
        "id": f"msg_fake_{seq}",
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": reply, "annotations": []}],
    }
    inp, out = count_words(prompt), count_words(reply)
    return {
        "id": f"resp_fake_{seq}",
        "object": "response",
        "created_at": int(time.time()),
        "model": model,
        "status": "completed",
        "output": [item],
        "usage": {"input_tokens": inp, "output_tokens": out, "total_tokens": inp + out},
    }


def fake_image(*seed: object) -> str:
    """A few deterministic bytes that start like a PNG, base64-encoded."""
    digest = hashlib.sha256(json.dumps(seed, default=str).encode()).digest()
    return base64.b64encode(b"\x89PNG\r\n\x1a\n" + digest).decode()


def images_answer(prompt: str, count: int, *seed: object) -> JSON:
    return {
        "created": int(time.time()),
        "data": [{"b64_json": fake_image(prompt, index, *seed)} for index in range(count)],
    }


def form_value(form: list[JSON], name: str) -> str | None:
    """The last text value of field ``name`` (as FastAPI reads a single field)."""
    values = [p["value"] for p in form if p["name"] == name and "value" in p]
    return values[-1] if values else None


def form_files(form: list[JSON], *names: str) -> list[JSON]:
    return [p for p in form if p["name"] in names and "filename" in p]


def transcript_text(upload: JSON, script: Script) -> str:
    if script.reply is not None:
        return script.reply
    return f"fake transcript of {upload['filename']} ({upload['size']} bytes)"


def transcription(
    form: list[JSON], model: str, seq: int, script: Script
) -> tuple[bytes, str, Events | None]:
    """(content, content type, events) answering a transcription; events for a stream."""
    [upload] = form_files(form, "file")
    text = transcript_text(upload, script)
    if (form_value(form, "stream") or "").lower() in ("1", "true", "yes", "on"):
        base: JSON = {
            "id": f"transcription-fake-{seq}",
            "object": "transcription.chunk",
            "created": int(time.time()),
            "model": model,
        }

        def chunk(content: str, finish: str | None) -> bytes:
            choice = {"index": 0, "delta": {"content": content}, "finish_reason": finish}
            return sse({**base, "choices": [choice]})

        content = [chunk(script.chunk_text, None) for _ in range(script.chunks)]
        return b"", "text/event-stream", ([], content, [chunk("", "stop"), sse("[DONE]")])
    kind = form_value(form, "response_format") or "json"
    if kind == "srt":
        return f"1\n00:00:00,000 --> 00:00:01,000\n{text}\n".encode(), TRANSCRIPT_TYPES[kind], None
    if kind == "vtt":
        body = f"WEBVTT\n\n00:00:00.000 --> 00:00:01.000\n{text}\n"
        return body.encode(), TRANSCRIPT_TYPES[kind], None
    if kind == "text":
        return text.encode(), TRANSCRIPT_TYPES[kind], None
    answer: JSON = {"text": text, "usage": {"type": "duration", "seconds": 1}}
    if kind == "verbose_json":
        answer.update(
            task="transcribe",
            language=form_value(form, "language") or "en",
            duration=1.0,
            segments=[{"id": 0, "start": 0.0, "end": 1.0, "text": text}],
        )
    return json.dumps(answer).encode(), "application/json", None


async def read_form(request: Request) -> list[JSON] | None:
    """The parts of a multipart/form-data body, in order; None when it is not one."""
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        return None
    try:
        async with request.form(max_part_size=64 * 1024 * 1024) as form:
            parts: list[JSON] = []
            for name, value in form.multi_items():
                if isinstance(value, str):
                    parts.append({"name": name, "value": value})
                    continue
                content = await value.read()
                parts.append(
                    {
                        "name": name,
                        "filename": value.filename,
                        "content_type": value.content_type,
                        "size": len(content),
                        "sha256": hashlib.sha256(content).hexdigest(),
                    }
                )
            return parts
    except Exception:  # MultiPartException, or a KeyError for a missing boundary
        return None


# ---------------------------------------------------------------- endpoints


def _state(request: Request) -> State:
    state: State = request.app.state.fake
    return state


async def proxied(request: Request) -> Response:
    state = _state(request)
    raw = await request.body()
    try:
        body: Any = json.loads(raw) if raw else None
    except (ValueError, RecursionError):
        body = None
    path = request.url.path
    refused = llama_json_error(raw) if raw and path not in FORM_PATHS else None
    if refused is not None:
        body = None  # never parsed, as in llama-server (and /_requests could not show it)
    state.seq += 1
    headers: dict[str, str] = {}
    for key, value in request.headers.items():
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    record = Record(state.seq, path, request.method, headers, body, time.monotonic())
    record.content_type = request.headers.get("content-type")
    record.query = request.url.query
    record.body_size = len(raw)
    record.body_sha256 = hashlib.sha256(raw).hexdigest()
    if path in FORM_PATHS:
        record.form = await read_form(request)
    state.requests.append(record)
    if path in ("/v1/chat/completions", "/v1/completions", "/v1/responses"):
        state.slot_tokens[0] = max(1, len(raw) // 4)
    script = state.script if state.script.applies_to(path, raw) else state.script.shape_only()
    out_headers = {"x-fake-backend": state.model_id, "x-fake-seq": str(record.seq)}

    def answer(
        status: int = 200,
        payload: Any = None,
        events: Events | None = None,
        content: bytes | None = None,
        media_type: str = "application/json",
        progress: Callable[[int], bytes] | None = None,
    ) -> Response:
        return ScriptedResponse(
            state,
            record,
            script,
            status=status,
            payload=payload,
            events=events,
            headers=out_headers,
            content=content,
            media_type=media_type,
            progress=progress,
        )

    if refused is not None:  # llama-server's answer to a body its parser refuses
        return answer(500, {"error": {"code": 500, "message": refused, "type": "server_error"}})
    if script.exit_on_request:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(3)
    if script.stall:
        return ScriptedResponse(state, record, script, stall=True)
    status = script.next_status()
    if status is not None and status != 200:
        return answer(status, error_body(status, script.error_message))
    if path.startswith("/echo/"):
        return answer(payload=native.echo(request.method, path, record.query, raw, headers))
    if path in native.NATIVE_PATHS:
        return native_answer(path, body, script, state.model_id, answer)
    if request.method == "GET":
        return answer(
            payload={
                "object": "list",
                "data": [
                    {"id": state.model_id, "object": "model", "created": 0, "owned_by": "fake"}
                ],
            }
        )
    if path in FORM_PATHS:
        return form_answer(path, record, script, answer, state.model_id)
    if not isinstance(body, dict):
        return answer(
            400, error_body(400, "request body must be a JSON object", "invalid_request_error")
        )
    requested = body.get("model")
    model = requested if isinstance(requested, str) else state.model_id
    if path == "/v1/embeddings":
        return answer(payload=embeddings(body, model))
    if path == "/v1/rerank":
        return answer(payload=rerank(body, model))
    if path == "/v1/images/generations":
        count = body.get("n", 1)
        count = count if isinstance(count, int) and 0 < count <= 10 else 1
        return answer(payload=images_answer(str(body.get("prompt", "")), count, body.get("size")))
    if path == "/v1/responses":
        if not script.responses:
            return answer(404, error_body(404, f"Not Found: {path}", "not_found_error"))
        return answer(payload=responses_answer(body, model, record.seq, script))
    payload, events = generate(path, body, model, record.seq, script)
    progress = None
    if events is not None and body.get("return_progress") is True:
        progress = progress_reports(path, body, model, record.seq)
    return answer(payload=payload, events=events, progress=progress)


def native_answer(
    path: str, body: Any, script: Script, model: str, answer: Callable[..., Response]
) -> Response:
    """llama-server's own routes (``tests.fakes.native_routes``)."""
    if not isinstance(body, dict):
        return answer(400, native.error(400, "request body must be a JSON object", "invalid"))
    simple = {
        "/tokenize": native.tokenize,
        "/detokenize": native.detokenize,
        "/apply-template": native.apply_template,
    }.get(path)
    if simple is not None:
        payload = simple(body)
        return answer(400 if "error" in payload else 200, payload)
    if path == "/infill":
        if not script.infill:
            return answer(501, native.error(501, native.NO_FIM, "not_supported_error"))
        invalid = native.invalid_infill(body)
        if invalid is not None:
            return answer(500, invalid)
    if not body.get("stream"):
        return answer(payload=native.whole(path, body, model, script.reply))
    events = native.native_events(path, body, model, script.chunks, script.reply)
    total = max(1, len(json.dumps(body)) // 4)
    progress = None
    if body.get("return_progress") is True:

        def progress(per_mille: int) -> bytes:
            return native.progress_report(per_mille, total)

    return answer(events=([], events[:-1], events[-1:]), progress=progress)


def progress_reports(path: str, body: JSON, model: str, seq: int) -> Callable[[int], bytes]:
    """llama-server's prompt progress report of a stream, by per-mille read: a chunk of
    the stream's own kind with no content, and ``prompt_progress``."""
    chat = path == "/v1/chat/completions"
    total = max(1, count_words(prompt_text(path, body)))

    def report(per_mille: int) -> bytes:
        choice: JSON = {"finish_reason": None, "index": 0}
        if chat:
            choice["delta"] = {"role": "assistant", "content": None}
        else:
            choice |= {"text": "", "logprobs": None}
        processed = total * per_mille // 1000
        return sse(
            {
                "choices": [choice],
                "created": int(time.time()),
                "id": f"{'chatcmpl' if chat else 'cmpl'}-fake-{seq}",
                "model": model,
                "object": "chat.completion.chunk" if chat else "text_completion",
                "prompt_progress": {
                    "total": total,
                    "cache": 0,
                    "processed": processed,
                    "time_ms": 1.0,
                },
            }
        )

    return report


def form_answer(
    path: str, record: Record, script: Script, answer: Callable[..., Response], model_id: str
) -> Response:
    """Answer an image edit or a transcription: 400 unless the form has what it needs."""
    form = record.form
    if form is None:
        message = "request body must be a well-formed multipart/form-data form"
        return answer(400, error_body(400, message, "invalid_request_error"))
    model = form_value(form, "model") or model_id
    if path == "/v1/images/edits":
        images = form_files(form, "image", "image[]")
        prompt = form_value(form, "prompt")
        if not images or prompt is None:
            message = "an image edit needs an image file and a prompt"
            return answer(400, error_body(400, message, "invalid_request_error"))
        return answer(payload=images_answer(prompt, 1, *(i["sha256"] for i in images)))
    if len(form_files(form, "file")) != 1:
        message = "a transcription needs exactly one audio file in the 'file' field"
        return answer(400, error_body(400, message, "invalid_request_error"))
    content, media_type, events = transcription(form, model, record.seq, script)
    return answer(content=content, media_type=media_type, events=events)


async def health(request: Request) -> Response:
    state = _state(request)
    script = state.script
    state.health_requests.append(
        {
            "received_at": time.monotonic(),
            "status": script.health_status,
            "stalled": script.health_stall,
        }
    )
    if script.health_stall:
        return ScriptedResponse(state, None, Script(), stall=True)
    pid = {"x-fake-pid": str(os.getpid())}  # lets the test side check it reached *its* process
    if script.health_status != 200:
        return JSONResponse(error_body(script.health_status), script.health_status, pid)
    if state.on_first_healthy is not None:
        state.on_first_healthy()
        state.on_first_healthy = None
    return JSONResponse({"status": "ok"}, headers=pid)


def slots_answer(state: State) -> list[JSON]:
    """llama-server's GET /slots (``server_slot::to_json`` at the pinned llama.cpp):
    busy slots advance their ``n_decoded`` by one per call while ``slots_progress``."""
    script, answer = state.script, []
    for slot in range(script.slots or 0):
        busy = slot < script.busy_slots
        decoded = state.slots_decoded.get(slot, 0)
        if busy and script.slots_progress:
            decoded += 1
            state.slots_decoded[slot] = decoded
        next_token = {"has_next_token": busy, "has_new_line": False, "n_remain": -1}
        answer.append(
            {
                "id": slot,
                "n_ctx": 4096,
                "speculative": False,
                "is_processing": busy,
                "id_task": 1000 + slot,
                "n_prompt_tokens": 8,
                "n_prompt_tokens_processed": 8,
                "n_prompt_tokens_cache": 0,
                "params": {"n_predict": -1, "stream": True},
                "next_token": [{**next_token, "n_decoded": decoded}],
            }
        )
    return answer


async def slots(request: Request) -> Response:
    state = _state(request)
    if state.script.slots is None:
        return JSONResponse(error_body(404, "Not Found: /slots", "not_found_error"), 404)
    if state.script.slots_stall:
        return ScriptedResponse(state, None, Script(), stall=True)
    return JSONResponse(slots_answer(state))


SLOT_MAGIC = b"FAKE-SLOT-1\n"


async def slot_action(request: Request) -> Response:
    """llama-server's POST /slots/{id}?action=save|restore, in its answers' shapes."""
    state = _state(request)
    if state.slot_dir is None:
        message = "This server does not support slots action. Start it with `--slot-save-path`"
        return JSONResponse(error_body(501, message, "not_supported_error"), 501)
    try:
        slot = int(request.path_params["slot"])
        name = json.loads(await request.body())["filename"]
    except (ValueError, KeyError, TypeError):
        return JSONResponse(error_body(400, "Invalid request"), 400)
    if not 0 <= slot < state.parallel:
        return JSONResponse(error_body(400, "Invalid slot ID"), 400)
    if not isinstance(name, str) or "/" in name or name.startswith("."):
        return JSONResponse(error_body(400, "Invalid filename"), 400)
    path = os.path.join(state.slot_dir, name)
    action = request.query_params.get("action")
    if action == "save":
        tokens = state.slot_tokens.get(slot, 0)
        data = SLOT_MAGIC + json.dumps({"slot": slot, "tokens": tokens}).encode()
        with open(path, "wb") as handle:
            handle.write(data)
        timings = {"save_ms": 0.5}
        body = {"id_slot": slot, "filename": name, "n_saved": tokens, "n_written": len(data)}
        return JSONResponse({**body, "timings": timings})
    if action == "restore":
        try:
            with open(path, "rb") as handle:
                data = handle.read()
            saved = json.loads(data.removeprefix(SLOT_MAGIC)) if data.startswith(SLOT_MAGIC) else {}
            tokens = int(saved["tokens"])
        except (OSError, ValueError, KeyError, TypeError):
            state.slot_tokens.pop(slot, None)
            message = "Unable to restore slot: invalid slot save file"
            return JSONResponse(error_body(400, message), 400)
        state.slot_tokens[slot] = tokens
        body = {"id_slot": slot, "filename": name, "n_restored": tokens, "n_read": len(data)}
        return JSONResponse({**body, "timings": {"restore_ms": 0.5}})
    return JSONResponse(error_body(400, "Invalid action"), 400)


async def props(request: Request) -> Response:
    """GET /props: what the script says (llama-server's server properties), else 404."""
    answer = _state(request).script.props
    if answer is None:
        return JSONResponse(error_body(404, "Not Found: /props", "not_found_error"), 404)
    return JSONResponse(answer)


async def control_api(request: Request) -> Response:
    """POST /_control, GET /_requests, GET /_health_requests, POST /_reset."""
    state = _state(request)
    if request.url.path == "/_requests":
        return JSONResponse([asdict(r) for r in state.requests])
    if request.url.path == "/_health_requests":
        return JSONResponse(state.health_requests)
    if request.url.path == "/_reset":
        state.script, state.seq = Script(), 0
        state.requests.clear()
        state.health_requests.clear()
        state.slots_decoded.clear()
        return JSONResponse({"ok": True})
    try:
        state.script = Script.parse(json.loads(await request.body() or b"{}"))
    except ValueError as exc:
        return JSONResponse({"error": {"message": str(exc), "type": "invalid_script"}}, 422)
    return JSONResponse({"ok": True, "script": asdict(state.script)})


def build_app(model_id: str) -> Starlette:
    routes = [Route(p, proxied, methods=["POST"]) for p in PROXIED_POST]
    routes += [Route(p, proxied, methods=["POST"]) for p in native.NATIVE_PATHS]
    routes += [Route("/echo/{rest:path}", proxied, methods=["GET", "POST", "PUT", "DELETE"])]
    routes += [
        Route("/v1/models", proxied, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/slots", slots, methods=["GET"]),
        Route("/props", props, methods=["GET"]),
        Route("/slots/{slot}", slot_action, methods=["POST"]),
    ]
    routes += [Route(p, control_api, methods=["POST"]) for p in ("/_control", "/_reset")]
    routes += [Route(p, control_api, methods=["GET"]) for p in ("/_requests", "/_health_requests")]
    app = Starlette(routes=routes)
    app.state.fake = State(model_id=model_id)
    return app


class FakeServer(uvicorn.Server):
    """uvicorn server that also wakes stalled/streaming requests on SIGTERM/SIGINT."""

    def __init__(
        self, config: uvicorn.Config, state: State, on_started: Callable[[], None] | None = None
    ) -> None:
        super().__init__(config)
        self.fake_state = state
        self.on_started = on_started
        self.loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets: Any = None) -> None:
        self.loop = asyncio.get_running_loop()
        await super().serve(sockets)

    async def startup(self, sockets: Any = None) -> None:
        await super().startup(sockets)  # exits the process if the port cannot be bound
        if self.on_started is not None and not self.should_exit:
            self.on_started()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self.fake_state.shutdown)


def _exit_cleanly(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


def _exit_with_parent(parent_pid: int) -> None:
    """Never outlive the test process that started us (e.g. if pytest is SIGKILLed)."""
    while os.getppid() == parent_pid:
        time.sleep(0.5)
    os._exit(4)


def serve(
    app: Starlette, host: str, port: int, on_started: Callable[[], None] | None = None
) -> int:
    """Serve ``app`` until SIGTERM/SIGINT (exit code 0); 1 if it never started."""
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        http="h11",
        ws="none",
        loop="asyncio",
        lifespan="off",
        log_level="info",
        access_log=False,
        timeout_keep_alive=30,
        timeout_graceful_shutdown=2,
    )
    logging.getLogger("uvicorn.error").addFilter(_DropAbortLogs())
    server = FakeServer(config, app.state.fake, on_started)
    # uvicorn re-raises the captured signal after its graceful shutdown: exit with code 0.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _exit_cleanly)
    server.run()
    return 0 if server.started else 1


def main_as_llama_server(argv: list[str]) -> int:
    """Stand in for llama-server (see ``tests.fakes.startup``)."""
    try:
        start = startup.prepare(argv)
    except startup.StartupExit as exc:
        startup.say(exc.message)
        return exc.code
    try:
        script = Script.parse(start.behaviour.script)
    except ValueError as exc:
        startup.say(f"fake: {start.model}: bad script: {exc}")
        return 2
    startup.say(start.describe())
    app = build_app(start.alias)
    app.state.held_memory = startup.hold_memory(start.behaviour.footprint_mb)
    app.state.fake.script = script
    app.state.fake.slot_dir = start.slot_save_path
    app.state.fake.parallel = start.parallel
    after = start.behaviour.exit_after_seconds
    if after is not None:
        app.state.fake.on_first_healthy = lambda: startup.exit_later(after)

    def started() -> None:
        if start.behaviour.ignore_sigterm:  # after uvicorn installed its own handlers
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        startup.say(start.listening())

    return serve(app, start.host, start.port, started)


def main(argv: list[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else argv
    if arguments[:1] == [startup.FLAG]:
        return main_as_llama_server(arguments[1:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--model-id", default="fake-model")
    parser.add_argument("--parent-pid", type=int, help="exit when this parent process dies")
    args = parser.parse_args(arguments)
    if args.parent_pid is not None:
        threading.Thread(target=_exit_with_parent, args=(args.parent_pid,), daemon=True).start()
    return serve(build_app(args.model_id), args.host, args.port)


if __name__ == "__main__":
    sys.exit(main())
