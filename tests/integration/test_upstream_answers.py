"""Reading and relaying backends' answers (router/upstream/client.py, router/answer/) when
backends misbehave at the byte level, in front of a real router process: odd
statuses, SSE framed with CRLF or CR, endless events and bodies, absurdly deep JSON.
Each becomes a clean, OpenAI-shaped error (or is relayed as it arrives), the router's
memory stays bounded, and it answers ``/health`` throughout."""

from __future__ import annotations

import gzip
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests import one_shot
from tests.integration.raw_stack import SSE_HEAD, Raw, raw_stack

# Its module-scoped stack starts once: one worker runs the whole module.
pytestmark = pytest.mark.xdist_group("test_upstream_answers")

MODEL = "raw"
CHAT = "/v1/chat/completions"
HELLO = [{"role": "user", "content": "hello"}]
DELTA = json.dumps(
    {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": MODEL,
     "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": None}]}
)  # fmt: skip
ANSWER_LIMIT_MB = 1
EVENT_LIMIT_MB = 1


@pytest.fixture(scope="module")
def raw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Raw]:
    tmp = tmp_path_factory.mktemp("raw")
    with raw_stack(
        tmp, MODEL, answer_limit_mb=ANSWER_LIMIT_MB, event_limit_mb=EVENT_LIMIT_MB
    ) as stack:
        yield stack


def error_of(response: httpx.Response) -> dict[str, Any]:
    error: dict[str, Any] = response.json()["error"]
    assert set(error) >= {"message", "type", "param", "code"}
    return error


@pytest.mark.parametrize("status", [600, 999])
def test_a_status_outside_100_to_599_is_a_502(raw: Raw, status: int) -> None:
    raw.script({"send": f"HTTP/1.1 {status} Odd\r\nContent-Length: 2\r\n\r\n{{}}"})
    response = one_shot.post(f"{raw.url}{CHAT}", json={"model": MODEL, "messages": HELLO})
    assert response.status_code == 502
    error = error_of(response)
    assert error["code"] == "upstream_invalid"
    assert f"status {status}" in error["message"]
    assert raw.healthy_within()


def first_bytes_while_the_backend_holds(raw: Raw) -> bytes:
    """Stream through the router and return what arrived before the stream ended: the
    backend holds the connection open after its events, so anything the router kept
    back until the end would never arrive."""
    got: list[bytes] = []
    arrived = threading.Event()

    def read() -> None:
        body = {"model": MODEL, "messages": HELLO, "stream": True}
        with (
            httpx.Client(timeout=30, trust_env=False) as http,
            http.stream("POST", f"{raw.url}{CHAT}", json=body) as response,
        ):
            for piece in response.iter_raw():
                got.append(piece)
                if b"hi" in b"".join(got):
                    arrived.set()
                    return

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    assert arrived.wait(5), f"nothing relayed while the stream was open: {got}"
    thread.join(5)
    return b"".join(got)


@pytest.mark.parametrize("end", ["\r\n", "\r", "\n"], ids=["CRLF", "CR", "LF"])
def test_sse_is_relayed_as_it_arrives_whatever_its_line_ends(raw: Raw, end: str) -> None:
    raw.script(
        {"send": SSE_HEAD},
        {"chunk": f"data: {DELTA}{end}{end}"},
        {"hold": True},
    )
    relayed = first_bytes_while_the_backend_holds(raw)
    assert relayed == f"data: {DELTA}{end}{end}".encode(), "forwarded byte for byte"
    assert raw.healthy_within()


def test_a_crlf_split_between_chunks_is_relayed_as_it_arrives(raw: Raw) -> None:
    raw.script(
        {"send": SSE_HEAD},
        {"chunk": f"data: {DELTA}\r"},
        {"sleep": 0.2},
        {"chunk": "\n\r"},
        {"hold": True},
    )
    assert b"hi" in first_bytes_while_the_backend_holds(raw)


def test_an_endless_sse_event_ends_in_band_and_memory_stays_bounded(raw: Raw) -> None:
    before = raw.rss_mb()
    raw.script(
        {"send": SSE_HEAD},
        {"chunk": f"data: {DELTA}\n\n"},
        {"repeat": "5\r\nxxxxx\r\n", "times": 2_000_000},  # 10 MB of one event, chunked
        {"hold": True},
    )
    body = {"model": MODEL, "messages": HELLO, "stream": True}
    started = time.monotonic()
    with one_shot.stream("POST", f"{raw.url}{CHAT}", json=body, timeout=30) as response:
        assert response.status_code == 200
        lines = [line for line in response.iter_lines() if line.startswith("data:")]
    assert time.monotonic() - started < 10
    assert lines[0] == f"data: {DELTA}"
    error = json.loads(lines[-1][5:])["error"]
    assert error["code"] == "sse_event_too_large"
    assert raw.healthy_within()
    assert raw.rss_mb() - before < 40, (before, raw.rss_mb())


@pytest.mark.parametrize(
    "steps",
    [
        pytest.param(
            [
                {"send": "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{"},
                {"repeat": '"k": 1, ', "times": 2_000_000},
            ],
            id="endless-close-delimited",
        ),
        pytest.param(
            [
                {
                    "send": "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    "Transfer-Encoding: chunked\r\n\r\n"
                },
                {"repeat": '8\r\n"k": 1, \r\n', "times": 2_000_000},
            ],
            id="endless-chunked",
        ),
        pytest.param(
            [{"send": "HTTP/1.1 200 OK\r\nContent-Length: 10000000000\r\n\r\n{"}, {"hold": True}],
            id="stated-too-long",
        ),
    ],
)
def test_a_non_streaming_answer_past_the_cap_is_a_502(
    raw: Raw, steps: list[dict[str, Any]]
) -> None:
    before = raw.rss_mb()
    raw.script(*steps)
    started = time.monotonic()
    response = one_shot.post(
        f"{raw.url}{CHAT}", json={"model": MODEL, "messages": HELLO}, timeout=30
    )
    assert time.monotonic() - started < 10
    assert response.status_code == 502
    error = error_of(response)
    assert error["code"] == "upstream_too_large"
    assert "SLM_MAX_ANSWER_MB" in error["message"]
    assert raw.healthy_within()
    assert raw.rss_mb() - before < 40, (before, raw.rss_mb())


