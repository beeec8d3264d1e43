"""Raw passthrough (``/upstream/<model>/<path>``) and filling in the middle (``/infill``,
completions with ``suffix``) on a real router in front of fake llama-servers (real
processes): answers as the engine gives them, the plugins' own request shapes
(llama.vscode's /infill, Continue's /completion and suffix), every refusal, and the
hostile clients (oversized, deep and malformed bodies, a slow body, a half-open client)
that must never cost the backend anything."""

from __future__ import annotations

import hashlib
import json
import socket
import time
from typing import Any

import httpx
import openai
import pytest

from tests import one_shot
from tests.fakes.control import FakeBackend
from tests.integration.attack_wire import Wire, request
from tests.openai_shapes import strict_completion, strict_completion_chunks
from tests.plugin_requests import VSCODE, VSCODE_WARM_UP
from tests.processes import RunningRouter, StartRouter, poll
from tests.registry_entries import registry_entry

# Its module-scoped stack starts once: one worker runs the whole module.
pytestmark = pytest.mark.xdist_group("test_upstream_infill")

FAKE_ROLES = ("coder", "plain")
JSON = {"content-type": "application/json"}
BODY_STALL = 1.0


@pytest.fixture(scope="module")
def router_process(fakes: dict[str, FakeBackend], start_router: StartRouter) -> RunningRouter:
    models = {
        "coder": registry_entry(
            "coder",
            fakes["coder"].port,
            infill=True,
            infill_default=True,
            upstream_paths=["GET /slots", "/echo/*"],
            default_timeout=10,
            max_concurrency=2,
        ),
        "plain": registry_entry("plain", fakes["plain"].port),  # its file is never read
    }
    return start_router(
        models,
        SLM_OTEL_ENABLED="false",
        SLM_MAX_BODY_MB="1",
        SLM_BODY_STALL_SECONDS=str(BODY_STALL),
        SLM_WATCHDOG_FAILURE_THRESHOLD="2",
    )


def events(router_process: RunningRouter, *names: str) -> list[dict[str, Any]]:
    path = router_process.workdir / "logs" / "watchdog.jsonl"
    if not path.exists():
        return []
    records = [json.loads(line) for line in path.read_text().splitlines() if line]
    return [r for r in records if r["event"] in names]


def streak(http: httpx.Client, role: str) -> int:
    failures: int = http.get("/v1/backends/health").json()[role]["failure_streak"]
    return failures


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/tokenize", {"content": "Hello, world"}),
        ("POST", "/tokenize", {"content": "é!", "with_pieces": True}),
        ("POST", "/detokenize", {"tokens": [72, 105]}),
        ("GET", "/props", None),
        ("POST", "/apply-template", {"messages": [{"role": "user", "content": "hi"}]}),
        ("POST", "/infill", VSCODE),
        ("POST", "/completion", {"prompt": "x", "n_predict": 4}),
        ("POST", "/tokenize", {"content": 5}),  # the engine's own 400
    ],
)
def test_upstream_answers_byte_for_byte_as_the_engine_does_directly(
    http: httpx.Client,
    fakes: dict[str, FakeBackend],
    method: str,
    path: str,
    body: dict[str, Any] | None,
) -> None:
    fakes["coder"].script(props={"default_generation_settings": {"n_ctx": 4096}})
    content = json.dumps(body).encode() if body is not None else b""
    headers = {"content-type": "application/json"}
    through = http.request(method, f"/upstream/coder{path}", content=content, headers=headers)
    direct = one_shot.request(
        method, f"{fakes['coder'].url}{path}", content=content, headers=headers
    )
    assert (through.status_code, through.content) == (direct.status_code, direct.content)
    assert through.headers["content-type"] == direct.headers["content-type"]


def test_the_engine_gets_the_request_as_the_client_wrote_it(
    http: httpx.Client, fakes: dict[str, FakeBackend]
) -> None:
    raw = b'{"b":  1,\n"a": [1, 2 ]}\n'  # spacing and order kept: never re-serialised
    for method in ("POST", "PUT", "DELETE"):
        answer = http.request(
            method,
            "/upstream/coder/echo/a/b?x=1&y=a:b",
            content=raw,
            headers={"content-type": "text/plain", "x-trace": "t1"},
        )
        assert answer.status_code == 200, answer.text
        echoed = answer.json()
        assert (echoed["method"], echoed["path"], echoed["query"]) == (
            method,
            "/echo/a/b",
            "x=1&y=a:b",
        )
        assert echoed["body"] == raw.decode()
        assert echoed["content_type"] == "text/plain"
    records = fakes["coder"].requests()
    assert [r["body_sha256"] for r in records] == [hashlib.sha256(raw).hexdigest()] * 3
    assert all(r["headers"]["x-trace"] == "t1" for r in records)


