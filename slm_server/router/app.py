"""The router application.

``create_app`` builds the router from its dependencies (:class:`Dependencies`: the
upstream transport, the source of backend states, the watchdog's event sink, the
admission gates, telemetry, metrics and the drain); ``production_app`` is the one place
that makes the real ones from the settings. Tests hand ``create_app`` fakes.

The router follows the registry its supervisor applied
(:mod:`~slm_server.router.reload.follower`): the registry, the gates and every part
derived from them are rewired in place when a reload changes it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from slm_server import logging_setup
from slm_server.contracts import commands
from slm_server.contracts.applied_registry import version_of
from slm_server.contracts.events import EventLog, EventSink
from slm_server.errors import GatewayError, HttpStatusError
from slm_server.memory.available import MemorySource, machine_source
from slm_server.registry.schema import (
    ConfigError,
    ModelSpec,
    RegistryFile,
    parse_registry,
    read_registry_text,
)
from slm_server.router.apis.models_admin.api import ModelsAdmin
from slm_server.router.apis.models_and_health import Info
from slm_server.router.apis.ollama.catalog import OllamaCatalog
from slm_server.router.apis.table import TABLE
from slm_server.router.call.admission import Gate
from slm_server.router.call.backend_state import StateSource, StateView
from slm_server.router.call.drain import Drain
from slm_server.router.call.error_shape import error_response
from slm_server.router.call.exchange import exchange_of
from slm_server.router.dashboard.endpoints import Dashboard
from slm_server.router.dashboard.history import History
from slm_server.router.dashboard.history_api import HistoryApi
from slm_server.router.dashboard.history_sampler import HistorySampler, Sources
from slm_server.router.dispatch.lookup import Registry
from slm_server.router.edge.api_keys import Keys
from slm_server.router.edge.hosts import AllowedHosts
from slm_server.router.edge.screening import Front, Handler
from slm_server.router.observe.engine_metrics import EngineMetrics
from slm_server.router.observe.metrics import Metrics
from slm_server.router.observe.observer import RequestObserver, unexpected
from slm_server.router.observe.recent import RecentRequests
from slm_server.router.observe.telemetry import Telemetry
from slm_server.router.ondemand.load_api import ModelsApi
from slm_server.router.ondemand.loader import Commander, Loader
from slm_server.router.ondemand.memory_fit import Rules
from slm_server.router.ondemand.memory_pressure import Floor
from slm_server.router.ondemand.pressure_watch import PressureWatch
from slm_server.router.proxy import Proxy
from slm_server.router.reload.follower import POLL_SECONDS, Follower
from slm_server.router.reload.in_force import InForce
from slm_server.router.reload.reload_api import ReloadApi
from slm_server.router.reload.retirements import Retirements
from slm_server.router.reload.rewire import Rewire, gate_for
from slm_server.router.upstream.client import Transport, Upstream
from slm_server.router.watchdog.tripwire import Tripwire
from slm_server.settings import Settings, load_environment

log = logging.getLogger("slm_server.router")


async def _gateway_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, GatewayError)
    exchange = exchange_of(request.scope)
    exchange.note_error(exc)
    return error_response(exc, exchange.errors)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    error = HttpStatusError(exc.status_code, str(exc.detail), code)
    response = error_response(error, exchange_of(request.scope).errors)
    response.headers.update(exc.headers or {})
    return response


async def _unexpected_error(request: Request, exc: Exception) -> Response:
    log.exception("unexpected error while handling a request", exc_info=exc)
    return error_response(unexpected(), exchange_of(request.scope).errors)


@dataclass(frozen=True)
class Dependencies:
    """Everything the router talks to or shares, made outside it."""

    upstream: Transport
    states: StateSource
    events: EventSink
    gates: dict[str, Gate]  # admission, by role (rewired in place by a reload)
    telemetry: Telemetry
    metrics: Metrics
    drain: Drain
    commander: Commander  # commands to the supervisor: load, unload, reload, retired
    # The machine's free memory; None: as the settings say (the platform's, or the
    # simulated file's).
    memory: MemorySource | None = None


def gates_for(registry: Registry) -> dict[str, Gate]:
    """One admission gate per enabled model, sized by its entry."""
    return {spec.role: gate_for(spec) for spec in registry.enabled}


def production_dependencies(
    settings: Settings, registry: Registry, drain: Drain | None = None
) -> Dependencies:
    """The real dependencies: pooled HTTP to the backends, the supervisor's state file,
    the watchdog log, telemetry and metrics as the settings say."""
    states = StateView(settings.state_path)

    def health_path(spec: ModelSpec) -> str:
        """The launcher's published health path (llama_cpp.server has no /health)."""
        planned = states.planned(spec.role, spec.entry.port)
        return planned.health_path if planned is not None else "/health"

    env = load_environment()
    upstream = Upstream(
        registry.enabled,
        settings.connect_timeout_seconds,
        settings.health_probe_timeout_seconds,
        health_path,
        env,
    )
    return Dependencies(
        upstream=upstream,
        states=states,
        events=EventLog(settings.watchdog.log_path),
        gates=gates_for(registry),
        telemetry=Telemetry(settings.telemetry),
        metrics=Metrics(registry, states),
        drain=drain or Drain(settings.serving.drain_timeout_seconds),
        commander=supervisor_commander(settings),
    )


