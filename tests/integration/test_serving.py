"""The serving policy on real sockets against the fake backend: admission (queue full,
FIFO), deadlines (queued and mid-generation), disconnects freeing slots, body limits,
API keys and draining on SIGTERM."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.fakes.control import FakeBackend
from tests.processes import Command, poll, running_router
from tests.registry_entries import registry_entry

CHAT = "/v1/chat/completions"


def say(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


@contextmanager
def gateway(tmp: Path, fake: FakeBackend, **entry: Any) -> Iterator[tuple[Command, httpx.Client]]:
    fields = registry_entry("m", fake.port, model_path="x.gguf", max_concurrency=1, max_queue=2)
    env_overrides = {k[4:].upper(): str(v) for k, v in entry.items() if k.startswith("env_")}
    fields.update({k: v for k, v in entry.items() if not k.startswith("env_")})
    config = tmp / "models.yaml"
    config.write_text(yaml.safe_dump({"models": {"standard": fields}}))
    env = {
        "SLM_CONFIG": str(config),
        "SLM_BACKEND_LOG_DIR": str(tmp / "logs"),
        "SLM_LLAMA_SERVER_BIN": "",
        "SLM_OTEL_ENABLED": "false",
        **env_overrides,
    }
    with (
        running_router(env, tmp) as (router, url),
        httpx.Client(base_url=url, timeout=30, trust_env=False) as http,
    ):
        yield router, http


@pytest.fixture
def fake() -> Iterator[FakeBackend]:
    with FakeBackend.start(model_id="m") as backend:
        yield backend


def queue_of(http: httpx.Client) -> tuple[int, int]:
    item = http.get("/v1/backends/health").json()["standard"]
    return item["in_flight"], item["queued"]


def test_a_full_queue_is_refused_at_once_with_retry_after(
    tmp_path: Path, fake: FakeBackend
) -> None:
    fake.script(delay_seconds=3)
    with gateway(tmp_path, fake, max_queue=1) as (_router, http), ThreadPoolExecutor(2) as pool:
        busy = pool.submit(http.post, CHAT, json={"model": "m", "messages": say("a")})
        poll(lambda: queue_of(http) == (1, 0), 5, "one request in flight")
        waiting = pool.submit(http.post, CHAT, json={"model": "m", "messages": say("b")})
        poll(lambda: queue_of(http) == (1, 1), 5, "one request queued")
        for stream in (False, True):
            started = time.monotonic()
            body = {"model": "m", "messages": say("c"), "stream": stream}
            refused = http.post(CHAT, json=body)
            assert time.monotonic() - started < 1
            assert refused.status_code == 429
            assert refused.headers["retry-after"] == "1"
            assert refused.headers["content-type"] == "application/json"
            assert refused.json()["error"]["code"] == "queue_full"
        assert busy.result().status_code == 200
        assert waiting.result().status_code == 200
    bodies = [r["body"]["messages"][0]["content"] for r in fake.requests()]
    assert bodies == ["a", "b"], "refused requests never reach the backend"


def test_queued_requests_are_served_in_arrival_order(tmp_path: Path, fake: FakeBackend) -> None:
    fake.script(delay_seconds=0.3)
    with gateway(tmp_path, fake, max_queue=5) as (_router, http), ThreadPoolExecutor(5) as pool:
        futures: list[Future[httpx.Response]] = []
        for index, text in enumerate("abcde"):
            futures.append(pool.submit(http.post, CHAT, json={"model": "m", "messages": say(text)}))

            def admitted(count: int = index + 1) -> bool:
                return sum(queue_of(http)) == count

            poll(admitted, 5, f"request {text} admitted")
        assert [f.result().status_code for f in futures] == [200] * 5
    assert [r["body"]["messages"][0]["content"] for r in fake.requests()] == list("abcde")


def test_a_deadline_reached_in_the_queue_is_504_and_never_reaches_the_backend(
    tmp_path: Path, fake: FakeBackend
) -> None:
    fake.script(delay_seconds=2)
    with gateway(tmp_path, fake) as (_router, http), ThreadPoolExecutor(1) as pool:
        busy = pool.submit(http.post, CHAT, json={"model": "m", "messages": say("a")})
        poll(lambda: queue_of(http) == (1, 0), 5, "one request in flight")
        started = time.monotonic()
        late = http.post(
            CHAT, json={"model": "m", "messages": say("late")}, headers={"X-Request-Timeout": "0.5"}
        )
        assert 0.4 < time.monotonic() - started < 1.5
        assert late.status_code == 504
        assert late.json()["error"]["code"] == "deadline_exceeded_in_queue"
        assert busy.result().status_code == 200
    assert [r["body"]["messages"][0]["content"] for r in fake.requests()] == ["a"]
    events = tmp_path / "logs" / "watchdog.jsonl"
    assert not events.exists() or "backend_failure" not in events.read_text()


def test_a_deadline_mid_stream_ends_it_in_band_and_closes_the_upstream(
    tmp_path: Path, fake: FakeBackend
) -> None:
    fake.script(chunks=100, chunk_interval_seconds=0.05)
    with gateway(tmp_path, fake) as (_router, http):
        body = {"model": "m", "messages": say("x"), "stream": True}
        with http.stream("POST", CHAT, json=body, headers={"X-Request-Timeout": "1"}) as response:
            assert response.status_code == 200
            events = [line for line in response.iter_lines() if line.startswith("data:")]
    last = json.loads(events[-1][5:])
    assert last["error"]["code"] == "deadline_exceeded"
    assert 5 < len(events) < 60
    [record] = fake.wait_for(lambda reqs: bool(reqs) and reqs[0]["disconnected"])
    assert record["chunks_sent"] < 100


def test_a_client_disconnect_frees_its_slot_within_a_second(
    tmp_path: Path, fake: FakeBackend
) -> None:
    fake.script(chunks=1000, chunk_interval_seconds=0.05)
    with gateway(tmp_path, fake, max_queue=0) as (_router, http):
        body = {"model": "m", "messages": say("x"), "stream": True}
        with http.stream("POST", CHAT, json=body) as response:
            lines = response.iter_lines()  # held: dropping it would close the stream
            assert next(line for line in lines if line.startswith("data: {"))
            assert queue_of(http) == (1, 0)
        gone = time.monotonic()
        poll(lambda: queue_of(http) == (0, 0), 1.0, "the slot to be free")
        assert time.monotonic() - gone < 1.0
        fake.script()
        assert http.post(CHAT, json={"model": "m", "messages": say("y")}).status_code == 200
    fake.wait_for(lambda reqs: reqs[0]["disconnected"])


def test_a_non_streaming_client_that_leaves_closes_the_upstream(
    tmp_path: Path, fake: FakeBackend
) -> None:
    fake.script(stall=True)
    with gateway(tmp_path, fake, max_queue=0) as (_router, http):
        with pytest.raises(httpx.ReadTimeout):
            http.post(CHAT, json={"model": "m", "messages": say("x")}, timeout=0.5)
        fake.wait_for(lambda reqs: bool(reqs) and reqs[0]["disconnected"])
        poll(lambda: queue_of(http) == (0, 0), 2, "the slot to be free")


def test_a_body_over_the_limit_is_413(tmp_path: Path, fake: FakeBackend) -> None:
    with gateway(tmp_path, fake, env_slm_max_body_mb="0.01") as (_router, http):
        big = {"model": "m", "messages": say("x" * 20_000)}
        response = http.post(CHAT, json=big)
        assert response.status_code == 413
        assert response.json()["error"]["code"] == "request_too_large"
        assert http.post(CHAT, json={"model": "m", "messages": say("x")}).status_code == 200
    assert len(fake.requests()) == 1


def test_a_bad_request_timeout_header_is_400(tmp_path: Path, fake: FakeBackend) -> None:
    with gateway(tmp_path, fake) as (_router, http):
        for value in ("soon", "-1", "0", "nan", "inf"):
            response = http.post(
                CHAT,
                json={"model": "m", "messages": say("x")},
                headers={"X-Request-Timeout": value},
            )
            assert response.status_code == 400, value
            assert response.json()["error"]["code"] == "invalid_timeout"


def test_api_keys_guard_every_v1_route(tmp_path: Path, fake: FakeBackend) -> None:
    keys = "sk-first-key-123,sk-second-key-456"
    with gateway(tmp_path, fake, env_slm_api_keys=keys) as (router, http):
        body = {"model": "m", "messages": say("x")}
        for headers in (
            {},
            {"Authorization": "Bearer wrong"},
            {"Authorization": "sk-first-key-123"},
        ):
            for method, path in (
                ("POST", CHAT),
                ("GET", "/v1/models"),
                ("GET", "/v1/models/m"),
                ("GET", "/v1/backends/health"),
                ("GET", "/metrics"),  # it names every model
            ):
                response = http.request(method, path, json=body, headers=headers)
                assert response.status_code == 401, (headers, path)
                assert response.headers["www-authenticate"] == "Bearer"
                assert response.json()["error"]["code"] == "invalid_api_key"
        good = {"Authorization": "Bearer sk-second-key-456"}
        assert http.post(CHAT, json=body, headers=good).status_code == 200
        assert (
            http.get("/v1/models", headers={"authorization": "bearer sk-first-key-123"}).status_code
            == 200
        )
        assert http.get("/health").status_code == 200
        assert http.get("/metrics", headers=good).status_code == 200
        output = router.text()
    assert "sk-first-key-123" not in output
    assert "sk-second-key-456" not in output
    assert all("authorization" not in r["headers"] for r in fake.requests())


def test_metrics_can_be_left_open_with_api_keys(tmp_path: Path, fake: FakeBackend) -> None:
    env = {"env_slm_api_keys": "sk-first-key-123", "env_slm_metrics_need_key": "false"}
    with gateway(tmp_path, fake, **env) as (_router, http):
        assert http.get("/metrics").status_code == 200
        assert http.get("/v1/models").status_code == 401


def test_sigterm_lets_in_flight_streams_finish(tmp_path: Path, fake: FakeBackend) -> None:
    fake.script(chunks=20, chunk_interval_seconds=0.1)
    with gateway(tmp_path, fake, env_slm_drain_timeout_seconds="10") as (router, http):
        body = {"model": "m", "messages": say("x"), "stream": True}
        with http.stream("POST", CHAT, json=body) as response:
            lines = response.iter_lines()
            assert next(line for line in lines if line.startswith("data: {"))
            router.popen.send_signal(signal.SIGTERM)
            rest = [line for line in lines if line.startswith("data:")]
        assert rest[-1] == "data: [DONE]"
        assert not any('"error"' in line for line in rest)
        assert router.popen.wait(timeout=10) in (0, -signal.SIGTERM)


def test_sigterm_ends_what_outlives_the_drain_with_a_clean_error(
    tmp_path: Path, fake: FakeBackend
) -> None:
    fake.script(chunks=200, chunk_interval_seconds=0.05)
    with gateway(tmp_path, fake, env_slm_drain_timeout_seconds="0.5") as (router, http):
        body = {"model": "m", "messages": say("x"), "stream": True}
        with http.stream("POST", CHAT, json=body) as response:
            lines = response.iter_lines()
            assert next(line for line in lines if line.startswith("data: {"))
            stopped = time.monotonic()
            router.popen.send_signal(signal.SIGTERM)
            rest = [line for line in lines if line.startswith("data:")]
        assert json.loads(rest[-1][5:])["error"]["code"] == "shutting_down"
        assert router.popen.wait(timeout=10) in (0, -signal.SIGTERM)
        assert time.monotonic() - stopped < 5
    fake.wait_for(lambda reqs: reqs[0]["disconnected"])


def test_a_request_waiting_past_the_drain_gets_503(tmp_path: Path, fake: FakeBackend) -> None:
    fake.script(stall=True)
    with gateway(tmp_path, fake, env_slm_drain_timeout_seconds="0.5") as (router, http):
        result: list[httpx.Response] = []

        def ask() -> None:
            result.append(http.post(CHAT, json={"model": "m", "messages": say("x")}))

        worker = threading.Thread(target=ask)
        worker.start()
        fake.wait_for(lambda reqs: len(reqs) == 1)
        router.popen.send_signal(signal.SIGTERM)
        worker.join(timeout=10)
        assert result[0].status_code == 503
        assert result[0].json()["error"]["code"] == "shutting_down"
        assert router.popen.wait(timeout=10) in (0, -signal.SIGTERM)


def test_a_client_leaving_the_queue_gives_up_its_place(tmp_path: Path, fake: FakeBackend) -> None:
    fake.script(delay_seconds=3)
    with gateway(tmp_path, fake, max_queue=1) as (_router, http), ThreadPoolExecutor(2) as pool:
        busy = pool.submit(http.post, CHAT, json={"model": "m", "messages": say("a")})
        poll(lambda: queue_of(http) == (1, 0), 5, "one request in flight")
        with pytest.raises(httpx.ReadTimeout):
            http.post(CHAT, json={"model": "m", "messages": say("gone")}, timeout=0.5)
        poll(lambda: queue_of(http) == (1, 0), 1, "the queue place to be given up")
        waiting = pool.submit(http.post, CHAT, json={"model": "m", "messages": say("b")})
        assert busy.result().status_code == 200
        assert waiting.result().status_code == 200
    assert [r["body"]["messages"][0]["content"] for r in fake.requests()] == ["a", "b"]
