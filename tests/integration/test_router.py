"""The router on a real socket in front of scriptable fake backends (real processes):
routing, streaming as it arrives, disconnects, and every error status."""

from __future__ import annotations

import json
import socket
import time
from typing import Any

import httpx
import openai
import pytest

from tests import one_shot
from tests.fakes.control import FakeBackend
from tests.openai_shapes import strict_events, strict_response
from tests.processes import RunningRouter, StartRouter, free_port
from tests.registry_entries import registry_entry

# Its module-scoped stack starts once: one worker runs the whole module.
pytestmark = pytest.mark.xdist_group("test_router")

FAKE_ROLES = ("alpha", "beta", "slow", "embed", "rerank", "sick", "stuck", "mlxish")
CHAT = "/v1/chat/completions"
HELLO = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def router_process(fakes: dict[str, FakeBackend], start_router: StartRouter) -> RunningRouter:
    models = {
        "alpha": registry_entry(
            "alpha", fakes["alpha"].port, chat_template_kwargs={"enable_thinking": False}
        ),
        "beta": registry_entry("beta", fakes["beta"].port),
        "slow": registry_entry("slow", fakes["slow"].port, default_timeout=1),
        "embed": registry_entry("embed", fakes["embed"].port, model_type="embeddings"),
        "rerank": registry_entry("rerank", fakes["rerank"].port, model_type="rerank"),
        "sick": registry_entry("sick", fakes["sick"].port),
        "stuck": registry_entry("stuck", fakes["stuck"].port),
        "ghost": registry_entry("ghost", free_port()),
        "off": registry_entry("off", free_port(), enabled=False),
        "slashed": registry_entry("org/slashed-model", free_port()),
        "mlxish": registry_entry(
            "mlxish", fakes["mlxish"].port, backend="mlx", model_path="org/model"
        ),
        "twin_a": registry_entry("twin", free_port()),
        "twin_b": registry_entry("twin", free_port()),
    }
    return start_router(models, SLM_HEALTH_PROBE_TIMEOUT_SECONDS="0.5")


def error_of(response: httpx.Response) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"error"}
    assert {"message", "type", "code"} <= set(body["error"])
    error: dict[str, Any] = body["error"]
    return error


def test_requests_go_to_the_backend_named_by_model(
    http: httpx.Client, fakes: dict[str, FakeBackend]
) -> None:
    for model in ("alpha", "beta", "alpha"):
        response = http.post(CHAT, json={"model": model, "messages": HELLO})
        assert response.status_code == 200
        assert response.json()["model"] == model
    assert len(fakes["alpha"].requests()) == 2
    assert len(fakes["beta"].requests()) == 1


def test_chat_template_kwargs_are_injected_only_when_absent(
    http: httpx.Client, fakes: dict[str, FakeBackend]
) -> None:
    http.post(CHAT, json={"model": "alpha", "messages": HELLO})
    own = {"enable_thinking": True}
    http.post(CHAT, json={"model": "alpha", "messages": HELLO, "chat_template_kwargs": own})
    http.post(CHAT, json={"model": "beta", "messages": HELLO})
    first, second = fakes["alpha"].requests()
    assert first["body"]["chat_template_kwargs"] == {"enable_thinking": False}
    assert second["body"]["chat_template_kwargs"] == own
    assert "chat_template_kwargs" not in fakes["beta"].requests()[0]["body"]