def supervisor_commander(settings: Settings) -> Commander:
    """Commands sent over the supervisor's socket (:mod:`slm_server.contracts.commands`)."""
    path = commands.socket_path(settings.log_dir)

    async def send(command: commands.Command) -> commands.Reply:
        return await commands.send(path, command)

    return send


def version_read(registry_file: RegistryFile) -> str | None:
    """The version of the text ``registry_file`` was read from: its file's text now,
    when it still holds that very registry; None when it changed since (or cannot be
    read), and the router then follows any registry its supervisor applied."""
    try:
        text = read_registry_text(registry_file.path)
        same = parse_registry(text, registry_file.path).models == registry_file.models
    except ConfigError:
        return None
    return version_of(text) if same else None


def production_app(
    settings: Settings,
    registry_file: RegistryFile,
    drain: Drain | None = None,
    *,
    version: str | None = None,
) -> Starlette:
    """The router as ``slm_server router`` serves it; ``drain`` is the shutdown state
    the server shares with it (``app.state.drain``); ``version`` that of the text
    ``registry_file`` was parsed from (:func:`version_read` when not given)."""
    registry = Registry(registry_file.models)
    deps = production_dependencies(settings, registry, drain)
    if version is None:
        version = version_read(registry_file)
    return create_app(settings, registry_file, deps, registry, version=version)


@dataclass(frozen=True)
class Wired:
    """The parts of one router, made from its settings, registry and dependencies."""

    proxy: Proxy
    loader: Loader
    pressure: PressureWatch
    follower: Follower
    reload_api: ReloadApi
    info: Info
    models_api: ModelsApi
    ollama: OllamaCatalog
    recent: RecentRequests
    dashboard: Dashboard
    history: HistorySampler
    history_api: HistoryApi
    models_admin: ModelsAdmin  # pull, list and add models (SLM_PULL_API)


def pressure_watch(settings: Settings, deps: Dependencies) -> PressureWatch:
    """The watch on the machine's free memory (the simulated file's, when set)."""
    memory = settings.memory
    source = deps.memory or machine_source(memory.simulated_file)
    if memory.simulated_file is not None:
        log.warning(
            "the machine's free memory is read from %s (SLM_MEMORY_SIMULATED_FILE), not "
            "from the operating system: for tests and diagnosis only",
            memory.simulated_file,
        )
    return PressureWatch(
        source,
        Floor.of(memory.floor_mb),
        deps.events,
        poll_seconds=memory.poll_seconds,
        budget_mb=memory.budget_mb,
    )


def dashboard_of(
    settings: Settings,
    deps: Dependencies,
    registry: Registry,
    tripwire: Tripwire,
    loader: Loader,
    pressure: PressureWatch,
) -> tuple[RecentRequests, Dashboard, HistorySampler, HistoryApi]:
    """The dashboard's parts: the ring of recent requests, the page and its endpoints,
    the history's sampler (reading what the health views and the metrics read) and the
    endpoint that answers it."""
    recent = RecentRequests()
    dashboard = Dashboard(
        registry, deps.states, recent, settings.watchdog.log_path, settings.log_dir
    )
    sources = Sources(
        registry,
        deps.metrics,
        deps.gates,
        deps.states,
        tripwire.open_streak,
        loader.holders,
        pressure,
    )
    history = History(settings.history.samples, sources.buckets())
    sampler = HistorySampler(
        history, sources, settings.watchdog.log_path, settings.history.interval_seconds
    )
    return recent, dashboard, sampler, HistoryApi(history, settings.history)