DEEP = "[" * 100_000 + "]" * 100_000


def test_deep_json_in_an_answer_is_passed_through(raw: Raw) -> None:
    raw.script(
        {"send": "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(DEEP)}\r\n\r\n{DEEP}"}
    )  # fmt: skip
    response = one_shot.post(f"{raw.url}{CHAT}", json={"model": MODEL, "messages": HELLO})
    assert response.status_code == 200
    assert response.content == DEEP.encode()


def test_deep_json_the_router_must_read_is_a_clean_502(raw: Raw) -> None:
    """``/v1/responses`` on a backend without one: the router translates the chat answer,
    so it must parse it."""
    answer = {"id": "c1", "object": "chat.completion", "created": 1, "model": MODEL}
    nested = json.dumps(answer)[:-1] + ', "x": ' + DEEP + "}"
    missing = [{"send": "HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\n\r\n{}"}]
    raw.script(
        {"send": "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(nested)}\r\n\r\n{nested}"},
        by_path={"/v1/responses": missing},
    )  # fmt: skip
    response = one_shot.post(
        f"{raw.url}/v1/chat/completions", json={"model": MODEL, "messages": HELLO}
    )
    assert response.status_code == 200  # passed through untouched
    response = one_shot.post(f"{raw.url}/v1/responses", json={"model": MODEL, "input": "hi"})
    assert response.status_code == 502, response.text[:300]
    assert error_of(response)["type"] == "backend_error"
    assert raw.healthy_within()


def test_deep_json_in_a_stream_event_is_relayed(raw: Raw) -> None:
    raw.script(
        {"send": SSE_HEAD},
        {"chunk": f"data: {DELTA}\n\n"},
        {"chunk": f"data: {DEEP}\n\n"},
        {"chunk": "data: [DONE]\n\n"},
        {"send": "0\r\n\r\n"},
    )
    body = {"model": MODEL, "messages": HELLO, "stream": True}
    with one_shot.stream("POST", f"{raw.url}{CHAT}", json=body, timeout=30) as response:
        lines = [line for line in response.iter_lines() if line.startswith("data:")]
    assert lines == [f"data: {DELTA}", f"data: {DEEP}", "data: [DONE]"]
    assert raw.healthy_within()


def gzipped_reply(body: bytes, content_type: str) -> dict[str, str]:
    packed = gzip.compress(body)
    head = (
        f"HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nContent-Encoding: gzip\r\n"
        f"Content-Length: {len(packed)}\r\n\r\n"
    )
    return {"send": head + packed.decode("latin-1")}


def test_a_gzip_answer_keeps_its_content_encoding(raw: Raw) -> None:
    answer = {"id": "c1", "object": "chat.completion", "choices": []}
    raw.script(gzipped_reply(json.dumps(answer).encode(), "application/json"))
    response = one_shot.post(f"{raw.url}{CHAT}", json={"model": MODEL, "messages": HELLO})
    assert response.status_code == 200
    assert response.headers["content-encoding"] == "gzip"
    assert response.json() == answer  # httpx decoded it: the bytes and the header agree


def test_a_gzip_stream_keeps_its_content_encoding(raw: Raw) -> None:
    events = f"data: {DELTA}\n\ndata: [DONE]\n\n".encode()
    raw.script(gzipped_reply(events, "text/event-stream"))
    body = {"model": MODEL, "messages": HELLO, "stream": True}
    with one_shot.stream("POST", f"{raw.url}{CHAT}", json=body, timeout=30) as response:
        assert response.headers["content-encoding"] == "gzip"
        assert response.read() == events


def test_a_gzip_answer_the_router_must_translate_is_a_clean_502(raw: Raw) -> None:
    missing = [{"send": "HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\n\r\n{}"}]
    raw.script(gzipped_reply(b"{}", "application/json"), by_path={"/v1/responses": missing})
    response = one_shot.post(f"{raw.url}/v1/responses", json={"model": MODEL, "input": "hi"})
    assert response.status_code == 502
    assert error_of(response)["code"] == "upstream_encoded"
    assert raw.healthy_within()


@pytest.mark.parametrize(
    "steps",
    [
        pytest.param(
            [{"send": "HTTP/1.1 200 OK\r\n"}, {"repeat": "X-Dup: 1\r\n", "times": 10_000}],
            id="ten-thousand-copies-of-one-header",
        ),
        pytest.param(
            [{"send": "HTTP/1.1 200 OK\r\nX-Endless: "}, {"repeat": "e", "times": 100_000_000}],
            id="endless-header-section",
        ),
    ],
)
def test_a_monstrous_response_head_is_a_quick_502(raw: Raw, steps: list[dict[str, Any]]) -> None:
    before = raw.rss_mb()
    raw.script(*steps)
    started = time.monotonic()
    response = one_shot.post(
        f"{raw.url}{CHAT}", json={"model": MODEL, "messages": HELLO}, timeout=30
    )
    assert time.monotonic() - started < 5
    assert response.status_code == 502
    assert "response head" in error_of(response)["message"]
    assert raw.healthy_within()
    assert raw.rss_mb() - before < 40, (before, raw.rss_mb())
