"""The HTTP client ``huggingface_hub`` is given (its public ``set_client_factory``): its
own defaults (redirects followed, no client-wide timeout: it sets one per call), the
proxy settings read as the standard library reads them (``HTTPS_PROXY``, ``NO_PROXY``),
and each downloaded byte counted as it comes off the network.

The library reads a download in 10 MiB pieces and reports progress per piece, so a hub
that drips a few bytes a second never fills one: without counting here, a pull would
neither move its bar nor notice the drip. The count goes to the transfer this thread is
running (:func:`metering`), which raises to stop a stalled or cancelled download.
"""

from __future__ import annotations

import threading
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

import httpx

from slm_server.pull.transfer import Transfer

MAX_ERROR_BODY: Final = 64 * 1024  # of an error's body, what the library is given
MAX_API_BODY: Final = 32 << 20  # of an answer of the hub's API (a listing), the same
_local = threading.local()
_installed = threading.Lock()
_done = False


def current() -> Transfer | None:
    found: Transfer | None = getattr(_local, "transfer", None)
    return found


@contextmanager
def metering(transfer: Transfer) -> Iterator[None]:
    """Count what this thread downloads into ``transfer`` for the block's length."""
    _local.transfer = transfer
    try:
        yield
    finally:
        _local.transfer = None


class _Counted(httpx.SyncByteStream):
    def __init__(self, inner: httpx.SyncByteStream) -> None:
        self._inner = inner

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self._inner:
            transfer = current()
            if transfer is not None and chunk:
                transfer.advance_from_network(len(chunk))
            yield chunk

    def close(self) -> None:
        self._inner.close()


class _Capped(httpx.SyncByteStream):
    """The first ``limit`` bytes of a body, then its end: ``huggingface_hub`` reads an
    error's or a listing's whole body into memory, which a hostile hub may make endless
    (a cut listing is then not JSON: refused)."""

    def __init__(self, inner: httpx.SyncByteStream, limit: int) -> None:
        self._inner = inner
        self._limit = limit

    def __iter__(self) -> Iterator[bytes]:
        left = self._limit
        for chunk in self._inner:
            yield chunk[:left]
            left -= len(chunk)
            if left <= 0:
                return

    def close(self) -> None:
        self._inner.close()


class MeteredTransport(httpx.BaseTransport):
    """Plain HTTP transports (one per proxy), with each GET's body counted, and each
    error's body cut at :data:`MAX_ERROR_BODY` and each API answer's (a listing, not a
    download) at :data:`MAX_API_BODY`."""

    def __init__(self) -> None:
        self._direct = httpx.HTTPTransport(trust_env=True)
        self._proxied: dict[str, httpx.HTTPTransport] = {}
        self._lock = threading.Lock()

    def _for(self, url: httpx.URL) -> httpx.HTTPTransport:
        proxies = urllib.request.getproxies()
        proxy = proxies.get(url.scheme) or proxies.get("all")
        if not proxy or urllib.request.proxy_bypass(url.host):
            return self._direct
        with self._lock:
            if proxy not in self._proxied:
                self._proxied[proxy] = httpx.HTTPTransport(proxy=proxy, trust_env=True)
            return self._proxied[proxy]

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self._for(request.url).handle_request(request)
        if not isinstance(response.stream, httpx.SyncByteStream):
            return response
        limit = (
            MAX_ERROR_BODY
            if response.status_code >= 400
            else MAX_API_BODY
            if request.url.path.startswith("/api/")
            else None
        )
        if limit is not None:
            return httpx.Response(
                status_code=response.status_code,
                headers=response.headers,
                stream=_Capped(response.stream, limit),
                extensions=response.extensions,
            )
        if request.method != "GET":
            return response
        return httpx.Response(
            status_code=response.status_code,
            headers=response.headers,
            stream=_Counted(response.stream),
            extensions=response.extensions,
        )

    def close(self) -> None:
        self._direct.close()
        with self._lock:
            for transport in self._proxied.values():
                transport.close()


def client() -> httpx.Client:
    return httpx.Client(
        transport=MeteredTransport(), follow_redirects=True, timeout=None, trust_env=False
    )


def install() -> None:
    """Give ``huggingface_hub`` this client (once per process)."""
    global _done
    with _installed:
        if not _done:
            from huggingface_hub import set_client_factory

            set_client_factory(client)
            _done = True


__all__ = [
    "MAX_API_BODY",
    "MAX_ERROR_BODY",
    "MeteredTransport",
    "client",
    "current",
    "install",
    "metering",
]