def test_a_path_that_changes_the_engine_s_state_is_403_with_why(
    http: httpx.Client, fakes: dict[str, FakeBackend]
) -> None:
    for method, path in (
        ("POST", "/slots/0?action=save"),
        ("POST", "/slots/0?action=erase"),
        ("POST", "/props"),
        ("GET", "/metrics"),
    ):
        refused = http.request(method, f"/upstream/coder{path}", json={"filename": "x"})
        assert refused.status_code == 403, path
        message = refused.json()["error"]["message"]
        assert "upstream_paths" in message
    listed = http.get("/upstream/coder/slots")  # GET /slots is listed: the fake's 404 relayed
    assert listed.status_code == 404
    assert [r["path"] for r in fakes["coder"].requests()] == []  # /slots is not recorded


def test_a_path_that_could_reach_another_is_refused(
    router: str, fakes: dict[str, FakeBackend]
) -> None:
    for path in (
        "/upstream/coder/../slots",
        "/upstream/coder/%2e%2e/slots",
        "/upstream/coder/slots%2f0",
        "/upstream/coder//tokenize",
    ):
        with Wire(router) as wire:
            wire.send(request("GET", path))
            reply = wire.response()
        assert reply.status == 400, (path, reply)
        assert json.loads(reply.body)["error"]["code"] == "invalid_upstream_path"
    assert fakes["coder"].requests() == []


def test_an_oversized_body_is_413_and_never_reaches_the_engine(
    http: httpx.Client, router: str, fakes: dict[str, FakeBackend]
) -> None:
    big = json.dumps({"content": "x" * (2 << 20)}).encode()
    answer = http.post("/upstream/coder/tokenize", content=big)
    assert answer.status_code == 413
    assert answer.json()["error"]["code"] == "request_too_large"
    with Wire(router) as wire:  # a Content-Length past the limit, nothing sent after it
        wire.send(
            b"POST /upstream/coder/tokenize HTTP/1.1\r\nhost: 127.0.0.1\r\n"
            b"content-length: 9999999\r\n\r\n"
        )
        assert wire.response().status == 413
    assert fakes["coder"].requests() == []


def test_deep_and_malformed_json_reach_the_engine_and_its_answer_is_never_counted(
    http: httpx.Client, router_process: RunningRouter, fakes: dict[str, FakeBackend]
) -> None:
    deep = b"[" * 100_000 + b"]" * 100_000
    for body in (deep, b'{"content": "x"', b'{"content": NaN}'):
        for _ in range(3):  # past the failure threshold (2), were any counted
            answer = http.post(
                "/upstream/coder/tokenize",
                content=body,
                headers={"content-type": "application/json"},
            )
            direct = one_shot.post(f"{fakes['coder'].url}/tokenize", content=body, headers=JSON)
            assert (answer.status_code, answer.content) == (direct.status_code, direct.content)
            assert answer.status_code == 500  # llama-server's answer to what it cannot parse
    assert streak(http, "coder") == 0
    assert events(router_process, "backend_failure", "restart_requested") == []
    assert http.get("/health").status_code == 200


def test_a_slow_client_body_is_the_client_s_and_never_reaches_the_engine(
    router: str, http: httpx.Client, router_process: RunningRouter, fakes: dict[str, FakeBackend]
) -> None:
    with Wire(router) as wire:
        wire.send(
            b"POST /upstream/coder/tokenize HTTP/1.1\r\nhost: 127.0.0.1\r\n"
            b'content-type: application/json\r\ncontent-length: 100\r\n\r\n{"content"'
        )
        started = time.monotonic()
        reply = wire.response()  # nothing more is sent
        waited = time.monotonic() - started
    assert reply.status == 408
    assert BODY_STALL * 0.8 < waited < BODY_STALL + 5
    assert fakes["coder"].requests() == []
    assert streak(http, "coder") == 0
    assert events(router_process, "backend_failure") == []


def test_a_half_open_client_mid_stream_closes_the_engine_s_request(
    router: str, http: httpx.Client, fakes: dict[str, FakeBackend]
) -> None:
    fakes["coder"].script(chunks=200, chunk_interval_seconds=0.05, reply="x" * 400)
    body = json.dumps({"prompt": "def f(", "stream": True, "n_predict": 400}).encode()
    host, port = router.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    try:
        sock.sendall(request("POST", "/upstream/coder/completion", body, content_type="x/json"))
        received = b""
        while b"data: " not in received:
            received += sock.recv(65536)
        assert b"200 OK" in received
    finally:
        sock.close()  # gone without a word, mid-stream
    [record] = fakes["coder"].wait_for(
        lambda reqs: len(reqs) == 1 and reqs[0]["disconnected"], timeout=10
    )
    assert record["chunks_sent"] < 200
    poll(lambda: http.get("/v1/backends/health").json()["coder"]["in_flight"] == 0, 5, "slot free")
    assert streak(http, "coder") == 0


