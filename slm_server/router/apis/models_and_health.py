"""The router's own endpoints: the model list and the health views."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from slm_server.contracts.records import budget_view
from slm_server.registry import remote
from slm_server.registry.infill import InfillCache
from slm_server.registry.schema import ModelSpec
from slm_server.router.call.admission import Gate
from slm_server.router.call.backend_state import StateSource
from slm_server.router.dispatch.lookup import Registry
from slm_server.router.reload.in_force import InForce
from slm_server.router.toolcalls.template_caps import TemplateCaps
from slm_server.router.upstream.client import Transport
from slm_server.router.watchdog.tripwire import Tripwire


class Info:
    """``/v1/models``, ``/v1/backends/health`` and ``/health``."""

    def __init__(
        self,
        registry: Registry,
        upstream: Transport,
        tripwire: Tripwire,
        states: StateSource,
        gates: Mapping[str, Gate],
        status: Callable[[ModelSpec], dict[str, Any]],
        in_force: InForce,
        *,
        list_aliases: bool = True,
        memory: Callable[[], dict[str, Any]] | None = None,
        caps: TemplateCaps | None = None,
        infill: InfillCache | None = None,
    ) -> None:
        self.list_aliases = list_aliases
        self.memory = memory
        self.in_force = in_force
        self.gates = gates
        self.status = status
        self.registry = registry
        self.upstream = upstream
        self.tripwire = tripwire
        self.states = states
        self.started = int(time.time())
        self.caps = caps if caps is not None else TemplateCaps(upstream, states)
        self.infill = infill if infill is not None else InfillCache()

    def describe(self, spec: ModelSpec, name: str | None = None) -> dict[str, Any]:
        """One model as ``GET /v1/models/{id}`` shows it, by its id or, when ``name`` is
        one of its aliases, as that alias."""
        model = self._model(spec)
        if name is not None and name != spec.entry.id and name in spec.entry.alias_names:
            return _as_alias(model, name)
        return model

    def _status(self, spec: ModelSpec) -> dict[str, Any]:
        """The model's ``status``; a remote's with ``url`` and, while it is ejected,
        ``ejected_until`` (wall clock)."""
        status = self.status(spec)
        if spec.entry.remote:
            known = self.states.get(spec.role, spec.entry.port)
            status["url"] = remote.shown_url(spec.entry)
            status["ejected_until"] = known.ejected_until if known is not None else None
        return status

    def _model(self, spec: ModelSpec) -> dict[str, Any]:
        """One model as ``/v1/models`` lists it: OpenAI's four fields, then ours. An
        entry with replicas is one model, its status ``ready`` when any replica is and
        each replica listed under ``status.replicas``."""
        status = self._status(spec)
        size = self.registry.size(spec)
        if size > 1:
            replicas = []
            for replica in self.registry.replicas(spec):
                gate = self.gates.get(replica.role)
                replicas.append(
                    {
                        "replica": replica.replica,
                        "role": replica.role,
                        "backend": replica.entry.backend,
                        "port": None if replica.entry.remote else replica.entry.port,
                        "url": remote.shown_url(replica.entry),
                        "state": self.status(replica)["state"],
                        "in_flight": gate.active if gate is not None else None,
                        "queued": gate.queued if gate is not None else None,
                    }
                )
            if any(r["state"] == "ready" for r in replicas):
                status["state"] = "ready"
            status["replicas"] = replicas
        return {
            "id": spec.entry.id,
            "object": "model",
            "created": self.started,
            "owned_by": "slm_server",
            "role": spec.role,
            "backend": spec.entry.backend,
            "port": None if spec.entry.remote else spec.entry.port,
            "model_type": spec.entry.model_type,
            "context_length": spec.entry.context_length,
            "quantization": spec.entry.quantization or None,
            "supports_function_calling": spec.entry.supports_function_calling,
            "replicas": size,
            "routing": spec.entry.routing,
            "aliases": list(spec.entry.alias_names),
            "status": status,
        }

    async def models(self, _request: Request) -> JSONResponse:
        """``GET /v1/models``: the enabled models and their settings, each followed by
        its aliases (unless ``SLM_LIST_ALIASES`` is off)."""
        data = []
        for spec in self.registry.entries:
            model = self._model(spec)
            model["tools"] = await self.tools(spec, None)
            model["infill"] = await self.takes_infill(spec)
            data.append(model)
            if self.list_aliases:
                for name in spec.entry.alias_names:
                    data.append({**_as_alias(model, name), "tools": await self.tools(spec, name)})
        return JSONResponse({"object": "list", "data": data})

    async def model(self, request: Request) -> JSONResponse:
        """``GET /v1/models/{id}``: one enabled model by its id or an alias (which may
        contain ``/``); 404 ``model_not_found`` when there is none."""
        model_id: str = request.path_params["model_id"]
        spec = self.registry.lookup(model_id)
        model = self.describe(spec, model_id)
        alias = model_id if model_id in spec.entry.alias_names else None
        model["tools"] = await self.tools(spec, alias)
        model["infill"] = await self.takes_infill(spec)
        return JSONResponse(model)

    async def takes_infill(self, spec: ModelSpec) -> bool | None:
        """Whether the model fills in the middle (``/infill``, completions' ``suffix``;
        :mod:`slm_server.memory.fill_in`): None when the gateway cannot tell (and
        refuses it), false for a model that generates no text."""
        if spec.entry.model_type not in ("lm", "multimodal"):
            return False
        return (await self.infill.of(spec.entry)).takes

    async def tools(self, spec: ModelSpec, alias: str | None) -> dict[str, Any] | None:
        """A text model's tool policy as named by ``alias`` (None: by its id), and the
        mode that applies (``auto`` decided by the running backend's template; None
        while no process runs to say); None for other models."""
        entry = spec.entry
        if entry.model_type not in ("lm", "multimodal"):
            return None
        policy = entry.tool_policy(alias)
        applies: str | None = policy.mode
        if policy.mode == "auto":
            planned = self.states.planned(spec.role, entry.port)
            kind = planned.kind if planned is not None else None
            running = entry.remote or (planned is not None and planned.state == "ready")
            takes = await self.caps.takes_tools(spec, kind) if running else None
            applies = None if not running else "render" if takes is False else "native"
        return {"mode": policy.mode, "repair": policy.repair, "applies": applies}

    async def backends_health(self, _request: Request) -> JSONResponse:
        """``GET /v1/backends/health``: every backend probed at once, keyed by role."""
        probes = await asyncio.gather(*(self.upstream.probe(s) for s in self.registry.enabled))
        by_role = dict(zip((s.role for s in self.registry.enabled), probes, strict=True))
        launcher_alive = self.states.launcher_alive()
        report: dict[str, dict[str, Any]] = {}
        now = time.time()
        for spec in self.registry.models:
            entry = spec.entry
            item: dict[str, Any] = {
                "model_id": entry.id,
                "backend": entry.backend,
                "port": None if entry.remote else entry.port,
                "model_type": entry.model_type,
                "replica": spec.replica,
                "replicas": self.registry.size(spec),
                "aliases": list(entry.alias_names),
            }
            probe = by_role.get(spec.role)
            if not entry.enabled or probe is None:
                item["status"] = "disabled"
                item["state"] = "disabled"
            else:
                item["status"] = probe.status
                if probe.detail is not None:
                    item["error"] = probe.detail
                if probe.http_status is not None and probe.status != "healthy":
                    item["http_status"] = probe.http_status
                known = self.states.get(spec.role, entry.port)
                streak = self.tripwire.open_streak(spec.role)
                if entry.remote:
                    item["url"] = remote.shown_url(entry)
                if known is not None:
                    state = known.state if launcher_alive else "unsupervised"
                    item["state"] = "degraded" if state == "ready" and streak else state
                if known is not None and entry.remote:
                    item.update(
                        reason=known.reason,
                        ejected_until=known.ejected_until,
                        ejections=known.ejections,
                    )
                elif known is not None:
                    item.update(
                        pid=known.pid,
                        uptime_seconds=round(now - known.started_at, 1)
                        if known.started_at
                        else None,
                        restarts=known.restarts,
                        last_exit=known.last_exit,
                        last_restart_reason=known.last_restart_reason,
                        reason=known.reason,
                        restart_budget=asdict(budget_view(known, now)),
                    )
                item["failure_streak"] = streak
                status = self.status(spec)
                item["load"] = status["load"]
                item["memory_mb"] = status["memory_mb"]
                item["slot_cache"] = status["slot_cache"]
                item["idle_ttl_remaining"] = status["idle_ttl_remaining"]
                gate = self.gates.get(spec.role)
                if gate is not None:
                    item["in_flight"] = gate.active
                    item["queued"] = gate.queued
            report[spec.role] = item
        return JSONResponse(report, headers=self.in_force.headers())

    async def health(self, _request: Request) -> JSONResponse:
        """``GET /health``: the router itself, the registry it routes by, and the
        machine's free memory beside the budget."""
        body: dict[str, Any] = {
            "status": "ok",
            "models": len(self.registry.entries),
            "registry": self.in_force.to_json(),
        }
        if self.memory is not None:
            body["memory"] = self.memory()
        return JSONResponse(body, headers=self.in_force.headers())


def _as_alias(model: dict[str, Any], name: str) -> dict[str, Any]:
    """A model as one of its aliases shows it: the alias as its ``id``, the model's
    own id as ``alias_of``, and no ``aliases`` of its own."""
    shown = {"id": name, **{k: v for k, v in model.items() if k not in ("id", "aliases")}}
    shown["alias_of"] = model["id"]
    return shown
