"""The fake backend (tests/fakes) does what the router integration tests rely on."""

from __future__ import annotations

import json
import signal
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.fakes.control import FakeBackend

# Its module-scoped stack starts once: one worker runs the whole module.
pytestmark = pytest.mark.xdist_group("test_fake_backend")

CHAT = "/v1/chat/completions"
USER_MESSAGE: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello fake world"}]


@pytest.fixture(scope="module")
def shared_fake() -> Iterator[FakeBackend]:
    """One fake process for the module's non-destructive tests (starting one costs ~0.5 s)."""
    backend = FakeBackend.start(model_id="fake-model")
    try:
        yield backend
    finally:
        backend.stop()


@pytest.fixture
def fake(shared_fake: FakeBackend) -> FakeBackend:
    """The shared fake with its recorded requests and script reset."""
    assert shared_fake.is_running(), shared_fake.output()
    shared_fake.reset()
    return shared_fake


@pytest.fixture
def own_fake() -> Iterator[FakeBackend]:
    """A fake process of its own, for tests that kill or stop it."""
    with FakeBackend.start(model_id="own-model") as backend:
        yield backend


@pytest.fixture
def client(fake: FakeBackend) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=fake.url, timeout=5.0, trust_env=False) as http:
        yield http


@pytest.fixture
def oai(fake: FakeBackend) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{fake.url}/v1", api_key="x", max_retries=0) as api:
        yield api


def sse_payloads(lines: Iterator[str]) -> list[Any]:
    """Decoded ``data:`` payloads of an SSE stream (``[DONE]`` kept as a string)."""
    out: list[Any] = []
    for line in lines:
        if line.startswith("data: "):
            data = line.removeprefix("data: ")
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def test_chat_non_stream_with_openai_client(fake: FakeBackend, oai: openai.OpenAI) -> None:
    completion = oai.chat.completions.create(model="m-echo", messages=USER_MESSAGE)
    assert completion.object == "chat.completion"
    assert completion.model == "m-echo"
    assert completion.id
    assert completion.created > 0
    choice = completion.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == "fake reply to: hello fake world"
    assert choice.finish_reason == "stop"
    assert completion.usage is not None
    usage = completion.usage
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens > 0

    [record] = fake.requests()
    assert record["seq"] == 1
    assert record["path"] == CHAT
    assert record["method"] == "POST"
    assert record["headers"]["authorization"] == "Bearer x"
    assert record["body"]["messages"] == USER_MESSAGE
    assert record["completed"] is True
    assert record["disconnected"] is False
    assert record["finished_at"] >= record["received_at"]


def test_chat_stream_with_openai_client(fake: FakeBackend, oai: openai.OpenAI) -> None:
    fake.script(chunks=3, chunk_text="ab ")
    stream = oai.chat.completions.create(
        model="m-echo",
        messages=USER_MESSAGE,
        stream=True,
        stream_options={"include_usage": True},
    )
    with stream:
        chunks = list(stream)
    assert all(c.object == "chat.completion.chunk" and c.model == "m-echo" for c in chunks)
    first, *middle, finish, usage_chunk = chunks
    assert first.choices[0].delta.role == "assistant"
    assert [c.choices[0].delta.content for c in middle] == ["ab "] * 3
    assert finish.choices[0].finish_reason == "stop"
    assert usage_chunk.choices == []
    assert usage_chunk.usage is not None
    assert usage_chunk.usage.completion_tokens == 3
    [record] = fake.requests()
    assert record["completed"] is True
    assert record["chunks_sent"] == 3


def test_completions_non_stream_and_stream(client: httpx.Client) -> None:
    response = client.post("/v1/completions", json={"model": "c", "prompt": "say hi"})
    assert response.headers["x-fake-backend"] == "fake-model"
    body = response.json()
    assert body["object"] == "text_completion"
    assert body["choices"][0]["text"] == "fake reply to: say hi"
    assert set(body["usage"]) == {"prompt_tokens", "completion_tokens", "total_tokens"}

    with client.stream(
        "POST", "/v1/completions", json={"model": "c", "prompt": "x", "stream": True}
    ) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        payloads = sse_payloads(response.iter_lines())
    assert payloads[-1] == "[DONE]"
    chunks = payloads[:-1]
    assert all(c["object"] == "text_completion" for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks) == "tok " * 8
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert not any("usage" in c for c in chunks)  # include_usage not requested


