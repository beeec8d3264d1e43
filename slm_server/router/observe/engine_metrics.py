"""Each engine's own metrics at the gateway: ``GET /metrics`` on every ready backend
(llama-server runs with ``--metrics``), re-exported in the router's ``/metrics`` with
``model``, ``role`` and ``replica`` labels.

A scrape never waits on a stuck backend: the engines are fetched at once, each bounded
by ``timeout``, and the scrape waits for them at most that long; what a slow engine
sends later refreshes the cache for the next scrape. Answers are kept ``cache_seconds``
so a busy Prometheus does not multiply requests to the engines; a backend without
metrics (404, a server that has none) is asked again only after ``NO_METRICS_SECONDS``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from slm_server.registry.schema import ModelSpec
from slm_server.router.call.backend_state import StateSource
from slm_server.router.dispatch.lookup import Registry
from slm_server.router.upstream.client import Transport

log = logging.getLogger("slm_server.router")

NO_METRICS_SECONDS = 60.0
STALE_SECONDS = 30.0  # an engine that has not answered for this long shows nothing
MAX_METRICS_BYTES = 2 * 1024 * 1024
# Labels the gateway adds; an engine's own label of the same name is kept as engine_*.
ADDED_LABELS = ("model", "role", "replica")
# The gateway's own families: an engine that has them is another slm_server (a remote
# entry), whose slm_* would collide with this router's; they are left out.
GATEWAY_PREFIX = "slm_"


@dataclass
class _Cached:
    families: list[Metric]
    at: float
    none_until: float = 0.0  # no metrics there (404...): not asked again before this


class EngineMetrics(Collector):
    """The ready engines' metrics, fetched concurrently and kept briefly."""

    def __init__(
        self,
        registry: Registry,
        states: StateSource,
        upstream: Transport,
        *,
        timeout: float = 0.5,
        cache_seconds: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.registry = registry
        self.states = states
        self.upstream = upstream
        self.timeout = timeout
        self.cache_seconds = cache_seconds
        self.clock = clock
        self._cache: dict[str, _Cached] = {}
        self._fetching: dict[str, asyncio.Task[None]] = {}

    def _ready(self) -> list[ModelSpec]:
        if not self.states.launcher_alive():
            return []
        ready = []
        for spec in self.registry.enabled:
            state = self.states.get(spec.role, spec.entry.port)
            if state is not None and state.state == "ready":
                ready.append(spec)
        return ready

    async def refresh(self) -> None:
        """Fetch what is stale, waiting at most ``timeout`` for it."""
        now = self.clock()
        ready = self._ready()
        wanted = {spec.role for spec in ready}
        for role in list(self._cache):
            if role not in wanted:
                del self._cache[role]  # unloaded, restarting: its numbers are gone
        for spec in ready:
            cached = self._cache.get(spec.role)
            fresh = cached is not None and now - cached.at < self.cache_seconds
            if fresh or (cached is not None and now < cached.none_until):
                continue
            if spec.role not in self._fetching:
                task = asyncio.get_running_loop().create_task(self._fetch(spec))
                self._fetching[spec.role] = task
                task.add_done_callback(self._forget(spec.role))
        pending = [self._fetching[s.role] for s in ready if s.role in self._fetching]
        if pending:
            await asyncio.wait(pending, timeout=self.timeout)

    def _forget(self, role: str) -> Callable[[asyncio.Task[None]], None]:
        def done(_task: asyncio.Task[None]) -> None:
            self._fetching.pop(role, None)

        return done

    async def _fetch(self, spec: ModelSpec) -> None:
        got = None
        with contextlib.suppress(Exception):  # an engine's trouble never fails a scrape
            fetching = self.upstream.fetch(spec, "/metrics", self.timeout, MAX_METRICS_BYTES)
            got = await asyncio.wait_for(fetching, self.timeout * 4)  # a trickle ends too
        now = self.clock()
        if got is None:
            return  # unreachable or too slow: the old numbers stay until they age out
        status, body = got
        if status != 200:
            self._cache[spec.role] = _Cached([], now, none_until=now + NO_METRICS_SECONDS)
            return
        try:
            families = list(text_string_to_metric_families(body.decode("utf-8", "replace")))
        except (ValueError, TypeError, IndexError) as exc:
            log.info("the metrics of %s are not Prometheus text: %s", spec.entry.id, exc)
            families = []
        families = [f for f in families if not f.name.startswith(GATEWAY_PREFIX)]
        self._cache[spec.role] = _Cached(_labelled(families, spec), now)

    def collect(self) -> Iterable[Metric]:
        merged: dict[str, Metric] = {}
        now = self.clock()
        for cached in self._cache.values():
            if now - cached.at > STALE_SECONDS:
                continue
            for family in cached.families:
                into = merged.get(family.name)
                if into is None:
                    into = merged[family.name] = Metric(
                        family.name, family.documentation, family.type, family.unit
                    )
                if into.type != family.type:
                    continue  # two engines disagree on a type: the first one wins
                into.samples.extend(family.samples)
        return list(merged.values())

    def exposition(self) -> bytes:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)
        return generate_latest(registry)


def _labelled(families: list[Metric], spec: ModelSpec) -> list[Metric]:
    """``families`` with the gateway's ``model``, ``role`` and ``replica`` labels on every
    sample."""
    added = {"model": spec.entry.id, "role": spec.role, "replica": str(spec.replica)}
    labelled: list[Metric] = []
    for family in families:
        copy = Metric(family.name, family.documentation, family.type, family.unit)
        for sample in family.samples:
            labels = {
                (f"engine_{key}" if key in ADDED_LABELS else key): value
                for key, value in sample.labels.items()
            }
            copy.add_sample(sample.name, {**labels, **added}, sample.value, sample.timestamp)
        labelled.append(copy)
    return labelled


__all__ = ["EngineMetrics"]
