"""Image generations, image edits and audio transcriptions through a real router process
in front of fake backends (real processes): routed by ``model`` like every other route,
multipart forms forwarded byte for byte, and the same refusals, limits and watchdog."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.fakes.control import FakeBackend
from tests.processes import RunningRouter, StartRouter, poll
from tests.registry_entries import registry_entry

# Its module-scoped stack starts once: one worker runs the whole module.
pytestmark = pytest.mark.xdist_group("test_media_routes")

GENERATIONS = "/v1/images/generations"
EDITS = "/v1/images/edits"
TRANSCRIPTIONS = "/v1/audio/transcriptions"
CHAT = "/v1/chat/completions"
KEY = "sk-media-test-key"
# model_type of each fake-backed entry; the role is also the model id.
TYPES = {"alpha": "lm", "painter": "image-generation", "editor": "image-edit", "scribe": "whisper"}
FAKE_ROLES = tuple(TYPES)
BOUNDARY = "media-test-boundary"
# Binary bytes that look like line ends, near-boundaries and part headers.
TRICKY = (
    bytes(range(256))
    + b"\r\n\r\n--media-test-boundar\r\n--media-test-boundary-\r\n--media-test-boundaryX"
    + b'\r\nContent-Disposition: form-data; name="model"\r\n\r\nalpha\r\n\r'
) * 200
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def entry(model_id: str, port: int) -> dict[str, Any]:
    """The chat model on llama.cpp, the media models on MLX."""
    model_type = TYPES[model_id]
    mlx = {} if model_type == "lm" else {"backend": "mlx", "quantization": "4bit"}
    return registry_entry(model_id, port, model_path="models/none", model_type=model_type, **mlx)


@pytest.fixture(scope="module")
def router_process(fakes: dict[str, FakeBackend], start_router: StartRouter) -> RunningRouter:
    models = {role: entry(role, fake.port) for role, fake in fakes.items()}
    return start_router(models, SLM_OTEL_ENABLED="false", SLM_MAX_BODY_MB="0.5", SLM_API_KEYS=KEY)


@pytest.fixture
def http(router: str) -> Iterator[httpx.Client]:
    """A client with the API key."""
    headers = {"authorization": f"Bearer {KEY}"}
    with httpx.Client(base_url=router, timeout=10.0, headers=headers, trust_env=False) as client:
        yield client


def part(name: str, value: bytes | str, filename: str | None = None) -> bytes:
    data = value.encode() if isinstance(value, str) else value
    disposition = f'form-data; name="{name}"'
    head = f"Content-Disposition: {disposition}\r\n"
    if filename is not None:
        head = f'Content-Disposition: {disposition}; filename="{filename}"\r\n'
        head += "Content-Type: application/octet-stream\r\n"
    return f"--{BOUNDARY}\r\n{head}\r\n".encode() + data + b"\r\n"


def form(*parts: bytes) -> tuple[bytes, dict[str, str]]:
    """A body and its headers, encoded by hand so every byte is known."""
    raw = b"".join(parts) + f"--{BOUNDARY}--\r\n".encode()
    return raw, {"content-type": f"multipart/form-data; boundary={BOUNDARY}"}


def audio_form(model: str | None = "scribe", **fields: str) -> tuple[bytes, dict[str, str]]:
    parts = [part("file", TRICKY, "speech.wav")]
    if model is not None:
        parts.insert(0, part("model", model))
    parts += [part(name, value) for name, value in fields.items()]
    return form(*parts)


def error_of(response: httpx.Response) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"error"}
    assert {"message", "type", "code"} <= set(body["error"])
    error: dict[str, Any] = body["error"]
    return error


def scrape(http: httpx.Client) -> Samples:
    samples: Samples = {}
    for family in text_string_to_metric_families(http.get("/metrics").text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def moved(before: Samples, after: Samples, name: str, **labels: str) -> float:
    key = (name, frozenset(labels.items()))
    return after.get(key, 0.0) - before.get(key, 0.0)


def test_each_endpoint_reaches_the_backend_its_model_names(
    http: httpx.Client, fakes: dict[str, FakeBackend]
) -> None:
    before = scrape(http)
    generated = http.post(GENERATIONS, json={"model": "painter", "prompt": "a fox", "n": 2})
    assert generated.status_code == 200
    assert generated.headers["content-type"] == "application/json"
    assert [len(item["b64_json"]) > 0 for item in generated.json()["data"]] == [True, True]

    raw, headers = form(
        part("model", "editor"), part("prompt", "add a hat"), part("image", TRICKY, "fox.png")
    )
    edited = http.post(EDITS, content=raw, headers=headers)
    assert edited.status_code == 200
    assert len(edited.json()["data"]) == 1

    raw, headers = audio_form()
    transcribed = http.post(TRANSCRIPTIONS, content=raw, headers=headers)
    assert transcribed.status_code == 200
    assert transcribed.json()["text"] == f"fake transcript of speech.wav ({len(TRICKY)} bytes)"

    seen = {role: [r["path"] for r in fake.requests()] for role, fake in fakes.items()}
    assert seen == {
        "alpha": [],
        "painter": [GENERATIONS],
        "editor": [EDITS],
        "scribe": [TRANSCRIPTIONS],
    }
    after = scrape(http)
    for model, emit_path in [
        ("painter", "image_generations"),
        ("editor", "image_edits"),
        ("scribe", "transcriptions"),
    ]:
        labels = {"model": model, "emit_path": emit_path, "status_class": "2xx"}
        assert moved(before, after, "slm_requests_total", **labels, outcome="ok") == 1


def test_the_openai_sdk_works_through_the_router(
    router: str, fakes: dict[str, FakeBackend]
) -> None:
    with openai.OpenAI(base_url=f"{router}/v1", api_key=KEY, max_retries=0) as client:
        generated = client.images.generate(model="painter", prompt="a fox", n=1)
        edited = client.images.edit(
            model="editor", image=[("a.png", TRICKY), ("b.png", b"PNG")], prompt="a hat"
        )
        transcript = client.audio.transcriptions.create(
            model="scribe", file=("speech.wav", TRICKY), response_format="text"
        )
    assert generated.data and generated.data[0].b64_json
    assert edited.data and edited.data[0].b64_json
    assert transcript == f"fake transcript of speech.wav ({len(TRICKY)} bytes)"
    [edit] = fakes["editor"].requests()
    sent = [(p["filename"], p["sha256"]) for p in edit["form"] if "filename" in p]
    assert sent == [
        ("a.png", hashlib.sha256(TRICKY).hexdigest()),
        ("b.png", hashlib.sha256(b"PNG").hexdigest()),
    ]


@pytest.mark.parametrize(
    ("path", "role", "fields"),
    [
        (EDITS, "editor", [("prompt", "two images"), ("image[]", "a.png"), ("image[]", "b.png")]),
        (TRANSCRIPTIONS, "scribe", [("file", "speech.wav"), ("language", "en")]),
    ],
)
def test_a_form_arrives_byte_identical(
    http: httpx.Client,
    fakes: dict[str, FakeBackend],
    path: str,
    role: str,
    fields: list[tuple[str, str]],
) -> None:
    parts = [part("model", role)]
    for index, (name, value) in enumerate(fields):
        is_file = "." in value
        parts.append(part(name, TRICKY[index:] if is_file else value, value if is_file else None))
    raw, headers = form(*parts)
    response = http.post(path, content=raw, headers=headers)
    assert response.status_code == 200, response.text
    [record] = fakes[role].requests()
    assert record["content_type"] == headers["content-type"]
    assert record["body_size"] == len(raw)
    assert record["body_sha256"] == hashlib.sha256(raw).hexdigest()
    files = [p for p in record["form"] if "filename" in p]
    assert [p["sha256"] for p in files] == [
        hashlib.sha256(TRICKY[i:]).hexdigest() for i, (_n, v) in enumerate(fields) if "." in v
    ]


@pytest.mark.parametrize(
    ("response_format", "content_type", "starts"),
    [
        ("json", "application/json", b'{"text": "fake transcript'),
        ("verbose_json", "application/json", b'{"text": "fake transcript'),
        ("text", "text/plain; charset=utf-8", b"fake transcript"),
        ("srt", "application/x-subrip", b"1\n00:00:00,000 --> "),
        ("vtt", "text/vtt; charset=utf-8", b"WEBVTT\n"),
    ],
)
def test_transcripts_keep_the_backend_s_content_type(
    http: httpx.Client, response_format: str, content_type: str, starts: bytes
) -> None:
    raw, headers = audio_form(response_format=response_format)
    response = http.post(TRANSCRIPTIONS, content=raw, headers=headers)
    assert response.status_code == 200
    assert response.headers["content-type"] == content_type
    assert response.content.startswith(starts)


def test_a_streamed_transcription_is_relayed_as_events(
    http: httpx.Client, fakes: dict[str, FakeBackend]
) -> None:
    fakes["scribe"].script(chunks=3, chunk_text="word ")
    raw, headers = audio_form(stream="true")
    with http.stream("POST", TRANSCRIPTIONS, content=raw, headers=headers) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["x-accel-buffering"] == "no", "relayed, not read whole"
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    assert "".join(c["choices"][0]["delta"]["content"] for c in chunks) == "word " * 3
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def as_form(model: str | None) -> dict[str, Any]:
    raw, headers = audio_form(model)
    return {"content": raw, "headers": headers}


NO_BOUNDARY = {"content-type": "multipart/form-data"}
BAD_FORM = {
    "content": b"--x\r\nnot a form",
    "headers": {"content-type": "multipart/form-data; boundary=x"},
}
REFUSALS = [
    ("gen-no-model", GENERATIONS, {"json": {"prompt": "x"}}, 400, "missing_model"),
    ("asr-no-model", TRANSCRIPTIONS, as_form(None), 400, "missing_model"),
    ("asr-json", TRANSCRIPTIONS, {"json": {"model": "scribe"}}, 400, "invalid_content_type"),
    ("edit-malformed", EDITS, BAD_FORM, 400, "invalid_multipart"),
    (
        "edit-no-boundary",
        EDITS,
        {**as_form("editor"), "headers": NO_BOUNDARY},
        400,
        "invalid_multipart",
    ),
    (
        "gen-unknown",
        GENERATIONS,
        {"json": {"model": "nope", "prompt": "x"}},
        404,
        "model_not_found",
    ),
    ("asr-unknown", TRANSCRIPTIONS, as_form("nope"), 404, "model_not_found"),
    ("asr-to-lm", TRANSCRIPTIONS, as_form("alpha"), 400, "unsupported_endpoint"),
    ("edit-to-generator", EDITS, as_form("painter"), 400, "unsupported_endpoint"),
    (
        "gen-to-editor",
        GENERATIONS,
        {"json": {"model": "editor", "prompt": "x"}},
        400,
        "unsupported_endpoint",
    ),
    (
        "chat-to-whisper",
        CHAT,
        {"json": {"model": "scribe", "messages": []}},
        400,
        "unsupported_endpoint",
    ),
]


@pytest.mark.parametrize(
    ("path", "request_kwargs", "status", "code"),
    [pytest.param(*case[1:], id=case[0]) for case in REFUSALS],
)
def test_refusals_are_openai_shaped_and_reach_no_backend(
    http: httpx.Client,
    fakes: dict[str, FakeBackend],
    path: str,
    request_kwargs: dict[str, Any],
    status: int,
    code: str,
) -> None:
    response = http.post(path, **request_kwargs)
    assert response.status_code == status, response.text
    error = error_of(response)
    assert error["code"] == code
    assert error["type"] == "invalid_request_error"
    assert "param" in error
    assert all(not fake.requests() for fake in fakes.values())


def test_a_form_over_the_body_limit_is_413(
    http: httpx.Client, fakes: dict[str, FakeBackend]
) -> None:
    raw, headers = form(part("model", "scribe"), part("file", TRICKY * 10, "long.wav"))
    assert len(raw) > 512 * 1024
    response = http.post(TRANSCRIPTIONS, content=raw, headers=headers)
    assert response.status_code == 413
    assert error_of(response)["code"] == "request_too_large"
    assert not fakes["scribe"].requests()


def test_the_new_routes_need_the_api_key(router: str) -> None:
    requests: list[tuple[str, dict[str, Any]]] = [
        (GENERATIONS, {"json": {"model": "painter", "prompt": "x"}}),
        (EDITS, as_form("editor")),
        (TRANSCRIPTIONS, as_form("scribe")),
    ]
    with httpx.Client(base_url=router, timeout=10.0, trust_env=False) as anonymous:
        for path, kwargs in requests:
            response = anonymous.post(path, **kwargs)
            assert response.status_code == 401
            assert error_of(response)["code"] == "invalid_api_key"


def test_a_backend_5xx_is_judged_by_the_watchdog(
    http: httpx.Client, fakes: dict[str, FakeBackend], router_process: RunningRouter
) -> None:
    events = router_process.workdir / "logs" / "watchdog.jsonl"

    def failures() -> list[dict[str, Any]]:
        if not events.exists():
            return []
        records = [json.loads(line) for line in events.read_text().splitlines() if line]
        return [r for r in records if r["event"] == "backend_failure" and r["role"] == "scribe"]

    before, seen = scrape(http), len(failures())
    fakes["scribe"].script(status=500)
    raw, headers = audio_form()
    response = http.post(TRANSCRIPTIONS, content=raw, headers=headers)
    assert response.status_code == 500
    assert error_of(response)["code"] == "500"
    poll(lambda: len(failures()) == seen + 1, 5, "the watchdog to log the failure")
    assert failures()[-1]["status"] == 500
    assert failures()[-1]["reason"] == "5xx"
    after = scrape(http)
    assert (
        moved(
            before, after, "slm_watchdog_failures_total", model="scribe", replica="1", reason="5xx"
        )
        == 1
    )
    failed = {"model": "scribe", "emit_path": "transcriptions", "status_class": "5xx"}
    assert moved(before, after, "slm_requests_total", **failed, outcome="backend_error") == 1


def test_a_slow_backend_meets_the_request_s_deadline(
    http: httpx.Client, fakes: dict[str, FakeBackend]
) -> None:
    fakes["painter"].script(delay_seconds=5)
    response = http.post(
        GENERATIONS,
        json={"model": "painter", "prompt": "x"},
        headers={"x-request-timeout": "0.5"},
    )
    assert response.status_code == 504
    assert error_of(response)["code"] == "deadline_exceeded"
    fakes["painter"].wait_for(lambda reqs: len(reqs) == 1 and reqs[0]["disconnected"])


def test_models_lists_every_type(http: httpx.Client) -> None:
    data = http.get("/v1/models").json()["data"]
    assert {m["id"]: m["model_type"] for m in data} == TYPES