def test_chunks_arrive_spread_over_time(fake: FakeBackend, client: httpx.Client) -> None:
    fake.script(chunks=4, chunk_interval_seconds=0.2)
    arrivals: list[float] = []
    body = {"model": "m", "messages": USER_MESSAGE, "stream": True}
    with client.stream("POST", CHAT, json=body) as response:
        for line in response.iter_lines():
            if '"content":"tok "' in line:
                arrivals.append(time.monotonic())
    assert len(arrivals) == 4
    assert arrivals[0] < arrivals[-1] - 0.3


def test_statuses_queue_then_normal(fake: FakeBackend, client: httpx.Client) -> None:
    fake.script(statuses=[503, 200, 429])
    body = {"model": "m", "messages": USER_MESSAGE}
    codes = [client.post(CHAT, json=body).status_code for _ in range(4)]
    assert codes == [503, 200, 429, 200]

    fake.script(status=500)
    response = client.post(CHAT, json=body)
    assert response.status_code == 500
    assert response.json() == {"error": {"message": "scripted 500", "type": "fake", "code": 500}}

    fake.script()
    assert client.post(CHAT, json=body).status_code == 200


def test_script_paths_limit_matching(fake: FakeBackend, client: httpx.Client) -> None:
    fake.script(status=502, paths=["/v1/embeddings"])
    assert client.post(CHAT, json={"messages": USER_MESSAGE}).status_code == 200
    assert client.post("/v1/embeddings", json={"input": "a"}).status_code == 502
    assert client.get("/health").status_code == 200


def test_invalid_script_is_rejected(fake: FakeBackend) -> None:
    with pytest.raises(ValueError, match="rejected script"):
        fake.script(no_such_field=1)


def test_delay_seconds_delays_the_answer(fake: FakeBackend, client: httpx.Client) -> None:
    fake.script(delay_seconds=0.3)
    started = time.monotonic()
    assert client.post(CHAT, json={"messages": USER_MESSAGE}).status_code == 200
    assert time.monotonic() - started >= 0.3


@pytest.mark.parametrize("script", [{"stall": True}, {"delay_seconds": 30.0}])
def test_client_disconnect_before_headers_is_detected(
    fake: FakeBackend, script: dict[str, Any]
) -> None:
    fake.script(**script)
    timeout = httpx.Timeout(5.0, read=0.3)
    with (
        httpx.Client(base_url=fake.url, timeout=timeout, trust_env=False) as http,
        pytest.raises(httpx.ReadTimeout),
    ):
        http.post(CHAT, json={"messages": USER_MESSAGE})
    # The fake notes the disconnect a moment before it stamps the end: wait for both.
    [record] = fake.wait_for(
        lambda reqs: (
            len(reqs) == 1 and reqs[0]["disconnected"] and reqs[0]["finished_at"] is not None
        )
    )
    assert record["completed"] is False
    assert record["chunks_sent"] == 0


def test_stream_client_disconnect_stops_generation(fake: FakeBackend) -> None:
    fake.script(chunks=200, chunk_interval_seconds=0.02)
    body = {"messages": USER_MESSAGE, "stream": True}
    with (
        httpx.Client(base_url=fake.url, timeout=5.0, trust_env=False) as http,
        http.stream("POST", CHAT, json=body) as response,
    ):
        lines = response.iter_lines()
        seen = [line for line, _ in zip(lines, range(6), strict=False)]
        assert any('"content":"tok "' in line for line in seen)
    [record] = fake.wait_for(lambda reqs: reqs[0]["finished_at"] is not None)
    assert record["disconnected"] is True
    assert record["completed"] is False
    assert 0 < record["chunks_sent"] < 200


