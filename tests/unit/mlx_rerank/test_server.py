"""The reranker's HTTP app with a stand-in scorer: readiness, errors, the worker
thread (no MLX)."""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import Awaitable, Callable, Sequence

import httpx

from slm_server.mlx_rerank.scoring import Scores
from slm_server.mlx_rerank.server import RerankService, Worker, create_app


class FakeScorer:
    """Scores each document by its length; records which thread it ran on."""

    def __init__(self) -> None:
        self.threads: list[str] = []
        self.calls: list[tuple[str, tuple[str, ...], str]] = []

    def score(self, query: str, documents: Sequence[str], instruction: str) -> Scores:
        self.threads.append(threading.current_thread().name)
        self.calls.append((query, tuple(documents), instruction))
        if query == "explode":
            raise RuntimeError("secret internals")
        return Scores(tuple(len(d) / 100 for d in documents), 7 * len(documents))


Check = Callable[[httpx.AsyncClient, RerankService, list[BaseException]], Awaitable[None]]


def run_app(
    check: Check, scorer: FakeScorer, gate: threading.Event | None = None, fail: bool = False
) -> None:
    """Run ``check`` against the app (its lifespan started, so loading begins) with a
    loader that waits for ``gate`` and then returns ``scorer`` or fails."""
    failures: list[BaseException] = []

    def load() -> FakeScorer:
        if gate is not None:
            gate.wait(10)
        if fail:
            raise OSError("no such model")
        return scorer

    worker = Worker()
    worker.start()
    service = RerankService("tiny-rr", load, worker, failures.append)
    app = create_app(service)

    async def main() -> None:
        transport = httpx.ASGITransport(app=app)
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=transport, base_url="http://rerank") as client,
        ):
            await check(client, service, failures)

    try:
        asyncio.run(main())
    finally:
        if gate is not None:
            gate.set()
        worker.stop()


async def until(predicate: Callable[[], Awaitable[bool]], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        await asyncio.sleep(0.01)


async def until_ready(client: httpx.AsyncClient) -> None:
    async def ready() -> bool:
        return (await client.get("/health")).status_code == 200

    await until(ready, 10, "the model to load")


def test_health_is_503_while_loading_then_200() -> None:
    gate = threading.Event()

    async def check(client: httpx.AsyncClient, service: RerankService, _f: object) -> None:
        loading = await client.get("/health")
        assert loading.status_code == 503
        assert loading.json()["status"] == "loading"
        assert loading.json()["error"]["type"] == "unavailable_error"
        early = await client.post("/v1/rerank", json={"query": "q", "documents": ["a"]})
        assert early.status_code == 503
        assert early.json()["error"]["code"] == 503
        # /v1/models answers at any time.
        assert (await client.get("/v1/models")).json()["data"][0]["id"] == "tiny-rr"
        gate.set()
        await until_ready(client)
        assert (await client.get("/health")).json() == {"status": "ok"}
        assert service.status == "ready"

    run_app(check, FakeScorer(), gate)


def test_rerank_answers_in_llama_server_shape_on_the_worker_thread() -> None:
    scorer = FakeScorer()

    async def check(client: httpx.AsyncClient, _s: object, _f: object) -> None:
        await until_ready(client)
        for path in ("/v1/rerank", "/rerank", "/v1/reranking", "/reranking"):
            response = await client.post(
                path, json={"model": "alias", "query": "q", "documents": ["aa", "a", "aaa"]}
            )
            assert response.status_code == 200, path
            assert response.json() == {
                "model": "alias",
                "object": "list",
                "usage": {"prompt_tokens": 21, "total_tokens": 21},
                "results": [
                    {"index": 2, "relevance_score": 0.03},
                    {"index": 0, "relevance_score": 0.02},
                    {"index": 1, "relevance_score": 0.01},
                ],
            }
        response = await client.post(
            "/v1/rerank",
            json={
                "query": "q",
                "documents": ["aa", {"text": "aaa"}],
                "top_n": 1,
                "return_documents": True,
                "instruction": "mine",
            },
        )
        assert response.json()["model"] == "tiny-rr"
        assert response.json()["results"] == [
            {"index": 1, "relevance_score": 0.03, "document": {"text": "aaa"}}
        ]

    run_app(check, scorer)
    assert scorer.calls[-1] == ("q", ("aa", "aaa"), "mine")
    assert set(scorer.threads) == {"mlx-worker"}


def test_bad_requests_get_openai_errors() -> None:
    async def check(client: httpx.AsyncClient, _s: object, _f: object) -> None:
        await until_ready(client)
        cases = [
            (b"{not json", "not valid JSON"),
            (b"\xff\xfe", "not valid JSON"),
            (b'{"documents": ["a"]}', '"query" must be provided'),
            (b'{"query": "q", "documents": []}', '"documents" must be a non-empty'),
            (b'{"query": "q", "documents": ["a"], "top_n": 0}', '"top_n" must be at least 1'),
        ]
        for content, message in cases:
            response = await client.post("/v1/rerank", content=content)
            assert response.status_code == 400
            error = response.json()["error"]
            assert message in error["message"]
            assert error["type"] == "invalid_request_error"
            assert error["code"] == 400
        missing = await client.get("/v1/nothing")
        assert missing.status_code == 404
        assert missing.json()["error"]["type"] == "not_found_error"
        assert (await client.get("/v1/rerank")).status_code == 405

    run_app(check, FakeScorer())


def test_a_scoring_failure_is_a_500_without_internals() -> None:
    async def check(client: httpx.AsyncClient, _s: object, _f: object) -> None:
        await until_ready(client)
        response = await client.post("/v1/rerank", json={"query": "explode", "documents": ["a"]})
        assert response.status_code == 500
        assert response.json() == {
            "error": {
                "message": "reranking failed: RuntimeError",
                "type": "server_error",
                "code": 500,
            }
        }
        # The server goes on serving.
        ok = await client.post("/v1/rerank", json={"query": "q", "documents": ["a"]})
        assert ok.status_code == 200

    run_app(check, FakeScorer())


def test_a_failed_load_reports_and_calls_back() -> None:
    async def check(
        client: httpx.AsyncClient, service: RerankService, failures: list[BaseException]
    ) -> None:
        async def failed() -> bool:
            return service.status == "failed"

        await until(failed, 10, "the load to fail")
        health = await client.get("/health")
        assert health.status_code == 503
        assert health.json()["status"] == "error"
        assert "no such model" in health.json()["error"]["message"]
        assert len(failures) == 1
        assert isinstance(failures[0], OSError)
        rerank = await client.post("/v1/rerank", json={"query": "q", "documents": ["a"]})
        assert rerank.status_code == 503

    run_app(check, FakeScorer(), fail=True)


def test_models_lists_the_model_id() -> None:
    async def check(client: httpx.AsyncClient, _s: object, _f: object) -> None:
        for path in ("/v1/models", "/models"):
            body = (await client.get(path)).json()
            assert body["object"] == "list"
            assert [m["id"] for m in body["data"]] == ["tiny-rr"]
            assert body["data"][0]["object"] == "model"

    run_app(check, FakeScorer())


def test_worker_runs_calls_in_order_and_passes_errors() -> None:
    worker = Worker("test-worker")
    worker.start()
    try:
        order: list[int] = []
        futures = [worker.submit(functools.partial(order.append, i)) for i in range(5)]
        failing = worker.submit(lambda: 1 / 0)
        for future in futures:
            future.result(timeout=10)
        assert order == [0, 1, 2, 3, 4]
        assert isinstance(failing.exception(timeout=10), ZeroDivisionError)
    finally:
        worker.stop()