def test_stream_chunks_reach_the_client_as_the_backend_sends_them(
    http: httpx.Client, fakes: dict[str, FakeBackend]
) -> None:
    fakes["alpha"].script(chunks=5, chunk_interval_seconds=0.3)
    arrivals: list[float] = []
    body = {"model": "alpha", "messages": HELLO, "stream": True}
    with http.stream("POST", CHAT, json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["cache-control"] == "no-cache"
        assert response.headers["x-accel-buffering"] == "no"
        for line in response.iter_lines():
            if line.startswith("data: {"):
                arrivals.append(time.monotonic())
    [record] = fakes["alpha"].requests()
    assert record["finished_at"] is not None
    # CLOCK_MONOTONIC is shared by every process on the machine.
    assert arrivals[0] < record["finished_at"] - 0.8
    assert arrivals[-1] - arrivals[0] > 0.8


def test_client_disconnect_closes_the_upstream_request(
    http: httpx.Client, fakes: dict[str, FakeBackend]
) -> None:
    fakes["alpha"].script(chunks=200, chunk_interval_seconds=0.05)
    body = {"model": "alpha", "messages": HELLO, "stream": True}
    with http.stream("POST", CHAT, json=body) as response:
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data: {"))
    [record] = fakes["alpha"].wait_for(
        lambda reqs: len(reqs) == 1 and reqs[0]["disconnected"], timeout=5
    )
    assert record["chunks_sent"] < 200


def test_a_failure_mid_stream_becomes_one_error_event_and_a_clean_end(
    http: httpx.Client, fakes: dict[str, FakeBackend]
) -> None:
    fakes["alpha"].script(chunks=10, fail_mid_stream_after=2)
    body = {"model": "alpha", "messages": HELLO, "stream": True}
    with http.stream("POST", CHAT, json=body) as response:
        assert response.status_code == 200
        events = [line for line in response.iter_lines() if line.startswith("data:")]
    payloads = [json.loads(e[5:]) for e in events if e != "data: [DONE]"]
    assert "error" in payloads[-1]
    assert payloads[-1]["error"]["type"] == "backend_error"
    assert all("error" not in p for p in payloads[:-1])


@pytest.mark.parametrize(
    ("content", "code"),
    [
        (b"{not json", "invalid_json"),
        (b"", "invalid_json"),
        (b"[1, 2]", "invalid_json"),
        (b'{"messages": []}', "missing_model"),
        (b'{"model": 7, "messages": []}', "invalid_model"),
    ],
)
def test_malformed_requests_get_400(http: httpx.Client, content: bytes, code: str) -> None:
    response = http.post(CHAT, content=content, headers={"content-type": "application/json"})
    assert response.status_code == 400
    assert error_of(response)["code"] == code


@pytest.mark.parametrize("model", ["nope", "off"])
def test_unknown_or_disabled_model_is_404(http: httpx.Client, model: str) -> None:
    response = http.post(CHAT, json={"model": model, "messages": HELLO})
    assert response.status_code == 404
    assert error_of(response)["code"] == "model_not_found"


def test_endpoint_the_model_type_does_not_serve_is_400(http: httpx.Client) -> None:
    response = http.post("/v1/rerank", json={"model": "alpha", "query": "q", "documents": ["d"]})
    assert response.status_code == 400
    error = error_of(response)
    assert error["code"] == "unsupported_endpoint"
    assert "model_type 'lm'" in error["message"]


def test_duplicate_enabled_id_is_409(http: httpx.Client) -> None:
    response = http.post(CHAT, json={"model": "twin", "messages": HELLO})
    assert response.status_code == 409
    assert error_of(response)["code"] == "ambiguous_model"


def test_unreachable_backend_is_503_with_retry_after(http: httpx.Client) -> None:
    response = http.post(CHAT, json={"model": "ghost", "messages": HELLO})
    assert response.status_code == 503
    assert int(response.headers["retry-after"]) >= 1
    assert error_of(response)["code"] == "backend_unreachable"


def test_backend_timeout_is_504(http: httpx.Client, fakes: dict[str, FakeBackend]) -> None:
    fakes["slow"].script(delay_seconds=3)
    started = time.monotonic()
    response = http.post(CHAT, json={"model": "slow", "messages": HELLO})
    assert response.status_code == 504
    assert error_of(response)["code"] == "deadline_exceeded"
    assert time.monotonic() - started < 2.5


@pytest.mark.parametrize("status", [500, 429, 503, 422])
def test_backend_error_statuses_pass_through_openai_shaped(
    http: httpx.Client, fakes: dict[str, FakeBackend], status: int
) -> None:
    fakes["beta"].script(status=status)
    response = http.post(CHAT, json={"model": "beta", "messages": HELLO})
    assert response.status_code == status
    error_of(response)


def test_embeddings_and_rerank_are_proxied(http: httpx.Client) -> None:
    embedded = http.post("/v1/embeddings", json={"model": "embed", "input": ["a", "b"]})
    assert embedded.status_code == 200
    assert len(embedded.json()["data"]) == 2
    body = {
        "model": "rerank",
        "query": "red fox",
        "documents": ["blue sky", "red fox runs"],
        "top_n": 1,
    }
    reranked = http.post("/v1/rerank", json=body)
    assert reranked.status_code == 200
    assert [r["index"] for r in reranked.json()["results"]] == [1]


def test_unknown_routes_and_methods_are_openai_shaped(http: httpx.Client) -> None:
    missing = http.get("/v1/nothing")
    assert missing.status_code == 404
    error_of(missing)
    wrong_method = http.get(CHAT)
    assert wrong_method.status_code == 405
    error_of(wrong_method)


def test_responses_fall_back_to_chat_when_the_backend_lacks_them(
    router: str, fakes: dict[str, FakeBackend]
) -> None:
    with openai.OpenAI(base_url=f"{router}/v1", api_key="x", max_retries=0) as client:
        response = client.responses.create(model="beta", input="hello there")
        assert response.output_text.startswith("fake reply to: hello there")
        events = list(client.responses.create(model="beta", input="hello there", stream=True))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text
    assert events[-1].type == "response.completed"
    paths = [r["path"] for r in fakes["beta"].requests()]
    assert paths == [CHAT, CHAT], "llama.cpp's own /v1/responses is never asked"


def test_llama_cpp_backends_are_translated_even_when_they_have_their_own(
    http: httpx.Client, fakes: dict[str, FakeBackend]
) -> None:
    fakes["beta"].script(responses=True)
    response = http.post("/v1/responses", json={"model": "beta", "input": "hi"})
    assert response.status_code == 200
    assert response.json()["object"] == "response"
    assert [r["path"] for r in fakes["beta"].requests()] == [CHAT]


def test_responses_use_an_mlx_backend_s_own_api_when_it_has_one(
    http: httpx.Client, fakes: dict[str, FakeBackend]
) -> None:
    fakes["mlxish"].script(responses=True)
    response = http.post("/v1/responses", json={"model": "mlxish", "input": "hi"})
    assert response.status_code == 200
    assert response.json()["object"] == "response"
    assert [r["path"] for r in fakes["mlxish"].requests()] == ["/v1/responses"]
    fakes["mlxish"].script()  # 404 now: translated
    response = http.post("/v1/responses", json={"model": "mlxish", "input": "hi"})
    assert response.status_code == 200
    assert [r["path"] for r in fakes["mlxish"].requests()][-2:] == ["/v1/responses", CHAT]


def test_models_lists_enabled_entries_with_their_settings(http: httpx.Client) -> None:
    data = http.get("/v1/models").json()["data"]
    ids = [m["id"] for m in data]
    assert "off" not in ids
    assert ids.count("twin") == 2
    alpha = next(m for m in data if m["id"] == "alpha")
    assert alpha["backend"] == "llamacpp"
    assert alpha["model_type"] == "lm"
    assert alpha["quantization"] == "Q4_0"
    assert alpha["supports_function_calling"] is False
    assert "context_length" in alpha


def test_models_retrieve_finds_an_id_with_a_slash(router: str) -> None:
    client = openai.OpenAI(base_url=f"{router}/v1", api_key="unused", max_retries=0)
    model = client.models.retrieve("org/slashed-model")
    assert (model.id, model.object, model.owned_by) == ("org/slashed-model", "model", "slm_server")
    raw = one_shot.get(f"{router}/v1/models/org/slashed-model", timeout=5).json()
    openai.types.Model.model_validate(raw, strict=True)
    assert raw["role"] == "slashed"
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("org/none")
    assert missing.value.code == "model_not_found"
    assert missing.value.param == "model"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("off")  # disabled entries are not served
    with pytest.raises(openai.ConflictError) as twins:
        client.models.retrieve("twin")
    assert twins.value.code == "ambiguous_model"


@pytest.mark.parametrize("status", [400, 500, 503])
def test_backend_errors_reach_the_client_openai_shaped(
    http: httpx.Client, fakes: dict[str, FakeBackend], status: int
) -> None:
    """llama-server's error objects carry an integer ``code``; OpenAI's is a string."""
    fakes["beta"].script(status=status)
    response = http.post(CHAT, json={"model": "beta", "messages": HELLO})
    assert response.status_code == status
    assert error_of(response) == {
        "message": f"scripted {status}",
        "type": "fake",
        "param": None,
        "code": str(status),
    }


def test_backends_health_reports_each_status(
    http: httpx.Client, fakes: dict[str, FakeBackend]
) -> None:
    fakes["sick"].script(health_status=503)
    fakes["stuck"].script(health_stall=True)
    started = time.monotonic()
    health = http.get("/v1/backends/health").json()
    assert time.monotonic() - started < 3, "probes must run concurrently with a short timeout"
    statuses = {role: item["status"] for role, item in health.items()}
    assert statuses["alpha"] == "healthy"
    assert statuses["ghost"] == "unreachable"
    assert statuses["sick"] == "unhealthy"
    assert statuses["stuck"] == "timeout"
    assert statuses["off"] == "disabled"
    assert health["ghost"]["error"].startswith("Connection refused")
    assert health["alpha"]["port"] == fakes["alpha"].port


def test_router_health(http: httpx.Client) -> None:
    response = http.get("/health")
    assert response.status_code == 200
    assert response.json()["status"] == "ok"


def test_hop_by_hop_headers_are_never_forwarded(router: str, fakes: dict[str, FakeBackend]) -> None:
    """RFC 9110 §7.6.1: the headers the client's Connection names, Keep-Alive, TE,
    Trailer, Upgrade, Proxy-*, and Expect stay with the router (sent on a raw socket, so
    nothing in between rewrites them)."""
    body = json.dumps({"model": "beta", "messages": HELLO}).encode()
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\n"
        "Host: 127.0.0.1\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close, X-Secret-Hop\r\n"
        "X-Secret-Hop: 1\r\n"
        "Keep-Alive: timeout=5\r\n"
        "TE: trailers\r\n"
        "Trailer: X-Checksum\r\n"
        "Proxy-Authorization: Basic eDp5\r\n"
        "Proxy-Secret: 2\r\n"
        "X-Kept: 3\r\n"
        "\r\n"
    )
    host, port = router.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(head.encode() + body)
        reply = b""
        while b"\r\n\r\n" not in reply and (chunk := sock.recv(65536)):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 200"), reply[:200]
    [record] = fakes["beta"].requests()
    sent = {name.lower() for name in record["headers"]}
    assert sent.isdisjoint(
        {"x-secret-hop", "keep-alive", "te", "trailer", "proxy-authorization", "proxy-secret"}
    ), sent
    assert record["headers"]["x-kept"] == "3"


def test_expect_is_answered_by_the_router_and_not_forwarded(
    http: httpx.Client, fakes: dict[str, FakeBackend]
) -> None:
    headers = {"Expect": "100-continue"}
    response = http.post(CHAT, json={"model": "beta", "messages": HELLO}, headers=headers)
    assert response.status_code == 200
    [record] = fakes["beta"].requests()
    assert "expect" not in {name.lower() for name in record["headers"]}


@pytest.mark.parametrize("path", ["/v1/models", "/health", "/metrics", "/v1/models/alpha"])
def test_a_rebound_name_is_refused_everywhere(http: httpx.Client, path: str) -> None:
    """DNS rebinding: a page on evil.example whose name now resolves to 127.0.0.1."""
    response = http.get(path, headers={"Host": "evil.example:8000"})
    assert response.status_code == 421
    assert error_of(response)["code"] == "host_not_allowed"
    assert http.get(path, headers={"Host": "localhost:8000"}).status_code == 200


def test_a_rebound_name_never_reaches_a_backend(
    http: httpx.Client, fakes: dict[str, FakeBackend]
) -> None:
    body = {"model": "beta", "messages": HELLO}
    response = http.post(CHAT, json=body, headers={"Host": "evil.example"})
    assert response.status_code == 421
    assert fakes["beta"].requests() == []


def test_responses_are_strictly_openai_shaped_on_the_fake(
    router: str, http: httpx.Client, fakes: dict[str, FakeBackend]
) -> None:
    fakes["beta"].script(chunks=5)
    body = {"model": "beta", "input": "hello there"}
    strict_response(http.post("/v1/responses", json=body).json())
    streamed = http.post("/v1/responses", json={**body, "stream": True})
    lines = [line[5:] for line in streamed.text.splitlines() if line.startswith("data:")]
    events = strict_events([json.loads(line) for line in lines])
    assert events[-1].type == "response.completed"
    with (
        openai.OpenAI(base_url=f"{router}/v1", api_key="x", max_retries=0) as client,
        client.responses.stream(model="beta", input="hello there") as stream,
    ):
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert final.output_text == "".join(deltas) == "tok " * 5