def test_fail_mid_stream_closes_connection(fake: FakeBackend, client: httpx.Client) -> None:
    fake.script(chunks=5, fail_mid_stream_after=2)
    lines: list[str] = []
    body = {"messages": USER_MESSAGE, "stream": True}
    with pytest.raises(httpx.RemoteProtocolError), client.stream("POST", CHAT, json=body) as r:
        lines.extend(r.iter_lines())
    assert sum('"content":"tok "' in line for line in lines) == 2
    assert "data: [DONE]" not in lines
    [record] = fake.wait_for(lambda reqs: reqs[0]["finished_at"] is not None)
    assert record["chunks_sent"] == 2
    assert record["completed"] is False
    # The fake keeps serving afterwards.
    fake.script()
    assert client.post(CHAT, json={"messages": USER_MESSAGE}).status_code == 200


def test_exit_on_request_kills_the_process(own_fake: FakeBackend) -> None:
    own_fake.script(exit_on_request=True)
    with (
        httpx.Client(base_url=own_fake.url, timeout=5.0, trust_env=False) as http,
        pytest.raises(httpx.TransportError),
    ):
        http.post(CHAT, json={"messages": USER_MESSAGE})
    assert own_fake.wait_for_exit(timeout=5.0) == 3


def test_sigterm_exits_cleanly_while_a_request_stalls(own_fake: FakeBackend) -> None:
    own_fake.script(stall=True)
    with socket.create_connection(("127.0.0.1", own_fake.port), timeout=5.0) as sock:
        payload = b'{"messages": []}'
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload)
        )
        own_fake.wait_for(lambda reqs: len(reqs) == 1)
        started = time.monotonic()
        own_fake.stop()
        assert own_fake.returncode == 0
        assert time.monotonic() - started < 2.0


def test_sigkill_via_kill(own_fake: FakeBackend) -> None:
    own_fake.kill()
    assert own_fake.wait_for_exit() == -signal.SIGKILL
    assert not own_fake.is_running()


def test_health_scripting(fake: FakeBackend, client: httpx.Client) -> None:
    assert client.get("/health").json() == {"status": "ok"}
    fake.script(health_status=503)
    assert client.get("/health").status_code == 503
    assert client.post(CHAT, json={"messages": USER_MESSAGE}).status_code == 200
    fake.script(health_stall=True)
    with pytest.raises(httpx.ReadTimeout):
        client.get("/health", timeout=httpx.Timeout(5.0, read=0.2))
    fake.reset()
    assert client.get("/health").status_code == 200
    assert [h["status"] for h in fake.health_requests()] == [200]
    assert fake.requests() == []


def test_embeddings_shape(client: httpx.Client, oai: openai.OpenAI) -> None:
    body = client.post("/v1/embeddings", json={"model": "e", "input": ["a", "b", "a"]}).json()
    assert body["object"] == "list"
    assert body["model"] == "e"
    vectors = [d["embedding"] for d in body["data"]]
    assert [d["index"] for d in body["data"]] == [0, 1, 2]
    assert all(len(v) == 8 and all(isinstance(x, float) for x in v) for v in vectors)
    assert vectors[0] == vectors[2] != vectors[1]
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > 0
    # The openai client asks for base64 by default; it must decode to the same vector.
    result = oai.embeddings.create(model="e", input="a")
    assert result.data[0].embedding == pytest.approx(vectors[0], abs=1e-6)


def test_rerank_shape(client: httpx.Client) -> None:
    body = client.post(
        "/v1/rerank",
        json={
            "model": "r",
            "query": "red apple pie",
            "documents": ["blue sky", "red apple", "apple pie with red cream"],
            "top_n": 2,
        },
    ).json()
    assert body["model"] == "r"
    assert body["object"] == "list"
    assert body["results"] == [
        {"index": 2, "relevance_score": 3.0},
        {"index": 1, "relevance_score": 2.0},
    ]
    assert body["usage"]["total_tokens"] > 0


def test_responses_404_by_default_then_scripted(fake: FakeBackend, client: httpx.Client) -> None:
    request = {"model": "m", "input": "hi there"}
    response = client.post("/v1/responses", json=request)
    assert response.status_code == 404
    assert response.json()["error"]["code"] == 404

    fake.script(responses=True, reply="scripted answer")
    body = client.post("/v1/responses", json=request).json()
    assert body["object"] == "response"
    assert body["status"] == "completed"
    [item] = body["output"]
    assert item["type"] == "message"
    assert item["content"] == [
        {"type": "output_text", "text": "scripted answer", "annotations": []}
    ]
    assert set(body["usage"]) == {"input_tokens", "output_tokens", "total_tokens"}


