"""Traces, request ids and logs of a real router process: each request to a model
endpoint arrives at a real OTLP/HTTP receiver as exactly one span, with the GenAI
attributes and the caller's trace as its parent; a router with no collector serves as
usual and still stops promptly."""

from __future__ import annotations

import json
import re
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests import one_shot
from tests.fakes.control import FakeBackend
from tests.integration.otlp_receiver import (
    SPAN_KIND_CLIENT,
    STATUS_ERROR,
    OtlpReceiver,
    ReceivedSpan,
)
from tests.processes import (
    RunningRouter,
    StartRouter,
    free_port,
    poll,
    registry_env,
    running_router,
)
from tests.registry_entries import registry_entry

# Its module-scoped stack starts once: one worker runs the whole module.
pytestmark = pytest.mark.xdist_group("test_telemetry")

CHAT = "/v1/chat/completions"
HELLO = [{"role": "user", "content": "hello there"}]
FAKE_ROLES = ("alpha", "native", "embed", "rerank")
# OTEL_BSP_SCHEDULE_DELAY: spans leave the router 20 ms after they end (not 5 s).
EXPORT_DELAY_MS = "20"


def registry(fakes: dict[str, FakeBackend]) -> dict[str, Any]:
    return {
        "alpha": registry_entry("alpha", fakes["alpha"].port),
        # An MLX backend: its own /v1/responses is asked first (llama.cpp's never is).
        "native": registry_entry(
            "native", fakes["native"].port, backend="mlx", model_path="org/native"
        ),
        "embed": registry_entry("embed", fakes["embed"].port, model_type="embeddings"),
        "rerank": registry_entry("rerank", fakes["rerank"].port, model_type="rerank"),
    }


def traceparent() -> tuple[str, str, str]:
    """A fresh caller context: (header, trace id, parent span id)."""
    trace_id, span_id = uuid.uuid4().hex, uuid.uuid4().hex[:16]
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as running:
        yield running


@pytest.fixture(scope="module")
def router_process(
    fakes: dict[str, FakeBackend], receiver: OtlpReceiver, start_router: StartRouter
) -> RunningRouter:
    return start_router(
        registry(fakes), OTEL_BSP_SCHEDULE_DELAY=EXPORT_DELAY_MS, SLM_OTLP_ENDPOINT=receiver.url
    )


def traced_post(
    http: httpx.Client, receiver: OtlpReceiver, path: str, body: dict[str, Any]
) -> tuple[httpx.Response, ReceivedSpan, str]:
    """POST with a fresh traceparent and request id; the response, its span (checked
    to be the caller's child, of kind CLIENT) and the caller's trace id."""
    header, trace_id, parent_id = traceparent()
    request_id = f"test-{uuid.uuid4().hex[:12]}"
    response = http.post(
        path, json=body, headers={"traceparent": header, "x-request-id": request_id}
    )
    assert response.headers["x-request-id"] == request_id
    span = receiver.span_for(request_id)
    assert span.trace_id == trace_id
    assert span.parent_span_id == parent_id
    assert span.kind == SPAN_KIND_CLIENT
    assert span.resource["service.name"] == "slm-server"
    return response, span, trace_id


def sse_payloads(text: str) -> list[dict[str, Any]]:
    return [
        json.loads(line[5:])
        for line in text.splitlines()
        if line.startswith("data:") and line.strip() != "data: [DONE]"
    ]


def common(
    span: ReceivedSpan,
    fake: FakeBackend,
    model: str,
    operation: str,
    path: str,
    provider: str = "llama.cpp",
) -> None:
    attrs = span.attributes
    assert span.name == f"{operation} {model}"
    assert attrs["gen_ai.operation.name"] == operation
    assert attrs["gen_ai.provider.name"] == provider
    assert attrs["gen_ai.request.model"] == model
    assert attrs["gen_ai.response.model"] == model
    assert attrs["server.address"] == "127.0.0.1"
    assert attrs["server.port"] == fake.port
    assert attrs["http.response.status_code"] == 200
    assert attrs["slm.emit_path"] == path
    assert "error.type" not in attrs
    assert span.status_code != STATUS_ERROR
    assert span.end_ns >= span.start_ns