def wire(
    settings: Settings,
    registry_file: RegistryFile,
    deps: Dependencies,
    registry: Registry,
    version: str | None,
    follow_seconds: float,
) -> Wired:
    """Every part of the router, each handed what it shares with the others."""
    upstream, memory = deps.upstream, settings.memory
    tripwire = Tripwire(settings.watchdog, deps.events, on_failure=deps.metrics.count_failure)
    in_force = InForce(version, str(registry_file.path))
    proxy = Proxy(
        settings, registry, upstream, tripwire, deps.states, deps.drain, deps.gates, in_force
    )
    rules = Rules(memory.budget_mb, memory.max_loaded, memory.hold_seconds, memory.aging_seconds)
    pressure = pressure_watch(settings, deps)
    loader = Loader(
        registry,
        deps.states,
        deps.gates,
        rules,
        deps.commander,
        proxy.sender.waits,
        drain_seconds=settings.serving.drain_timeout_seconds,
        pressure=pressure,
    )
    proxy.loader = loader
    retirements = Retirements(deps.commander)
    rewire = Rewire(
        registry,
        deps.gates,
        proxy.choice,
        proxy.reception,
        loader,
        upstream,
        tripwire,
        retirements,
    )
    follower = Follower(
        deps.states, settings.log_dir, rewire, retirements, in_force, poll_seconds=follow_seconds
    )
    info = Info(
        registry,
        upstream,
        tripwire,
        deps.states,
        proxy.gates,
        loader.status,
        in_force,
        list_aliases=settings.serving.list_aliases,
        memory=pressure.report,
        caps=proxy.caps,
        infill=proxy.infill,
    )
    deps.metrics.add_engines(EngineMetrics(registry, deps.states, upstream))
    ollama = OllamaCatalog(
        registry,
        loader.status,
        proxy.caps,
        proxy.server_kind,
        proxy.infill,
        list_aliases=settings.serving.list_aliases,
    )
    return Wired(
        proxy,
        loader,
        pressure,
        follower,
        ReloadApi(deps.commander, follower),
        info,
        ModelsApi(registry, loader, info.describe),
        ollama,
        *dashboard_of(settings, deps, registry, tripwire, loader, pressure),
        models_admin=ModelsAdmin(settings, deps.commander, follower, deps.drain),
    )


def lifespan_of(
    registry_file: RegistryFile, deps: Dependencies, wired: Wired
) -> Callable[[Starlette], AbstractAsyncContextManager[None]]:
    """What starts with the router and stops with it: telemetry, the planner, the
    pressure watch, the dashboard's history, following the registry, the end of waiting
    requests at the drain."""
    drain, telemetry, proxy = deps.drain, deps.telemetry, wired.proxy

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        for warning in registry_file.warnings:
            log.warning("%s", warning)
        telemetry.start()
        drain.bind(asyncio.get_running_loop())
        logging_setup.bind_to_loop(asyncio.get_running_loop())
        wired.models_admin.start()
        wired.loader.start()
        wired.pressure.start()
        wired.history.start()
        await wired.follower.start()  # a reload applied before the router started is followed

        async def end_waiting_requests() -> None:
            await drain.expired.wait()
            proxy.cancel_waiting()

        ender = asyncio.ensure_future(end_waiting_requests())
        warming = asyncio.ensure_future(wired.ollama.warm())  # model files' facts, ahead
        try:
            yield
        finally:
            ender.cancel()
            warming.cancel()
            await wired.models_admin.close()  # running pulls cancelled, threads joined
            await wired.follower.stop()
            await proxy.readiness.stop()
            await wired.history.stop()
            await wired.pressure.stop()
            await wired.loader.stop()
            await deps.upstream.aclose()
            await telemetry.shutdown()
            logging_setup.bind_to_loop(None)

    return lifespan


# What a raw request (``/upstream/<model>/<path>``) may be sent with (HEAD follows GET,
# and is refused by its endpoint).
RAW_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]


def raw_routes(proxy: Proxy) -> list[Route]:
    """The raw shapes' routes: every path under theirs, every method."""
    return [
        Route(f"{row.shape.path}{{target:path}}", proxy.handler(row.shape), methods=RAW_METHODS)
        for row in TABLE
        if row.shape.raw
    ]


