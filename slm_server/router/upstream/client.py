"""The one module that talks HTTP to backends.

One keep-alive connection pool per backend (:mod:`slm_server.http1`). Transport
exceptions are translated here, at this single boundary, into the gateway's error tree:

    http1.ConnectError / ConnectTimeout   -> BackendUnavailable (503)
    http1.ReadTimeout                     -> BackendTimeout (504)
    http1.InvalidStatus                   -> BackendProtocolError (502, upstream_invalid)
    http1.ProtocolError / ConnectionClosed -> BackendProtocolError (502)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, overload

from slm_server.errors import (
    AnswerTooLarge,
    BackendProtocolError,
    BackendTimeout,
    BackendUnavailable,
)
from slm_server.http1 import (
    ConnectError,
    ConnectTimeout,
    HttpError,
    InvalidStatus,
    Pool,
    ReadTimeout,
)
from slm_server.registry import remote
from slm_server.registry.schema import ModelEntry, ModelSpec
from slm_server.router.call.fast_path import SpliceSource
from slm_server.router.upstream.sse import DONE, SseSplitter, data_object


class ResponseHeaders(Protocol):
    """A response's headers, looked up by lower-case name."""

    @overload
    def get(self, name: str) -> str | None: ...
    @overload
    def get(self, name: str, default: str) -> str: ...


class UpstreamResponse(Protocol):
    """An opened backend response (:class:`slm_server.http1.Response` in production):
    status and headers, and a body read with :func:`read_all`, :func:`iter_raw`,
    :func:`iter_bounded` or :func:`iter_sse`."""

    @property
    def status_code(self) -> int: ...
    @property
    def headers(self) -> ResponseHeaders: ...
    @property
    def complete(self) -> bool:
        """Whether the whole body has arrived, so that reading it never waits."""
        ...

    async def receive(self) -> bytes:
        """The next piece of the body, ``b""`` once it is complete; raises
        :class:`slm_server.http1.HttpError` (or a gateway error) on a broken body."""
        ...

    def spliceable(self) -> SpliceSource | None:
        """This response's body as a splice source (the fast path,
        :mod:`slm_server.router.call.fast_path`): the router's own HTTP client's
        response is one; None when the body can only be read with :meth:`receive`."""
        ...

    def close(self) -> None: ...
    async def aclose(self) -> None: ...


log = logging.getLogger("slm_server.router")

RETRY_AFTER_SECONDS = 5.0
SWEEP_SECONDS = 1.0  # how often pools a reload left are looked at, until closed
# Hop-by-hop and framing headers are the transport's business, never forwarded.
# Never passed upstream: hop-by-hop headers (RFC 9110 §7.6.1, plus Expect, which the
# router answers itself), what the router sets for its own connection (Host,
# Content-Length), and the client's credentials. Any header the client's Connection
# header names, and every Proxy-* header, is dropped too.
_DROPPED_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "connection",
        "keep-alive",
        "transfer-encoding",
        "te",
        "trailer",
        "upgrade",
        "expect",
        "authorization",
        "x-api-key",
        "accept-encoding",
    }
)


