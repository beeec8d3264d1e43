"""``POST /v1/models/load`` and ``POST /v1/models/unload``: load an on-demand model
ahead of its first request, or unload it by hand. Both take ``{"model": "<id>"}`` and
answer with the model as ``GET /v1/models/{id}`` shows it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from slm_server.errors import ModelConflict
from slm_server.registry.schema import ModelSpec
from slm_server.router.call.waits import client_of
from slm_server.router.dispatch.lookup import Registry
from slm_server.router.intake.payload import model_field
from slm_server.router.intake.small_body import read_small_json
from slm_server.router.ondemand.loader import Loader

MAX_BODY_BYTES = 64 * 1024


class ModelsApi:
    """The load and unload endpoints of one router."""

    def __init__(
        self,
        registry: Registry,
        loader: Loader,
        describe: Callable[[ModelSpec, str | None], dict[str, Any]],
    ) -> None:
        self.registry = registry
        self.loader = loader
        self.describe = describe

    async def _spec(self, request: Request) -> tuple[ModelSpec, str]:
        """The model the body names (by its id or an alias), and the name."""
        too_large = f"A load or unload body is at most {MAX_BODY_BYTES} bytes"
        model_id = model_field(await read_small_json(request, MAX_BODY_BYTES, too_large))
        named = [
            s
            for s in self.registry.models
            if s.entry.id == model_id or model_id in s.entry.alias_names
        ]
        if named and not any(s.entry.enabled for s in named):
            raise ModelConflict(
                f"The model '{model_id}' is disabled in the registry (enabled: false)",
                param="model",
            )
        return self.registry.lookup(model_id), model_id

    async def load(self, request: Request) -> JSONResponse:
        """Ready within the model's ``default_timeout`` (an ``always`` model is)."""
        spec, name = await self._spec(request)
        if self.loader.on_demand(spec):
            await self.loader.load(spec, client_of(request.scope, request.receive))
        return JSONResponse(self.describe(spec, name))

    async def unload(self, request: Request) -> JSONResponse:
        """Once its process has exited; refused (409) for a ``load: always`` model.
        Every alias of the model is unloaded with it: they share its process."""
        spec, name = await self._spec(request)
        if not self.loader.on_demand(spec):
            raise ModelConflict(
                f"The model '{spec.entry.id}' is load: always: it is loaded at launch and "
                "never unloaded",
                param="model",
            )
        await self.loader.unload(spec)
        return JSONResponse(self.describe(spec, name))


__all__ = ["ModelsApi"]