def routes_of(direct: dict[str, Handler], deps: Dependencies, wired: Wired) -> list[Route]:
    """Every route: the API shapes' (``direct``), then the router's own."""
    info, dashboard = wired.info, wired.dashboard
    routes = [Route(path, handler, methods=["POST"]) for path, handler in direct.items()]
    return [
        *routes,
        *raw_routes(wired.proxy),
        Route("/v1/models", info.models, methods=["GET"]),
        Route("/v1/models/load", wired.models_api.load, methods=["POST"]),
        Route("/v1/models/unload", wired.models_api.unload, methods=["POST"]),
        *models_admin_routes(wired.models_admin),
        Route("/v1/models/{model_id:path}", info.model, methods=["GET"]),
        Route("/v1/config/reload", wired.reload_api.reload, methods=["POST"]),
        Route("/v1/backends/health", info.backends_health, methods=["GET"]),
        Route("/health", info.health, methods=["GET"]),
        Route("/metrics", deps.metrics.scrape, methods=["GET"]),
        Route("/v1/telemetry/effective-config", deps.telemetry.report, methods=["GET"]),
        Route("/v1/ui/events", dashboard.events, methods=["GET"]),
        Route("/v1/ui/requests", dashboard.requests, methods=["GET"]),
        Route("/v1/ui/history", wired.history_api.answer, methods=["GET"]),
        Route("/v1/ui/logs/{role}", dashboard.logs, methods=["GET"]),
        Route("/ui", dashboard.page, methods=["GET"]),
        Route("/ui/{asset}", dashboard.page, methods=["GET"]),
        *ollama_routes(wired.ollama),
    ]


def models_admin_routes(admin: ModelsAdmin) -> list[Route]:
    """Pulling, listing and adding models (before ``/v1/models/{model_id}``)."""
    return [
        Route("/v1/models/pull", admin.pull, methods=["POST"]),
        Route("/v1/models/add", admin.add, methods=["POST"]),
        Route("/v1/models/local", admin.local, methods=["GET"]),
    ]


def ollama_routes(ollama: OllamaCatalog) -> list[Route]:
    """Ollama's own routes that the router answers (its model routes are the table's)."""
    refused = ollama.refused
    return [
        Route("/", ollama.root, methods=["GET", "HEAD"]),
        Route("/api/version", ollama.version, methods=["GET"]),
        Route("/api/tags", ollama.tags, methods=["GET"]),
        Route("/api/ps", ollama.ps, methods=["GET"]),
        Route("/api/show", ollama.show, methods=["POST"]),
        *(Route(f"/api/{name}", refused, methods=["POST"]) for name in OLLAMA_REFUSED),
        Route("/api/delete", refused, methods=["DELETE"]),
        Route("/api/blobs/{digest}", refused, methods=["HEAD", "POST"]),
    ]


# Ollama's routes that add or change models: here the registry does.
OLLAMA_REFUSED = ("pull", "push", "create", "copy")


def create_app(
    settings: Settings,
    registry_file: RegistryFile,
    deps: Dependencies,
    registry: Registry | None = None,
    *,
    version: str | None = None,
    follow_seconds: float = POLL_SECONDS,
) -> Starlette:
    """The router serving the enabled models of ``registry_file`` through ``deps``;
    ``version`` is that of the text the registry was parsed from, and the registry
    the supervisor applied is looked at every ``follow_seconds``."""
    registry = registry or Registry(registry_file.models)
    wired = wire(settings, registry_file, deps, registry, version, follow_seconds)
    # The proxied POST paths go straight to their handlers (see router/edge/screening.py); the
    # routes stay for every other method, and as the one list of what is served.
    direct: dict[str, Handler] = {
        row.shape.path: wired.proxy.handler(row.shape) for row in TABLE if not row.shape.raw
    }
    serving = settings.serving
    app = Starlette(
        routes=routes_of(direct, deps, wired),
        lifespan=lifespan_of(registry_file, deps, wired),
        middleware=[
            Middleware(
                RequestObserver, telemetry=deps.telemetry, metrics=deps.metrics, recent=wired.recent
            ),
            Middleware(
                Front,
                hosts=AllowedHosts((*serving.allowed_hosts, settings.router_host)),
                keys=Keys(serving.api_keys, serving.metrics_need_key),
                direct=direct,
                on_error=_gateway_error,
            ),
        ],
        exception_handlers={
            GatewayError: _gateway_error,
            HTTPException: _http_error,
            Exception: _unexpected_error,
        },
    )
    app.state.drain = deps.drain
    app.state.follower = wired.follower
    return app


__all__ = [
    "Dependencies",
    "create_app",
    "production_app",
    "production_dependencies",
    "version_read",
]