def forward_headers(raw: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    """The client's headers worth passing upstream, from the request's raw header list
    (a header sent twice: its last value), in one pass over it."""
    kept: dict[str, str] = {}
    named: list[str] = []  # what Connection names
    for key, value in raw:
        name = key.decode("latin-1").lower()
        text = value.decode("latin-1")
        if name == "connection":
            named += (token.strip().lower() for token in text.split(","))
        if name not in _DROPPED_HEADERS and not name.startswith("proxy-"):
            kept[name] = text
    for name in named:
        kept.pop(name, None)
    return kept


def content_encoding(response: UpstreamResponse) -> str | None:
    """The answer's ``Content-Encoding`` (gzip, br...), None when it is not encoded."""
    value = response.headers.get("content-encoding", "").strip()
    return value if value and value.lower() != "identity" else None


def translate(exc: HttpError, spec: ModelSpec) -> Exception:
    """The gateway error for a transport failure talking to ``spec``'s backend."""
    where = f"backend for '{spec.entry.id}' ({spec.entry.base_url})"
    if isinstance(exc, ConnectError):
        return BackendUnavailable(
            f"The {where} is unreachable: it is not running or still starting",
            retry_after=RETRY_AFTER_SECONDS,
        )
    if isinstance(exc, ReadTimeout):
        return BackendTimeout(f"The {where} did not answer within {spec.entry.default_timeout:g}s")
    if isinstance(exc, InvalidStatus):
        return BackendProtocolError(
            f"The {where} answered with status {exc.status}, outside 100-599",
            code="upstream_invalid",
        )
    return BackendProtocolError(f"The {where} broke the connection: {type(exc).__name__} ({exc})")


@dataclass(frozen=True)
class Probe:
    """The outcome of one ``/health`` probe."""

    status: str
    detail: str | None = None
    http_status: int | None = None


class Transport(Protocol):
    """What the router needs from the HTTP client that talks to backends: the
    production one is :class:`Upstream`; tests hand the router a scripted fake."""

    async def open(
        self,
        spec: ModelSpec,
        path: str,
        body: bytes,
        headers: Mapping[str, str],
        method: str = "POST",
    ) -> UpstreamResponse:
        """Send ``body`` (POST, or ``method``: a raw request's own) and return once
        status and headers arrived; transport failures raised as gateway errors."""
        ...

    async def probe(self, spec: ModelSpec) -> Probe:
        """One short health probe of the backend."""
        ...

    async def fetch(
        self, spec: ModelSpec, path: str, timeout: float, max_bytes: int
    ) -> tuple[int, bytes] | None:
        """``GET path``: its status and body (at most ``max_bytes``), None when the
        backend cannot be reached or does not answer within ``timeout``."""
        ...

    def retarget(self, models: tuple[ModelSpec, ...]) -> None:
        """The enabled backends are ``models`` from now on (a reloaded registry)."""
        ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True, slots=True)
class _Target:
    """One backend as an entry describes it: its pool, and for a remote the path
    prefix and key headers its requests carry."""

    entry: ModelEntry
    pool: Pool
    prefix: str
    auth: Mapping[str, str] | None


def _target_key(spec: ModelSpec) -> tuple[str, str, float]:
    """What a pool is made for: a backend (its role, where it listens) and the
    timeout its reads take."""
    return (spec.role, spec.entry.base_url, float(spec.entry.default_timeout))


