"""Spans and metrics with the real llama-server behind the router: a streamed chat
arrives at a real OTLP/HTTP receiver as the caller's child span, with the token usage
llama-server reported even though the client never asked for it."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests import one_shot
from tests.integration.otlp_receiver import SPAN_KIND_CLIENT, OtlpReceiver
from tests.integration.real_stack import Stack, running_gateway

# One worker runs the whole module: its module-scoped stack starts once, not per worker.
pytestmark = [pytest.mark.real_model, pytest.mark.xdist_group("test_telemetry_real")]

CHAT_MODEL = "smollm2-135m-instruct"
EMBED_MODEL = "gemma-3-270m-embed"


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as running:
        yield running


@pytest.fixture(scope="module")
def gateway(
    receiver: OtlpReceiver, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Stack, str]]:
    workdir: Path = tmp_path_factory.mktemp("real-traced")
    # The router inherits the test's environment (and so does the launcher, harmlessly).
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SLM_OTLP_ENDPOINT", receiver.url)
        env.setenv("OTEL_BSP_SCHEDULE_DELAY", "20")
        with running_gateway(workdir) as running:
            yield running


def test_a_streamed_chat_is_one_child_span_with_usage(
    gateway: tuple[Stack, str], receiver: OtlpReceiver
) -> None:
    stack, url = gateway
    trace_id, parent_id = uuid.uuid4().hex, uuid.uuid4().hex[:16]
    request_id = f"real-{uuid.uuid4().hex[:8]}"
    body = {
        "model": CHAT_MODEL,
        "messages": [{"role": "user", "content": "Count from one to five."}],
        "max_tokens": 16,
        "temperature": 0,
        "stream": True,
    }
    headers = {"traceparent": f"00-{trace_id}-{parent_id}-01", "x-request-id": request_id}
    with one_shot.stream(
        "POST", f"{url}/v1/chat/completions", json=body, headers=headers, timeout=120
    ) as response:
        assert response.status_code == 200
        assert response.headers["x-request-id"] == request_id
        payloads = [
            json.loads(line[5:])
            for line in response.iter_lines()
            if line.startswith("data:") and line.strip() != "data: [DONE]"
        ]
    assert payloads and all(not p.get("usage") for p in payloads)

    span = receiver.span_for(request_id, timeout=30)
    assert (span.trace_id, span.parent_span_id) == (trace_id, parent_id)
    assert span.kind == SPAN_KIND_CLIENT
    assert span.name == f"chat {CHAT_MODEL}"
    attrs = span.attributes
    assert attrs["gen_ai.operation.name"] == "chat"
    assert attrs["gen_ai.provider.name"] == "llama.cpp"
    assert attrs["gen_ai.request.model"] == CHAT_MODEL
    assert attrs["gen_ai.response.model"]
    assert attrs["gen_ai.request.stream"] is True
    assert attrs["gen_ai.request.max_tokens"] == 16
    assert attrs["gen_ai.request.temperature"] == 0
    assert attrs["gen_ai.response.id"] == payloads[0]["id"]
    assert attrs["server.port"] == stack.ports["standard"]
    assert attrs["slm.emit_path"] == "streaming"
    assert attrs["http.response.status_code"] == 200
    assert attrs["gen_ai.usage.input_tokens"] > 0
    assert 0 < attrs["gen_ai.usage.output_tokens"] <= 16
    assert set(attrs["gen_ai.response.finish_reasons"]) <= {"stop", "length"}
    assert 0 < attrs["gen_ai.response.time_to_first_chunk"] < (span.end_ns - span.start_ns) / 1e9
    assert "error.type" not in attrs

    metrics = one_shot.get(f"{url}/metrics").text
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(metrics)
        for s in family.samples
    }
    model = (("model", CHAT_MODEL),)
    assert samples[("slm_completion_tokens_total", model)] >= attrs["gen_ai.usage.output_tokens"]
    assert samples[("slm_time_to_first_token_seconds_count", model)] >= 1
    states = {k[1]: v for k, v in samples.items() if k[0] == "slm_backend_state" and v == 1}
    assert (
        ("model", CHAT_MODEL),
        ("replica", "1"),
        ("role", "standard"),
        ("state", "ready"),
    ) in states


def test_real_embeddings_span(gateway: tuple[Stack, str], receiver: OtlpReceiver) -> None:
    _stack, url = gateway
    request_id = f"real-embed-{uuid.uuid4().hex[:8]}"
    response = one_shot.post(
        f"{url}/v1/embeddings",
        json={"model": EMBED_MODEL, "input": ["hello world"]},
        headers={"x-request-id": request_id},
        timeout=60,
    )
    assert response.status_code == 200
    span = receiver.span_for(request_id, timeout=30)
    assert span.name == f"embeddings {EMBED_MODEL}"
    assert span.parent_span_id == ""
    assert span.attributes["gen_ai.usage.input_tokens"] > 0
    assert span.attributes["slm.emit_path"] == "embeddings"
