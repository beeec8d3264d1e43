"""Fuzzing the running router (a real uvicorn process) with hypothesis: malformed
bodies, wrong types, huge values and odd headers on every route. The router must never
answer 5xx, every error must be OpenAI-shaped, and it must stay healthy."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slm_server.router.intake.strict_json import MAX_DEPTH
from tests.fakes.control import FakeBackend
from tests.processes import RunningRouter, StartRouter
from tests.registry_entries import registry_entry

# Its module-scoped stack starts once: one worker runs the whole module.
pytestmark = pytest.mark.xdist_group("test_fuzz")

ROUTES = [
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/responses"),
    ("POST", "/v1/embeddings"),
    ("POST", "/v1/rerank"),
    ("GET", "/v1/models"),
    ("GET", "/v1/backends/health"),
    ("GET", "/health"),
    ("GET", "/ui"),
    ("GET", "/v1/ui/requests"),
    ("GET", "/v1/ui/logs/chat"),
    ("GET", "/v1/ui/logs/missing"),
    ("GET", "/v1/chat/completions"),
    ("DELETE", "/v1/models"),
    ("POST", "/v1/unknown"),
]
MODELS = ["chat", "embed", "rerank", "missing", "", "ch\u00e4t", "x" * 300]

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40)
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=12), children, max_size=5)
    ),
    max_leaves=20,
)
messages = st.one_of(
    json_values,
    st.lists(
        st.fixed_dictionaries(
            {"role": st.sampled_from(["user", "system", "assistant", "tool", 7, None])},
            optional={"content": json_values},
        ),
        max_size=4,
    ),
)
objects = st.fixed_dictionaries(
    {},
    optional={
        "model": st.sampled_from(MODELS) | json_values,
        "messages": messages,
        "prompt": json_values,
        "input": json_values,
        "query": json_values,
        "documents": json_values,
        "stream": st.booleans() | json_values,
        "stream_options": json_values,
        "max_tokens": st.integers(min_value=-(10**12), max_value=10**12) | json_values,
        "temperature": json_values,
        "tools": json_values,
        "instructions": json_values,
        "chat_template_kwargs": json_values,
    },
)
# Values Python's json.loads takes and llama-server's parser (and the fakes, which
# answer them 500 as it does) refuses: the router must refuse them itself, with 400.
refused_values = (
    st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999", "-1E400", "9" * 400])
    | st.integers(0xD800, 0xDFFF).map(lambda c: f'"x\\u{c:04x}"')
    | st.integers(1, 50).map(lambda n: "[" * (MAX_DEPTH + n) + "]" * (MAX_DEPTH + n))
)


def _with_value(body: dict[str, Any], name: str, value: str) -> bytes:
    text = json.dumps({k: v for k, v in body.items() if k != name})
    return f'{text[:-1]}{", " if len(text) > 2 else ""}"{name}": {value}}}'.encode()


strict_garbage = st.one_of(
    st.builds(
        _with_value, objects, st.sampled_from(["messages", "temperature", "x"]), refused_values
    ),
    st.builds(
        lambda o, codec: json.dumps(o).encode(codec),
        objects,
        st.sampled_from(["utf-16", "utf-16-le", "utf-32-be"]),
    ),
)
bodies = st.one_of(
    objects.map(lambda o: json.dumps(o).encode()),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=200),
    st.text(max_size=200).map(str.encode),
    strict_garbage,
)
# Printable ASCII without surrounding whitespace, which the HTTP client refuses to send.
header_values = st.text(
    alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=60
).map(str.strip)
headers = st.fixed_dictionaries(
    {},
    optional={
        "content-type": st.sampled_from(["application/json", "text/plain", "", "multipart/x"])
        | header_values,
        "x-request-id": header_values,
        "traceparent": header_values,
        "x-trace-id": header_values,
        "accept": header_values,
        "x-request-timeout": st.sampled_from(["soon", "-1", "0", "nan", "1e9", "inf"]),
    },
)


# The model type of each fake backend (the role is also the model id).
KINDS = {"chat": "lm", "embed": "embeddings", "rerank": "rerank"}
FAKE_ROLES = tuple(KINDS)


@pytest.fixture(scope="module")
def router_process(fakes: dict[str, FakeBackend], start_router: StartRouter) -> RunningRouter:
    entries = {
        role: registry_entry(
            role, fake.port, model_path="x.gguf", model_type=KINDS[role], max_concurrency=4
        )
        for role, fake in fakes.items()
    }
    return start_router(entries, SLM_OTEL_ENABLED="false")


@pytest.fixture(scope="module")
def http(router: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=router, timeout=30, trust_env=False) as client:
        yield client


@settings(
    max_examples=400,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(route=st.sampled_from(ROUTES), body=bodies, extra=headers)
def test_no_input_makes_the_router_fail(
    http: httpx.Client, route: tuple[str, str], body: bytes, extra: dict[str, str]
) -> None:
    method, path = route
    response = http.request(method, path, content=body, headers=extra)
    assert response.status_code < 500, (response.status_code, response.text[:300])
    if response.status_code >= 400:
        error = response.json()["error"]
        assert isinstance(error["message"], str)
        assert error["message"]
        assert isinstance(error["type"], str)
        assert "code" in error
        assert "Traceback" not in response.text


@settings(
    max_examples=150,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    path=st.sampled_from(["/v1/chat/completions", "/v1/completions", "/v1/responses"]),
    body=strict_garbage,
    content_type=st.sampled_from(["application/json", "text/plain"]),
)
def test_json_a_backend_cannot_parse_is_refused_before_it(
    http: httpx.Client, path: str, body: bytes, content_type: str
) -> None:
    response = http.post(path, content=body, headers={"content-type": content_type})
    if content_type == "text/plain":  # refused for its type, before the body is read
        assert response.status_code == 415, response.text[:300]
        assert response.json()["error"]["code"] == "unsupported_media_type"
        return
    assert response.status_code == 400, response.text[:300]
    assert response.json()["error"]["code"] == "invalid_json"


def test_the_router_is_healthy_after_the_fuzzing(http: httpx.Client) -> None:
    assert http.get("/health").status_code == 200
    body = {"model": "chat", "messages": [{"role": "user", "content": "still there?"}]}
    assert http.post("/v1/chat/completions", json=body).status_code == 200
