"""Huge request bodies of every costly shape, valid on the chat, Messages and Responses
routes, for the router-memory tests and the ``body_burst`` benchmark (issue 33)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psutil

MIB = 1024 * 1024
BODY = 30 * MIB
ROUTES = ("/v1/chat/completions", "/v1/messages", "/v1/responses")


def numbers(route: str) -> bytes:
    values = b",".join(b"%d" % (1000 + i % 9000) for i in range(BODY // 5))
    return _wrap(route, b'"x"', b"[" + values + b"]")


def strings(route: str) -> bytes:
    return _wrap(route, b'"' + b"x" * (BODY - 400) + b'"', None)


def objects(route: str) -> bytes:
    return _wrap(route, b'"x"', b"[" + b",".join(b'{"a":1}' for _ in range(BODY // 8)) + b"]")


def messages(route: str) -> bytes:
    """Many messages of 600 characters: allocations of every size at once, which the C
    allocator keeps (in the worker threads' arenas too) unless asked to give back."""
    one = b'{"role":"user","content":"' + b"y" * 600 + b'"}'
    listed = b"[" + b",".join(one for _ in range(BODY // (len(one) + 1))) + b"]"
    if route == "/v1/responses":
        return b'{"model":"big","input":' + listed + b"}"
    extra = b',"max_tokens":8' if route == "/v1/messages" else b""
    return b'{"model":"big","messages":' + listed + extra + b"}"


def _wrap(route: str, text: bytes, enum: bytes | None) -> bytes:
    """A valid request of ``route``'s shape whose message is ``text`` and, when given,
    with a JSON schema whose ``enum`` is ``enum`` where each API takes one (the reply's
    format for chat and Responses, a tool's input schema for Messages)."""
    schema = b'{"enum":' + enum + b"}" if enum is not None else None
    if route == "/v1/chat/completions":
        body = b'{"model":"big","messages":[{"role":"user","content":' + text + b"}]"
        if schema is not None:
            body += b',"response_format":{"type":"json_schema","json_schema":{"name":"n",'
            body += b'"schema":' + schema + b"}}"
    elif route == "/v1/messages":
        body = b'{"model":"big","max_tokens":8,"messages":[{"role":"user","content":' + text
        body += b"}]"
        if schema is not None:
            body += b',"tools":[{"name":"f","input_schema":{"type":"object","properties":'
            body += b'{"v":' + schema + b"}}}]"
    else:
        body = b'{"model":"big","input":' + text
        if schema is not None:
            body += b',"text":{"format":{"type":"json_schema","name":"n","schema":' + schema
            body += b"}}"
    return body + b"}"


SHAPES: dict[str, Callable[[str], bytes]] = {
    "messages": messages,
    "numbers": numbers,
    "objects": objects,
    "strings": strings,
}


@contextmanager
def sampled(pid: int, every: float = 0.01) -> Iterator[list[int]]:
    """The process's resident set, sampled every ``every`` seconds while the block runs."""
    process = psutil.Process(pid)
    samples = [process.memory_info().rss]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(every):
            try:
                samples.append(process.memory_info().rss)
            except psutil.Error:
                return

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield samples
    finally:
        stop.set()
        sampler.join(5)