def test_media_endpoints_answer_like_mlx_openai_server(
    fake: FakeBackend, oai: openai.OpenAI
) -> None:
    generated = oai.images.generate(model="painter", prompt="a fox", n=2)
    assert [bool(image.b64_json) for image in generated.data or []] == [True, True]
    edited = oai.images.edit(model="editor", image=("fox.png", b"\x89PNG"), prompt="a hat")
    assert edited.data and edited.data[0].b64_json
    transcript = oai.audio.transcriptions.create(model="scribe", file=("a.wav", b"RIFF\r\n"))
    assert transcript.text == "fake transcript of a.wav (6 bytes)"
    generation, edit, transcription = fake.requests()
    assert generation["body"] == {"model": "painter", "prompt": "a fox", "n": 2}
    assert edit["content_type"].startswith("multipart/form-data; boundary=")
    assert {p["name"]: p.get("value", p.get("filename")) for p in edit["form"]} == {
        "image": "fox.png",
        "prompt": "a hat",
        "model": "editor",
    }
    assert transcription["body"] is None
    [audio] = [p for p in transcription["form"] if p["name"] == "file"]
    assert audio["size"] == 6


def test_media_endpoints_follow_the_script(fake: FakeBackend, client: httpx.Client) -> None:
    files = {"file": ("a.wav", b"RIFF")}
    fake.script(statuses=[429, 500], paths=["/v1/audio/transcriptions"])
    statuses = [
        client.post("/v1/audio/transcriptions", data={"model": "m"}, files=files).status_code
        for _ in range(3)
    ]
    assert statuses == [429, 500, 200]
    assert client.post("/v1/images/edits", data={"model": "m"}, files=files).status_code == 400
    fake.script(stall=True)
    with pytest.raises(httpx.ReadTimeout):
        client.post("/v1/images/generations", json={"model": "m", "prompt": "x"}, timeout=0.3)
    fake.wait_for(lambda reqs: reqs[-1]["disconnected"])


def test_script_body_matching_limits_the_failure(fake: FakeBackend, client: httpx.Client) -> None:
    fake.script(status=500, body_contains='"tools"')
    plain = {"model": "m", "messages": USER_MESSAGE}
    assert client.post(CHAT, json=plain).status_code == 200
    assert client.post(CHAT, json={**plain, "tools": []}).status_code == 500
    fake.script(stall=True, body_lacks='"max_tokens":1')
    canary = b'{"model":"m","messages":[{"role":"user","content":"ok"}],"max_tokens":1}'
    headers = {"content-type": "application/json"}
    assert client.post(CHAT, content=canary, headers=headers).status_code == 200
    with pytest.raises(httpx.ReadTimeout):
        client.post(CHAT, json=plain, timeout=httpx.Timeout(5.0, read=0.2))
    assert client.get("/health").status_code == 200


def test_slots_like_llama_server(fake: FakeBackend, client: httpx.Client) -> None:
    assert client.get("/slots").status_code == 404
    fake.script(slots=3, busy_slots=2)
    first, second = client.get("/slots").json(), client.get("/slots").json()
    assert [s["id"] for s in first] == [0, 1, 2]
    assert [s["is_processing"] for s in first] == [True, True, False]
    assert set(first[0]) >= {"id", "n_ctx", "is_processing", "id_task", "next_token", "params"}
    decoded = [[s["next_token"][0]["n_decoded"] for s in answer] for answer in (first, second)]
    assert decoded == [[1, 1, 0], [2, 2, 0]]
    fake.script(slots=3, busy_slots=2, slots_progress=False)
    frozen = [[s["next_token"][0]["n_decoded"] for s in client.get("/slots").json()]]
    assert frozen == [[2, 2, 0]]
    assert client.post(CHAT, json={"messages": USER_MESSAGE}).status_code == 200
    fake.script(slots=1, slots_stall=True)
    with pytest.raises(httpx.ReadTimeout):
        client.get("/slots", timeout=httpx.Timeout(5.0, read=0.2))
    assert client.get("/health").status_code == 200
    assert fake.requests()[-1]["path"] == CHAT  # /slots is not recorded as a request
