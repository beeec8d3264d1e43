"""Ollama's model routes, answered by the router itself from the registry, the models'
files and the supervisor's states: ``GET /api/version``, ``GET /api/tags``, ``POST
/api/show``, ``GET /api/ps``, ``GET``/``HEAD /`` (Ollama's "is it running" probe),
and a clear refusal on the routes that change the models (``/api/pull``, ``push``,
``create``, ``copy``, ``delete``, ``blobs``): here the registry says what is served.

Only the models Ollama's API can use are listed: text models (``completion``) and
embedding models (``embedding``); each alias is listed as a model of its own, as
``GET /v1/models`` lists it."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from slm_server.errors import HttpStatusError, InvalidRequest
from slm_server.registry.infill import InfillCache
from slm_server.registry.schema import ModelSpec
from slm_server.router.apis.ollama.endpoint import FACTS
from slm_server.router.apis.ollama.model_facts import Facts, ModelFacts
from slm_server.router.dispatch.lookup import Registry
from slm_server.router.intake.small_body import read_small_json
from slm_server.router.toolcalls.template_caps import TemplateCaps

log = logging.getLogger("slm_server.router")

# The Ollama release whose API this one answers as (its clients check a least version).
OLLAMA_VERSION: Final = "0.13.0"
RUNNING: Final = "Ollama is running"
SERVED_TYPES: Final = frozenset({"lm", "multimodal", "embeddings"})
MAX_SHOW_BODY: Final = 64 * 1024
# Ollama's "kept loaded for good": its expiry for keep_alive -1 lands in 2318.
FOREVER: Final = "2318-01-01T00:00:00Z"
MIB: Final = 1024 * 1024
# Registry sampling fields as Ollama's parameters.
PARAMETERS: Final = (
    ("temp", "temperature"),
    ("top_p", "top_p"),
    ("top_k", "top_k"),
    ("min_p", "min_p"),
    ("repetition_penalty", "repeat_penalty"),
    ("presence_penalty", "presence_penalty"),
    ("n_predict", "num_predict"),
)

Status = Callable[[ModelSpec], dict[str, Any]]
ServerKind = Callable[[ModelSpec], "str | None"]


def _stamp(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat().replace("+00:00", "Z")


class OllamaCatalog:
    """The router's own Ollama routes for one registry (replaced in place by a
    reload: :attr:`registry` is the router's)."""

    def __init__(
        self,
        registry: Registry,
        status: Status,
        caps: TemplateCaps,
        server_kind: ServerKind,
        infill: InfillCache,
        *,
        list_aliases: bool = True,
        facts: ModelFacts = FACTS,
    ) -> None:
        self.registry = registry
        self.status = status
        self.caps = caps
        self.server_kind = server_kind
        self.infill = infill
        self.list_aliases = list_aliases
        self.facts = facts
        self.started = time.time()

    async def root(self, _request: Request) -> Response:
        """``GET /`` and ``HEAD /``: Ollama's answer to a client asking whether it runs."""
        return PlainTextResponse(RUNNING)

    async def version(self, _request: Request) -> JSONResponse:
        """``GET /api/version``."""
        return JSONResponse({"version": OLLAMA_VERSION})

    def _served(self) -> list[tuple[str, ModelSpec]]:
        """Every model Ollama's API can use, by each name it answers to."""
        named = []
        for spec in self.registry.entries:
            if spec.entry.model_type not in SERVED_TYPES:
                continue
            named.append((spec.entry.id, spec))
            if self.list_aliases:
                named += [(alias, spec) for alias in spec.entry.alias_names]
        return named

    def _details(self, spec: ModelSpec, facts: Facts) -> dict[str, Any]:
        family = facts.family or spec.entry.backend
        return {
            "parent_model": "",
            "format": facts.format,
            "family": family,
            "families": [family],
            "parameter_size": facts.parameter_size or "",
            "quantization_level": spec.entry.quantization or "",
        }

    def _listed(self, name: str, spec: ModelSpec, facts: Facts) -> dict[str, Any]:
        return {
            "name": name,
            "model": name,
            "modified_at": facts.modified_at or _stamp(self.started),
            "size": facts.size,
            "digest": facts.digest,
            "details": self._details(spec, facts),
        }

    async def tags(self, _request: Request) -> JSONResponse:
        """``GET /api/tags``: every model and alias, with its file's size and details."""
        models = [
            self._listed(name, spec, await self.facts.read(spec.entry))
            for name, spec in self._served()
        ]
        return JSONResponse({"models": models})

    async def ps(self, _request: Request) -> JSONResponse:
        """``GET /api/ps``: the models loaded now, their memory and when they unload."""
        models = []
        for name, spec in self._served():
            if name != spec.entry.id:
                continue  # an alias runs no process of its own
            status = self.status(spec)
            if status.get("state") != "ready":
                continue
            facts = await self.facts.read(spec.entry)
            shown = self._listed(name, spec, facts)
            memory = status.get("memory_mb") or {}
            mb = next(
                (
                    memory.get(k)
                    for k in ("resident", "measured", "admitted_as", "estimate")
                    if isinstance(memory.get(k), int | float)
                ),
                None,
            )
            shown["size"] = int(mb * MIB) if mb is not None else facts.size
            shown["size_vram"] = 0
            shown["expires_at"] = _expiry(status)
            shown["context_length"] = self._context(spec, facts)
            models.append(shown)
        return JSONResponse({"models": models})

    async def show(self, request: Request) -> JSONResponse:
        """``POST /api/show``: one model's details, metadata (``model_info``, its
        context the one served), template, parameters and capabilities."""
        body = await _small_json(request)
        name = body.get("model", body.get("name"))
        if not isinstance(name, str) or not name:
            raise InvalidRequest("model is required", param="model")
        spec = self.registry.lookup(name)
        if spec.entry.model_type not in SERVED_TYPES:
            raise InvalidRequest(
                f"'{name}' is a {spec.entry.model_type} model, which Ollama's API does not "
                "serve (use its /v1 route)",
                param="model",
            )
        facts = await self.facts.read(spec.entry)
        info: dict[str, Any] = dict(facts.metadata)
        family = facts.family or spec.entry.backend
        info.setdefault("general.architecture", family)
        info.setdefault("general.basename", spec.entry.id)  # Copilot's name for it
        context = self._context(spec, facts)
        if context is not None:
            info[f"{family}.context_length"] = context
        shown: dict[str, Any] = {
            "license": "",
            "modelfile": f"# served by slm_server from its registry entry '{spec.entry.id}'\n",
            "parameters": self._parameters(spec, context),
            "template": facts.template,
            "details": self._details(spec, facts),
            "model_info": info,
            "capabilities": await self._capabilities(spec, facts),
            "modified_at": facts.modified_at or _stamp(self.started),
        }
        return JSONResponse(shown)

    @staticmethod
    def _context(spec: ModelSpec, facts: Facts) -> int | None:
        """The context the model is served with (the registry's, else the trained)."""
        return spec.entry.context_length or facts.trained_context

    @staticmethod
    def _parameters(spec: ModelSpec, context: int | None) -> str:
        entry = spec.entry
        lines = [
            f"{name} {getattr(entry, field)}"
            for field, name in PARAMETERS
            if getattr(entry, field) is not None
        ]
        if context is not None:
            lines.append(f"num_ctx {context}")
        return "\n".join(lines)

    async def _capabilities(self, spec: ModelSpec, facts: Facts) -> list[str]:
        entry = spec.entry
        if entry.model_type == "embeddings":
            return ["embedding"]
        found = ["completion"]
        takes = await self.caps.takes_tools(spec, self.server_kind(spec))
        if takes is None:  # no process to ask: the template's own text says
            takes = facts.template_tools
        if takes:
            found.append("tools")
        if facts.thinking or entry.reasoning_parser is not None:
            found.append("thinking")
        if entry.model_type == "multimodal":
            found.append("vision")
        if (await self.infill.of(entry)).takes is True:
            found.append("insert")  # a suffix on /api/generate fills in the middle
        return found

    async def warm(self) -> None:
        """Read every served model's file facts once, off the event loop, so that no
        request waits for a header to be read (``think``'s check reads them at once)."""
        for _name, spec in self._served():
            try:
                await self.facts.read(spec.entry)
            except Exception:  # a file that cannot be read is read (and told) at its use
                log.debug("could not read %s's file facts ahead", spec.entry.id, exc_info=True)

    async def refused(self, request: Request) -> Response:
        """The routes that add, change or remove models: refused, saying how."""
        raise HttpStatusError(
            501,
            f"{request.method} {request.url.path} is not served: this gateway serves the "
            "models its registry (config/models.yaml) lists; add a model there and reload "
            "(POST /v1/config/reload), see docs/configuration.md",
            "not_implemented",
        )


def _expiry(status: dict[str, Any]) -> str:
    """When a loaded model unloads if nothing asks for it (Ollama's ``expires_at``)."""
    ttl = status.get("idle_ttl")
    if status.get("load") != "on_demand" or not isinstance(ttl, int | float) or math.isinf(ttl):
        return FOREVER
    remaining = status.get("idle_ttl_remaining")
    left = remaining if isinstance(remaining, int | float) else ttl
    try:
        until = datetime.now(UTC) + timedelta(seconds=left)
    except (OverflowError, ValueError):  # past the calendar: for good
        return FOREVER
    return until.isoformat().replace("+00:00", "Z")


async def _small_json(request: Request) -> dict[str, Any]:
    """A small JSON request body (``/api/show``'s), read within its limit."""
    return await read_small_json(
        request, MAX_SHOW_BODY, f"The request body is larger than {MAX_SHOW_BODY} bytes"
    )


__all__ = ["OLLAMA_VERSION", "RUNNING", "OllamaCatalog"]