def test_chat_span(
    http: httpx.Client, receiver: OtlpReceiver, fakes: dict[str, FakeBackend]
) -> None:
    body = {"model": "alpha", "messages": HELLO, "max_tokens": 7, "temperature": 0.5, "top_p": 0.9}
    response, span, trace_id = traced_post(http, receiver, CHAT, body)
    assert response.status_code == 200
    common(span, fakes["alpha"], "alpha", "chat", "chat")
    attrs = span.attributes
    assert attrs["gen_ai.request.max_tokens"] == 7
    assert attrs["gen_ai.request.temperature"] == 0.5
    assert attrs["gen_ai.request.top_p"] == 0.9
    assert attrs["gen_ai.request.stream"] is False
    assert attrs["gen_ai.response.id"] == response.json()["id"]
    assert attrs["gen_ai.response.finish_reasons"] == ("stop",)
    usage = response.json()["usage"]
    assert attrs["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
    assert attrs["gen_ai.usage.output_tokens"] == usage["completion_tokens"]
    assert "gen_ai.response.time_to_first_chunk" not in attrs
    # The backend saw the span's own context, and the request id.
    [record] = fakes["alpha"].requests()
    assert record["headers"]["traceparent"] == f"00-{trace_id}-{span.span_id}-01"
    assert record["headers"]["x-request-id"] == attrs["slm.request_id"]


def test_completions_span(
    http: httpx.Client, receiver: OtlpReceiver, fakes: dict[str, FakeBackend]
) -> None:
    body = {"model": "alpha", "prompt": "once upon a time", "max_tokens": 5}
    response, span, _ = traced_post(http, receiver, "/v1/completions", body)
    common(span, fakes["alpha"], "alpha", "text_completion", "completions")
    usage = response.json()["usage"]
    assert span.attributes["gen_ai.usage.input_tokens"] == usage["prompt_tokens"] == 4
    assert span.attributes["gen_ai.usage.output_tokens"] == usage["completion_tokens"]


@pytest.mark.parametrize("path", [CHAT, "/v1/completions"])
def test_streaming_span_has_usage_the_client_never_sees(
    http: httpx.Client, receiver: OtlpReceiver, fakes: dict[str, FakeBackend], path: str
) -> None:
    fakes["alpha"].script(chunks=6, chunk_interval_seconds=0.01)
    body: dict[str, Any] = {"model": "alpha", "stream": True, "max_tokens": 9}
    body.update({"messages": HELLO} if path == CHAT else {"prompt": "tell me"})
    response, span, _ = traced_post(http, receiver, path, body)
    payloads = sse_payloads(response.text)
    assert payloads and all("usage" not in p for p in payloads)
    operation = "chat" if path == CHAT else "text_completion"
    common(span, fakes["alpha"], "alpha", operation, "streaming")
    attrs = span.attributes
    assert attrs["gen_ai.request.stream"] is True
    assert attrs["gen_ai.usage.output_tokens"] == 6
    assert attrs["gen_ai.usage.input_tokens"] == 2
    assert attrs["gen_ai.response.finish_reasons"] == ("stop",)
    assert attrs["gen_ai.response.id"] == payloads[0]["id"]
    first = attrs["gen_ai.response.time_to_first_chunk"]
    assert 0 < first < (span.end_ns - span.start_ns) / 1e9
    # The backend was asked for usage on the client's behalf.
    [record] = fakes["alpha"].requests()
    assert record["body"]["stream_options"] == {"include_usage": True}


def test_streaming_usage_the_client_asked_for_reaches_it(
    http: httpx.Client, receiver: OtlpReceiver
) -> None:
    body = {
        "model": "alpha",
        "messages": HELLO,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    response, span, _ = traced_post(http, receiver, CHAT, body)
    usage = [p["usage"] for p in sse_payloads(response.text) if p.get("usage")]
    assert usage == [{"prompt_tokens": 2, "completion_tokens": 8, "total_tokens": 10}]
    assert span.attributes["gen_ai.usage.output_tokens"] == 8


def test_native_responses_span(
    http: httpx.Client, receiver: OtlpReceiver, fakes: dict[str, FakeBackend]
) -> None:
    fakes["native"].script(responses=True)
    body = {"model": "native", "input": "say hi please", "max_output_tokens": 11}
    response, span, _ = traced_post(http, receiver, "/v1/responses", body)
    assert response.json()["object"] == "response"
    common(span, fakes["native"], "native", "chat", "responses", provider="mlx")
    attrs = span.attributes
    assert attrs["gen_ai.request.max_tokens"] == 11
    assert attrs["gen_ai.response.id"] == response.json()["id"]
    assert attrs["gen_ai.response.finish_reasons"] == ("completed",)
    assert attrs["gen_ai.usage.input_tokens"] == response.json()["usage"]["input_tokens"]
    assert attrs["gen_ai.usage.output_tokens"] == response.json()["usage"]["output_tokens"]
    assert [r["path"] for r in fakes["native"].requests()] == ["/v1/responses"]


def test_responses_fallback_to_chat_span(
    http: httpx.Client, receiver: OtlpReceiver, fakes: dict[str, FakeBackend]
) -> None:
    body = {"model": "alpha", "input": "say hi please"}
    response, span, trace_id = traced_post(http, receiver, "/v1/responses", body)
    assert response.status_code == 200
    assert response.json()["object"] == "response"
    common(span, fakes["alpha"], "alpha", "chat", "responses")
    usage = response.json()["usage"]
    assert span.attributes["gen_ai.usage.input_tokens"] == usage["input_tokens"] == 3
    assert span.attributes["gen_ai.usage.output_tokens"] == usage["output_tokens"]
    [chat] = fakes["alpha"].requests()  # a llama.cpp backend: translated at once
    assert chat["path"] == CHAT
    expected = f"00-{trace_id}-{span.span_id}-01"
    assert chat["headers"]["traceparent"] == expected


def test_streamed_responses_fallback_span(
    http: httpx.Client, receiver: OtlpReceiver, fakes: dict[str, FakeBackend]
) -> None:
    fakes["alpha"].script(chunks=3)
    body = {"model": "alpha", "input": "say hi please", "stream": True}
    response, span, _ = traced_post(http, receiver, "/v1/responses", body)
    assert "response.completed" in response.text
    common(span, fakes["alpha"], "alpha", "chat", "responses")
    attrs = span.attributes
    assert attrs["gen_ai.request.stream"] is True
    assert attrs["gen_ai.usage.output_tokens"] == 3
    assert attrs["gen_ai.response.time_to_first_chunk"] > 0


def test_embeddings_span(
    http: httpx.Client, receiver: OtlpReceiver, fakes: dict[str, FakeBackend]
) -> None:
    body = {"model": "embed", "input": ["one two", "three"]}
    response, span, _ = traced_post(http, receiver, "/v1/embeddings", body)
    common(span, fakes["embed"], "embed", "embeddings", "embeddings")
    assert span.attributes["gen_ai.usage.input_tokens"] == response.json()["usage"]["prompt_tokens"]
    assert "gen_ai.usage.output_tokens" not in span.attributes


def test_rerank_span(
    http: httpx.Client, receiver: OtlpReceiver, fakes: dict[str, FakeBackend]
) -> None:
    body = {"model": "rerank", "query": "red fox", "documents": ["a red fox", "blue sky"]}
    response, span, _ = traced_post(http, receiver, "/v1/rerank", body)
    common(span, fakes["rerank"], "rerank", "rerank", "rerank")
    assert span.attributes["gen_ai.usage.input_tokens"] == response.json()["usage"]["prompt_tokens"]


@pytest.mark.parametrize(
    ("content", "status", "error_type", "name"),
    [
        (b"{not json", 400, "invalid_json", "chat"),
        (json.dumps({"model": "nope", "messages": HELLO}).encode(), 404, "model_not_found", "chat"),
    ],
)
def test_requests_refused_before_routing_get_a_span(
    router: str,
    receiver: OtlpReceiver,
    content: bytes,
    status: int,
    error_type: str,
    name: str,
) -> None:
    header, trace_id, _ = traceparent()
    request_id = f"bad-{uuid.uuid4().hex[:8]}"
    response = one_shot.post(
        f"{router}{CHAT}",
        content=content,
        headers={
            "traceparent": header,
            "x-request-id": request_id,
            "content-type": "application/json",
        },
    )
    assert response.status_code == status
    span = receiver.span_for(request_id)
    assert span.name == name
    assert span.trace_id == trace_id
    assert span.status_code == STATUS_ERROR
    attrs = span.attributes
    assert attrs["error.type"] == error_type
    assert attrs["http.response.status_code"] == status
    assert attrs["slm.emit_path"] == "chat"
    assert "gen_ai.provider.name" not in attrs
    if status == 404:
        assert attrs["gen_ai.request.model"] == "nope"


def test_a_backend_error_is_an_error_span(
    http: httpx.Client, receiver: OtlpReceiver, fakes: dict[str, FakeBackend]
) -> None:
    fakes["alpha"].script(status=503)
    response, span, _ = traced_post(http, receiver, CHAT, {"model": "alpha", "messages": HELLO})
    assert response.status_code == 503
    assert span.attributes["error.type"] == "503"
    assert span.attributes["http.response.status_code"] == 503
    assert span.status_code == STATUS_ERROR


def test_a_client_that_leaves_mid_stream_ends_its_span_as_cancelled(
    http: httpx.Client, receiver: OtlpReceiver, fakes: dict[str, FakeBackend]
) -> None:
    fakes["alpha"].script(chunks=200, chunk_interval_seconds=0.05)
    body = {"model": "alpha", "messages": HELLO, "stream": True}
    headers = {"x-request-id": "leaver"}
    with http.stream("POST", CHAT, json=body, headers=headers) as response:
        assert next(line for line in response.iter_lines() if line.startswith("data: {"))
    span = receiver.span_for("leaver")
    assert span.attributes["error.type"] == "cancelled"
    assert span.attributes["slm.emit_path"] == "streaming"
    assert span.status_code == STATUS_ERROR
    [record] = fakes["alpha"].wait_for(lambda reqs: len(reqs) == 1 and reqs[0]["disconnected"])
    assert record["chunks_sent"] < 200


def test_without_traceparent_a_new_trace_keeps_the_legacy_trace_id(
    http: httpx.Client, receiver: OtlpReceiver, fakes: dict[str, FakeBackend]
) -> None:
    for extra in ({}, {"traceparent": "00-garbage-01"}):
        request_id = f"legacy-{uuid.uuid4().hex[:8]}"
        headers = {"x-request-id": request_id, "x-trace-id": "conv-42", **extra}
        response = http.post(CHAT, json={"model": "alpha", "messages": HELLO}, headers=headers)
        assert response.status_code == 200
        span = receiver.span_for(request_id)
        assert span.parent_span_id == ""
        assert span.attributes["slm.client.trace_id"] == "conv-42"
        upstream = fakes["alpha"].requests()[-1]["headers"]["traceparent"]
        # A root span's flags may also carry W3C level 2's "random" bit (03).
        assert upstream.startswith(f"00-{span.trace_id}-{span.span_id}-0")
    header, _, _ = traceparent()
    headers = {"x-request-id": "with-both", "x-trace-id": "conv-42", "traceparent": header}
    http.post(CHAT, json={"model": "alpha", "messages": HELLO}, headers=headers)
    assert "slm.client.trace_id" not in receiver.span_for("with-both").attributes


def test_one_span_per_request_and_none_for_other_endpoints(
    http: httpx.Client, receiver: OtlpReceiver
) -> None:
    _, first, _ = traced_post(http, receiver, CHAT, {"model": "alpha", "messages": HELLO})
    for path in ("/health", "/v1/models", "/metrics", "/v1/telemetry/effective-config"):
        assert http.get(path, headers={"x-request-id": f"info{path}"}).status_code == 200
    # Spans leave in order: once a later request's span has arrived, a second span
    # for the first one (or one for the info endpoints) would have too.
    traced_post(http, receiver, CHAT, {"model": "alpha", "messages": HELLO})
    spans = receiver.spans()
    assert [s.attributes["slm.request_id"] for s in spans].count(
        first.attributes["slm.request_id"]
    ) == 1
    assert not [s for s in spans if str(s.attributes["slm.request_id"]).startswith("info")]


def test_request_ids_are_taken_validated_or_made_and_echoed(
    http: httpx.Client, fakes: dict[str, FakeBackend]
) -> None:
    body = {"model": "alpha", "messages": HELLO}
    given = http.post(CHAT, json=body, headers={"x-request-id": "client-id.1"})
    assert given.headers["x-request-id"] == "client-id.1"
    for bad in ("has space", "x" * 200, "semi;colon"):
        replaced = http.post(CHAT, json=body, headers={"x-request-id": bad})
        assert re.fullmatch(r"[0-9a-f]{32}", replaced.headers["x-request-id"])
    made = http.post(CHAT, json=body)
    assert re.fullmatch(r"[0-9a-f]{32}", made.headers["x-request-id"])
    assert http.get("/v1/models").headers["x-request-id"]
    sent = [r["headers"]["x-request-id"] for r in fakes["alpha"].requests()]
    assert sent[0] == "client-id.1"
    assert sent[-1] == made.headers["x-request-id"]


def test_one_access_line_per_request_with_its_id(
    http: httpx.Client, router_process: RunningRouter
) -> None:
    request_id = f"access-{uuid.uuid4().hex[:8]}"
    http.post(
        CHAT, json={"model": "alpha", "messages": HELLO}, headers={"x-request-id": request_id}
    )
    output = router_process.output

    def lines() -> list[str]:
        return [line for line in output.read_text().splitlines() if request_id in line]

    poll(lambda: bool(lines()), 5, "the access log line")
    [line] = lines()
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z \[router\] INFO "
        rf"POST {CHAT} 200 \d+\.\dms model=alpha request_id={request_id}",
        line,
    )


def test_effective_config_reports_the_live_exporter(
    http: httpx.Client, receiver: OtlpReceiver
) -> None:
    config = http.get("/v1/telemetry/effective-config").json()
    assert config == {
        "service_name": "slm-server",
        "otlp_endpoint": receiver.url,
        "otlp_traces_endpoint": f"{receiver.url}/v1/traces",
        "otlp_protocol": "http/protobuf",
        "telemetry_enabled": True,
        "tracer_provider_initialised": True,
        "emit_paths": [
            "chat",
            "completions",
            "responses",
            "messages",
            "count_tokens",
            "embeddings",
            "rerank",
            "image_generations",
            "image_edits",
            "transcriptions",
            "infill",
            "upstream",
            "ollama_chat",
            "ollama_generate",
            "ollama_embed",
            "ollama_embeddings",
            "streaming",
        ],
    }
    assert set(receiver.received.content_types) == {"application/x-protobuf"}


def test_disabled_telemetry_exports_nothing_and_says_so(
    fakes: dict[str, FakeBackend], receiver: OtlpReceiver, tmp_path: Path
) -> None:
    env = registry_env(
        tmp_path,
        registry(fakes),
        OTEL_BSP_SCHEDULE_DELAY=EXPORT_DELAY_MS,
        SLM_OTLP_ENDPOINT=receiver.url,
        SLM_OTEL_ENABLED="false",
        SLM_OTEL_SERVICE_NAME="quiet",
    )
    with running_router(env, tmp_path) as (_process, url):
        config = one_shot.get(f"{url}/v1/telemetry/effective-config").json()
        assert config["telemetry_enabled"] is False
        assert config["tracer_provider_initialised"] is False
        assert config["service_name"] == "quiet"
        body = {"model": "alpha", "messages": HELLO}
        response = one_shot.post(f"{url}{CHAT}", json=body, headers={"x-request-id": "untraced"})
        assert response.status_code == 200
        assert "traceparent" not in fakes["alpha"].requests()[-1]["headers"]
    assert not [s for s in receiver.spans() if s.attributes["slm.request_id"] == "untraced"]


def test_json_logs_are_one_object_per_line(fakes: dict[str, FakeBackend], tmp_path: Path) -> None:
    env = registry_env(
        tmp_path,
        registry(fakes),
        OTEL_BSP_SCHEDULE_DELAY=EXPORT_DELAY_MS,
        SLM_LOG_JSON="true",
        SLM_OTEL_ENABLED="false",
    )
    with running_router(env, tmp_path) as (process, url):
        body = {"model": "alpha", "messages": HELLO}
        one_shot.post(f"{url}{CHAT}", json=body, headers={"x-request-id": "json-1"})
        poll(lambda: "json-1" in process.text(), 5, "the access log line")
    records = [json.loads(line) for line in process.text().splitlines() if line.strip()]
    assert all({"ts", "level", "logger", "message", "process"} <= set(r) for r in records)
    assert all(r["process"] == "router" for r in records)
    [access] = [r for r in records if r.get("request_id") == "json-1"]
    assert access["logger"] == "slm_server.access"
    assert access["level"] == "INFO"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", access["ts"])
    assert {k: access[k] for k in ("method", "path", "model", "status", "outcome")} == {
        "method": "POST",
        "path": CHAT,
        "model": "alpha",
        "status": 200,
        "outcome": "ok",
    }
    assert access["duration_ms"] >= 0


def test_without_a_collector_requests_succeed_and_shutdown_is_prompt(
    fakes: dict[str, FakeBackend], tmp_path: Path
) -> None:
    nobody = f"http://127.0.0.1:{free_port()}"
    env = registry_env(
        tmp_path, registry(fakes), OTEL_BSP_SCHEDULE_DELAY=EXPORT_DELAY_MS, SLM_OTLP_ENDPOINT=nobody
    )
    with running_router(env, tmp_path) as (process, url):

        def export_warnings() -> list[str]:
            return [line for line in process.text().splitlines() if "trace export to" in line]

        body = {"model": "alpha", "messages": HELLO}
        stream = {**body, "stream": True}
        for _ in range(5):
            assert one_shot.post(f"{url}{CHAT}", json=body).status_code == 200
            with one_shot.stream("POST", f"{url}{CHAT}", json=stream) as response:
                assert response.status_code == 200
                assert list(response.iter_lines())
        poll(lambda: bool(export_warnings()), 15, "the export warning")
        for _ in range(20):
            assert one_shot.post(f"{url}{CHAT}", json=body).status_code == 200
        # Spans are still queued (or being retried) when the signal comes.
        started = time.monotonic()
        process.popen.send_signal(signal.SIGTERM)
        code = process.popen.wait(timeout=10)
        elapsed = time.monotonic() - started
    assert code in (0, -signal.SIGTERM)  # uvicorn re-raises the signal once it is done
    assert elapsed < 5, f"the router took {elapsed:.1f}s to stop"
    [warning] = export_warnings()
    assert nobody in warning
    complaints = [line for line in process.text().splitlines() if " WARNING " in line]
    assert complaints == [warning]
    assert " ERROR " not in process.text()
    assert "Traceback" not in process.text()
