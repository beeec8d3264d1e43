"""The translating tap (a translated stream spliced): whatever pieces the backend's
bytes come in, the client gets the very events the piece-by-piece walk
(``ChatTranslation.stream``) gives for the same stream — Ollama's lines here — with
the engine's progress reports kept out, an in-band error ending the stream in the
API's own shape, and the closing lines once the backend's stream ends."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slm_server.errors import BackendProtocolError
from slm_server.router.apis.ollama.answers import Clock, Kind
from slm_server.router.apis.ollama.endpoint import OllamaTranslation
from slm_server.router.call.exchange import ANSWERING, Exchange
from slm_server.router.upstream.sse import data_object

MAX_EVENT = 1 << 16


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


STREAM: list[dict[str, Any]] = [
    {"prompt_progress": {"total": 10, "cache": 0, "processed": 5}},
    chunk({"role": "assistant", "content": ""}),
    chunk({"reasoning_content": "hm"}),
    *(chunk({"content": piece}) for piece in ("Hel", "lo", ' "you"', " \\ é\n")),
    chunk({}, "stop"),
    {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 4}},
]


def sse(events: list[dict[str, Any]], done: bool = True) -> bytes:
    body = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    return body + (b"data: [DONE]\n\n" if done else b"")


def translation() -> OllamaTranslation:
    request = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    return OllamaTranslation(request, Kind(chat=True), Clock(time.perf_counter()))


def without_times(lines: bytes) -> list[dict[str, Any]]:
    parsed = [json.loads(line) for line in lines.splitlines()]
    for line in parsed:
        for name in ("created_at", "total_duration", "eval_duration", "prompt_eval_duration"):
            line.pop(name, None)
    return parsed


async def walked(body: bytes) -> bytes:
    """The piece-by-piece walk's answer to the same stream."""
    events = [e + b"\n\n" for e in body.split(b"\n\n") if e]

    async def parsed() -> AsyncIterator[dict[str, Any]]:
        for event in events:
            value = data_object(event)
            if value is None or value == {}:
                continue
            yield value

    exchange = Exchange("w", "POST", "/api/chat")
    return b"".join([line async for line in translation().stream(parsed(), exchange)])


def tapped(body: bytes, cuts: list[int]) -> tuple[bytes, Exchange]:
    exchange = Exchange("t", "POST", "/api/chat")
    tap = translation().tap(exchange, MAX_EVENT)
    assert tap is not None
    out, at = [], 0
    for cut in sorted({c % (len(body) + 1) for c in cuts}):
        out.append(tap.feed(body[at:cut]))
        at = cut
    out.append(tap.feed(body[at:]))
    out.append(tap.flush())
    return b"".join(out), exchange


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=4000), max_size=12))
def test_any_split_gives_the_walk_s_lines(cuts: list[int]) -> None:
    body = sse(STREAM)
    got, exchange = tapped(body, cuts)
    assert without_times(got) == without_times(asyncio.run(walked(body)))
    assert exchange.stage == ANSWERING and exchange.output_tokens == 4


def test_the_lines_are_ollama_s() -> None:
    got, _ = tapped(sse(STREAM), [])
    lines = without_times(got)
    assert [line["done"] for line in lines] == [False] * 5 + [True]
    assert lines[0]["message"] == {"role": "assistant", "content": "", "thinking": "hm"}
    assert "".join(line["message"]["content"] for line in lines) == 'Hello "you" \\ é\n'
    assert lines[-1]["done_reason"] == "stop" and lines[-1]["eval_count"] == 4


def test_an_in_band_error_ends_the_stream_in_ollama_s_shape() -> None:
    body = sse([chunk({"content": "a"}), {"error": {"message": "boom"}}, chunk({"content": "b"})])
    got, _ = tapped(body, [10, 60])
    lines = [json.loads(line) for line in got.splitlines()]
    assert lines[-1] == {"error": "boom"}
    assert [line.get("message", {}).get("content") for line in lines[:-1]] == ["a"]


def test_a_stream_without_done_still_closes() -> None:
    got, _ = tapped(sse(STREAM, done=False), [33])
    assert json.loads(got.splitlines()[-1])["done"] is True


def test_malformed_data_is_the_backend_s_fault_named() -> None:
    exchange = Exchange("t", "POST", "/api/chat")
    tap = translation().tap(exchange, MAX_EVENT)
    assert tap is not None
    with pytest.raises(BackendProtocolError, match="malformed"):
        tap.feed(b"data: {nope\n\n")


def test_a_guarded_translation_is_walked_not_spliced() -> None:
    held = translation()
    held.tools = object()  # type: ignore[assignment]  # any settler: calls are held
    assert held.tap(Exchange("t", "POST", "/api/chat"), MAX_EVENT) is None