def test_continue_s_llama_cpp_request_streams_through_upstream(
    http: httpx.Client, fakes: dict[str, FakeBackend]
) -> None:
    """Continue's llama.cpp provider (core/llm/llms/LlamaCpp.ts) posts to the server's
    /completion with the FIM template in the prompt and reads the stream's ``content``."""
    fakes["coder"].script(chunks=4, reply="a + b")
    body = {
        "prompt": "<fim_prefix>def add(a, b):\n    return<fim_suffix>\n<fim_middle>",
        "stream": True,
        "n_predict": 64,
        "frequency_penalty": 0,
        "presence_penalty": 0,
        "min_p": 0.05,
        "mirostat": 0,
        "stop": ["<fim_prefix>", "\n\n"],
        "top_k": 40,
        "top_p": 0.95,
        "temperature": 0.01,
    }
    with http.stream("POST", "/upstream/coder/completion", json=body) as answer:
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in answer.iter_lines() if line.startswith("data: ")]
    parsed = [json.loads(line[6:]) for line in lines]
    assert "".join(p["content"] for p in parsed) == "a + b"
    assert parsed[-1]["stop"] is True
    assert fakes["coder"].requests()[0]["body"] == body


def test_llama_vscode_s_requests_go_to_the_default_model(
    http: httpx.Client, fakes: dict[str, FakeBackend]
) -> None:
    warm = http.post("/infill", json=VSCODE_WARM_UP)
    assert warm.status_code == 200
    answer = http.post("/infill", json=VSCODE)
    assert answer.status_code == 200
    assert answer.json()["content"] == "middle(dd(a, b):\n    return|\n\nprint(add(1, 2))\n)"
    sent = fakes["coder"].requests()
    assert [r["path"] for r in sent] == ["/infill", "/infill"]
    assert sent[1]["body"] == VSCODE  # as the plugin wrote it
    assert fakes["plain"].requests() == []


def test_a_streamed_infill_is_llama_server_s_own_stream(
    http: httpx.Client, fakes: dict[str, FakeBackend]
) -> None:
    fakes["coder"].script(chunks=3, reply="abcdef")
    body = {**VSCODE, "model": "coder", "stream": True}
    with http.stream("POST", "/infill", json=body) as answer:
        assert answer.status_code == 200
        lines = [line for line in answer.iter_lines() if line.startswith("data: ")]
    parsed = [json.loads(line[6:]) for line in lines]
    assert [p["content"] for p in parsed] == ["ab", "cd", "ef", ""]
    assert parsed[-1]["stop"] is True and "prompt_progress" not in lines[0]


def test_a_model_that_cannot_fill_in_is_400_and_never_asked(
    http: httpx.Client, fakes: dict[str, FakeBackend]
) -> None:
    for path, body in (
        ("/infill", {**VSCODE, "model": "plain"}),
        ("/v1/completions", {"model": "plain", "prompt": "a", "suffix": "b"}),
    ):
        answer = http.post(path, json=body)
        assert answer.status_code == 400
        error = answer.json()["error"]
        assert (error["code"], error["param"]) == ("infill_not_supported", "model")
        assert "set infill: true" not in error["message"]
    assert fakes["plain"].requests() == []
    models = {m["id"]: m["infill"] for m in http.get("/v1/models").json()["data"]}
    assert models == {"coder": True, "plain": None}


def test_the_official_client_s_suffix_gets_the_middle(
    router: str, fakes: dict[str, FakeBackend]
) -> None:
    """Continue's FIM fields on completions (core/llm/llms/OpenAI.ts, _streamFim), through
    the openai package, whole and streamed."""
    fields: dict[str, Any] = {
        "model": "coder",
        "prompt": "def add(a, b):\n    return",
        "suffix": "\n\nprint(add(1, 2))\n",
        "max_tokens": 32,
        "temperature": 0.01,
        "top_p": 0.95,
        "frequency_penalty": 0,
        "presence_penalty": 0,
        "stop": ["\n\n"],
    }
    with openai.OpenAI(base_url=f"{router}/v1", api_key="unused", max_retries=0) as client:
        whole = client.completions.create(**fields)
        strict_completion(whole.model_dump(exclude_unset=True))
        assert whole.choices[0].text == "middle(dd(a, b):\n    return|\n\nprint(add(1, 2))\n)"
        stream = client.completions.create(
            **fields, stream=True, stream_options={"include_usage": True}
        )
        chunks = [chunk.model_dump(exclude_unset=True) for chunk in stream]
    strict_completion_chunks(chunks)
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert text == whole.choices[0].text
    assert chunks[-1]["usage"]["completion_tokens"] > 0
    sent = [r["body"] for r in fakes["coder"].requests()]
    assert [s["input_prefix"] for s in sent] == [fields["prompt"]] * 2
    assert all("suffix" not in s for s in sent)
