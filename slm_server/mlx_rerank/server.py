"""The reranker's HTTP server: a Starlette app under uvicorn, one MLX worker thread.

    POST /v1/rerank  (also /rerank, /v1/reranking, /reranking)   see ``api.py``
    GET  /health     503 {"status": "loading", "error": {...}} while the model loads,
                     200 {"status": "ok"} once it can score (llama-server's contract)
    GET  /v1/models  (also /models) the model id, at any time

The model loads on the worker thread while the server already answers, so the
launcher sees "loading" rather than a refused connection. Every MLX call (the load,
then each request's scoring) runs on that one thread, in arrival order, so the event
loop stays free and MLX never runs twice at once. A model that fails to load stops
the process with exit code 1. SIGTERM or SIGINT stop it cleanly with code 0, even
mid-load (the worker is a daemon thread, and the process ends without waiting for it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Literal, NoReturn, Protocol, TypeVar

import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from slm_server.contracts import engine_paths
from slm_server.mlx_rerank.api import RequestError, error_body, parse_rerank, response_body
from slm_server.mlx_rerank.scoring import Limits, ModelLoadError, Reranker, Scores

log = logging.getLogger("slm_server.mlx_rerank")
T = TypeVar("T")
RERANK_PATHS = (engine_paths.RERANK, "/rerank", "/v1/reranking", "/reranking")
LOADING_MESSAGE = "Loading model"


class Scorer(Protocol):
    def score(self, query: str, documents: Sequence[str], instruction: str) -> Scores: ...


class Worker:
    """One daemon thread running submitted calls one at a time, in order."""

    def __init__(self, name: str = "mlx-worker") -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]] | None] = (
            queue.SimpleQueue()
        )
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, call: Callable[[], T]) -> Future[T]:
        future: Future[T] = Future()
        self._jobs.put((call, future))
        return future

    def stop(self) -> None:
        """Run no more calls after the current one."""
        self._jobs.put(None)

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            call, future = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = call()
            except BaseException as exc:
                future.set_exception(exc)
            else:
                future.set_result(result)


class RerankService:
    """The model's life: loading, then ready (or failed); scoring on the worker."""

    def __init__(
        self,
        model_id: str,
        load: Callable[[], Scorer],
        worker: Worker,
        on_load_failure: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.model_id = model_id
        self.created = int(time.time())
        self.status: Literal["loading", "ready", "failed"] = "loading"
        self.load_error: str | None = None
        self._load = load
        self._worker = worker
        self._scorer: Scorer | None = None
        self._on_load_failure = on_load_failure

    def start_loading(self) -> Future[None]:
        return self._worker.submit(self._load_now)

    def _load_now(self) -> None:
        started = time.monotonic()
        try:
            scorer = self._load()
        except Exception as exc:
            self.load_error = str(exc) if isinstance(exc, ModelLoadError) else repr(exc)
            self.status = "failed"
            if isinstance(exc, ModelLoadError):  # says it all
                log.error("%s failed to load: %s", self.model_id, exc)
            else:
                log.exception("%s failed to load", self.model_id)
            if self._on_load_failure is not None:
                self._on_load_failure(exc)
            return
        self._scorer = scorer
        self.status = "ready"
        log.info("%s loaded in %.1fs", self.model_id, time.monotonic() - started)

    async def score(self, query: str, documents: Sequence[str], instruction: str) -> Scores:
        scorer = self._scorer
        if scorer is None:
            raise RuntimeError("the model is not loaded")
        future = self._worker.submit(lambda: scorer.score(query, documents, instruction))
        return await asyncio.wrap_future(future)


def _error(message: str, kind: str, status: int) -> JSONResponse:
    return JSONResponse(error_body(message, kind, status), status_code=status)


def _unavailable(service: RerankService) -> JSONResponse:
    if service.status == "failed":
        body = error_body(f"the model failed to load: {service.load_error}", "server_error", 503)
        return JSONResponse({"status": "error", **body}, status_code=503)
    body = error_body(LOADING_MESSAGE, "unavailable_error", 503)
    return JSONResponse({"status": "loading", **body}, status_code=503)


def create_app(service: RerankService) -> Starlette:
    """The HTTP app; loading starts with the app's lifespan."""

    async def health(_request: Request) -> Response:
        if service.status == "ready":
            return JSONResponse({"status": "ok"})
        return _unavailable(service)

    async def models(_request: Request) -> Response:
        entry = {
            "id": service.model_id,
            "object": "model",
            "created": service.created,
            "owned_by": "slm_server",
        }
        return JSONResponse({"object": "list", "data": [entry]})

    async def rerank(request: Request) -> Response:
        if service.status != "ready":
            return _unavailable(service)
        raw = await request.body()
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            return _error("the request body is not valid JSON", "invalid_request_error", 400)
        try:
            parsed = parse_rerank(body)
        except RequestError as exc:
            return JSONResponse(exc.body(), status_code=exc.status)
        started = time.monotonic()
        try:
            scores = await service.score(parsed.query, parsed.documents, parsed.instruction)
        except Exception as exc:
            log.exception("reranking %d document(s) failed", len(parsed.documents))
            return _error(f"reranking failed: {type(exc).__name__}", "server_error", 500)
        log.info(
            "reranked %d document(s), %d prompt tokens, in %.0f ms",
            len(parsed.documents),
            scores.prompt_tokens,
            (time.monotonic() - started) * 1000,
        )
        return JSONResponse(
            response_body(parsed, service.model_id, scores.scores, scores.prompt_tokens)
        )

    async def http_error(_request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        kind = {404: "not_found_error", 405: "invalid_request_error"}.get(status, "server_error")
        detail = exc.detail if isinstance(exc, HTTPException) else "internal error"
        return _error(str(detail), kind, status)

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        service.start_loading()
        yield

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/models", models, methods=["GET"]),
        *(Route(path, rerank, methods=["POST"]) for path in RERANK_PATHS),
    ]
    return Starlette(
        routes=routes, lifespan=lifespan, exception_handlers={HTTPException: http_error}
    )


class QuietServer(uvicorn.Server):
    """uvicorn's Server, except that after a graceful stop on SIGTERM/SIGINT it returns
    (exit code 0, as llama-server) instead of re-raising the signal to die by it."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        handled = (signal.SIGINT, signal.SIGTERM)
        original = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)


@dataclass(frozen=True)
class Options:
    model_path: str
    host: str
    port: int
    model_id: str
    limits: Limits


def serve(options: Options) -> NoReturn:
    """Run the server until SIGTERM/SIGINT (exit code 0) or a failed model load (1),
    then end the process."""
    worker = Worker()
    worker.start()
    failed = threading.Event()
    server: QuietServer | None = None

    def on_load_failure(_exc: BaseException) -> None:
        failed.set()
        if server is not None:
            server.should_exit = True

    service = RerankService(
        options.model_id,
        lambda: Reranker.load(options.model_path, options.limits),
        worker,
        on_load_failure,
    )
    config = uvicorn.Config(
        create_app(service),
        host=options.host,
        port=options.port,
        log_config=None,
        access_log=False,
        ws="none",
        timeout_graceful_shutdown=10,
    )
    server = QuietServer(config)
    log.info(
        "serving %s from %s on http://%s:%d",
        options.model_id,
        options.model_path,
        options.host,
        options.port,
    )
    code = 0
    try:
        server.run()
    except SystemExit as exc:  # uvicorn's way out when it cannot bind the port
        code = exc.code if isinstance(exc.code, int) else 1
    if failed.is_set():
        code = 1
    # Exit without finalizing the interpreter. The worker thread used MLX, which keeps
    # per-thread caches holding Python objects; when that thread's cleanup runs while
    # the interpreter finalizes, it cannot take the GIL and the process aborts
    # ("terminate called without an active exception", exit -6). Nothing else needs
    # cleaning up, and a load or download still in progress is simply abandoned.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