class Upstream:
    """Pooled HTTP connections to every enabled backend.

    A pool serves one backend as its entry describes it (role, address, timeout). A
    reloaded registry (:meth:`retarget`) keeps the pools of the backends it leaves as
    they were and makes new ones for the rest. A request routed before the reload
    holds its own spec and still reaches the backend that spec names, through its old
    pool; pools no entry names any more are closed once none of their connections is
    in use.
    """

    def __init__(
        self,
        models: tuple[ModelSpec, ...],
        connect_timeout: float,
        probe_timeout: float,
        health_path: Callable[[ModelSpec], str] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.connect_timeout = connect_timeout
        self.probe_timeout = probe_timeout
        self.health_path = health_path or (lambda _spec: "/health")
        self.env = env or {}
        self._pools: dict[tuple[str, str, float], Pool] = {}  # the current ones
        self._targets: dict[str, _Target] = {}  # by role
        self._retired: dict[tuple[str, str, float], Pool] = {}  # closed once unused
        self._sweeper: asyncio.TimerHandle | None = None
        self._closed = False
        self.retarget(models)

    def retarget(self, models: tuple[ModelSpec, ...]) -> None:
        """Serve ``models`` from now on: a backend that keeps its role, address and
        timeout keeps its pool; the pools of the others are retired."""
        pools: dict[tuple[str, str, float], Pool] = {}
        targets: dict[str, _Target] = {}
        for spec in models:
            known = self._targets.get(spec.role)
            name = remote.missing_key(spec.entry, self.env)
            if name is not None and (known is None or known.entry != spec.entry):
                log.warning("%s: %s is not set; the remote is sent no key", spec.role, name)
            key = _target_key(spec)
            pool = pools.get(key) or self._pools.get(key) or self._retired.pop(key, None)
            pools[key] = pool or self._new_pool(spec)
            targets[spec.role] = self._target(spec, pools[key])
        for key, pool in self._pools.items():
            if key not in pools:
                self._retired[key] = pool
        self._pools, self._targets = pools, targets
        self._sweep()

    def _new_pool(self, spec: ModelSpec) -> Pool:
        # Idle connections are dropped well before a backend's own keep-alive timeout
        # (llama-server and uvicorn: 5 s), so a request never lands on a connection
        # the backend is closing; one that does anyway is sent once more.
        return Pool(
            spec.entry.base_url,
            connect_timeout=self.connect_timeout,
            read_timeout=spec.entry.default_timeout,
        )

    def _target(self, spec: ModelSpec, pool: Pool) -> _Target:
        """A remote's requests go under its url's path, with its key (from ``env``)."""
        entry = spec.entry
        auth = remote.auth_headers(entry, self.env) if entry.remote else None
        return _Target(entry, pool, entry.path_prefix, auth or None)

    def _reach(self, spec: ModelSpec) -> _Target:
        """How to reach the backend ``spec`` names: as the registry in force says (at
        once for the registry's own spec), else (a request routed before a reload)
        through the pool made for it, or a new one that is retired from the start."""
        target = self._targets.get(spec.role)
        if target is not None and target.entry is spec.entry:
            return target
        key = _target_key(spec)
        pool = self._pools.get(key) or self._retired.get(key)
        if pool is None:
            pool = self._retired[key] = self._new_pool(spec)
            self._sweep_later()
        return self._target(spec, pool)

    def _sweep(self) -> None:
        """Close the retired pools with no connection in use; look again every
        ``SWEEP_SECONDS`` while any is left."""
        self._sweeper = None
        for key, pool in list(self._retired.items()):
            if pool.connections <= pool.idle:
                pool.close()
                del self._retired[key]
        self._sweep_later()

    def _sweep_later(self) -> None:
        if self._retired and self._sweeper is None and not self._closed:
            with contextlib.suppress(RuntimeError):  # no loop yet: swept on the next reload
                self._sweeper = asyncio.get_running_loop().call_later(SWEEP_SECONDS, self._sweep)

    async def aclose(self) -> None:
        self._closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for pool in [*self._pools.values(), *self._retired.values()]:
            pool.close()

    async def open(
        self,
        spec: ModelSpec,
        path: str,
        body: bytes,
        headers: Mapping[str, str],
        method: str = "POST",
    ) -> UpstreamResponse:
        """Send ``body`` to the backend (POST, or ``method``) and return once its status
        and headers arrived; the caller reads (or relays) the body and must close the
        response."""
        target = self._reach(spec)
        if target.auth:
            headers = {**headers, **target.auth}
        try:
            return await target.pool.request(method, target.prefix + path, headers, body)
        except HttpError as exc:
            raise translate(exc, spec) from exc

    async def fetch(
        self, spec: ModelSpec, path: str, timeout: float, max_bytes: int
    ) -> tuple[int, bytes] | None:
        target = self._reach(spec)
        try:
            path = target.prefix + path
            response = await target.pool.request("GET", path, target.auth, timeout=timeout)
            body = await read_all(spec, response, max_bytes)
        except (HttpError, AnswerTooLarge, BackendProtocolError, BackendTimeout):
            return None
        except BackendUnavailable:
            return None
        return response.status_code, body

    async def probe(self, spec: ModelSpec) -> Probe:
        """``GET /health`` on the backend with a short timeout (a remote's model list)."""
        target = self._reach(spec)
        path = remote.probe_path(spec.entry) if spec.entry.remote else self.health_path(spec)
        try:
            response = await target.pool.request(
                "GET", path, target.auth, timeout=self.probe_timeout
            )
            content = await response.read()
        except ConnectTimeout:
            return Probe("timeout", f"no connection for /health within {self.probe_timeout:g}s")
        except ConnectError:
            return Probe("unreachable", "Connection refused - backend not running")
        except ReadTimeout:
            return Probe("timeout", f"no answer to /health within {self.probe_timeout:g}s")
        except HttpError as exc:
            return Probe("error", f"{type(exc).__name__}: {exc}")
        if response.status_code == 200:
            return Probe("healthy", http_status=200)
        text = content.decode("utf-8", "replace")
        return Probe("unhealthy", text[:200] or None, http_status=response.status_code)


async def read_all(spec: ModelSpec, response: UpstreamResponse, max_bytes: int) -> bytes:
    """The whole body of an opened response, at most ``max_bytes`` (else
    :class:`AnswerTooLarge`, refused on its ``Content-Length`` before any of it is
    read when it states one); always closes it. A plain loop, no generators: most
    answers are in already, and this is on every whole answer's path."""
    try:
        stated = response.headers.get("content-length", "")
        if stated.isdigit() and int(stated) > max_bytes:
            raise _too_large(spec, max_bytes)
        parts: list[bytes] = []
        size = 0
        receive = response.receive
        try:
            while chunk := await receive():
                size += len(chunk)
                if size > max_bytes:
                    raise _too_large(spec, max_bytes)
                parts.append(chunk)
        except HttpError as exc:
            raise translate(exc, spec) from exc
        return parts[0] if len(parts) == 1 else b"".join(parts)
    finally:
        response.close()


async def iter_bounded(
    spec: ModelSpec, response: UpstreamResponse, max_bytes: int
) -> AsyncIterator[bytes]:
    """:func:`iter_raw`, ended with :class:`AnswerTooLarge` past ``max_bytes``."""
    stated = response.headers.get("content-length", "")
    if stated.isdigit() and int(stated) > max_bytes:
        raise _too_large(spec, max_bytes)
    size = 0
    async for part in iter_raw(spec, response):
        size += len(part)
        if size > max_bytes:
            raise _too_large(spec, max_bytes)
        yield part


async def iter_raw(spec: ModelSpec, response: UpstreamResponse) -> AsyncIterator[bytes]:
    """The body of an opened response, piece by piece as it arrives."""
    receive = response.receive
    try:
        while chunk := await receive():
            yield chunk
    except HttpError as exc:
        raise translate(exc, spec) from exc


async def iter_sse(
    spec: ModelSpec, response: UpstreamResponse, max_event_bytes: int
) -> AsyncIterator[dict[str, Any]]:
    """The JSON objects of an opened SSE response's events, until ``[DONE]``."""
    splitter = SseSplitter(max_event_bytes)
    async for chunk in iter_raw(spec, response):
        for event in splitter.feed(chunk):
            value = _event_object(spec, event)
            if value is DONE:
                return
            if value is not None:
                yield value
    value = _event_object(spec, splitter.flush())
    if value is not None and value is not DONE:
        yield value


def _too_large(spec: ModelSpec, max_bytes: int) -> AnswerTooLarge:
    return AnswerTooLarge(
        f"The backend for '{spec.entry.id}' sent an answer larger than {max_bytes} bytes "
        "(SLM_MAX_ANSWER_MB); ask for less, or stream it"
    )


def _event_object(spec: ModelSpec, event: bytes) -> dict[str, Any] | None:
    """:func:`data_object` with the backend named in its error."""
    try:
        return data_object(event)
    except BackendProtocolError as exc:
        raise BackendProtocolError(f"The backend for '{spec.entry.id}': {exc}") from None


def json_headers(extra: Mapping[str, str] | None = None) -> dict[str, Any]:
    headers = {"content-type": "application/json"}
    if extra:
        headers.update(extra)
    return headers


def backend_error_body(status: int, content: bytes) -> bytes:
    """A backend's error body in the OpenAI shape: ``{"error": {"message", "type",
    "param", "code"}}`` with ``code`` a string or null (llama-server sends integers)
    and ``param`` present. Anything else the backend put in its error object is kept;
    a body that is not such an object becomes the message."""
    try:
        parsed = json.loads(content)
    except (ValueError, RecursionError):
        parsed = None
    error = parsed.get("error") if isinstance(parsed, dict) else None
    if isinstance(error, str):
        error = {"message": error}
    if not isinstance(error, dict):
        message = content.decode("utf-8", "replace").strip()[:2000] or f"HTTP {status}"
        error = {"message": message, "type": "backend_error", "code": str(status)}
    code = error.get("code")
    shaped = {
        **error,
        "message": str(error.get("message") or f"HTTP {status}"),
        "type": str(error.get("type") or "backend_error"),
        "param": error.get("param") if isinstance(error.get("param"), str) else None,
        "code": None if code is None else str(code),
    }
    try:
        return json.dumps({"error": shaped}, ensure_ascii=False, allow_nan=False).encode()
    except (ValueError, RecursionError):  # NaN or absurd depth in the backend's extras
        kept = {k: shaped[k] for k in ("message", "type", "param", "code")}
        return json.dumps({"error": kept}, ensure_ascii=False).encode()
