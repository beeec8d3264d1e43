"""Whether a backend's chat template takes tools, for the ``auto`` policy: asked of
llama-server (``GET /props``, its ``chat_template_caps.supports_tools``) once per
process; a remote's and an MLX server's (``enable_auto_tool_choice``) taken as they
say; unknown for the others."""

from __future__ import annotations

import json
from typing import Final

from slm_server.registry.schema import ModelSpec
from slm_server.router.call.backend_state import StateSource
from slm_server.router.upstream.client import Transport

PROPS_TIMEOUT: Final = 2.0
MAX_PROPS_BYTES: Final = 1 << 20


class TemplateCaps:
    """The answers, kept per backend process (a restart may load another template)."""

    def __init__(self, upstream: Transport, states: StateSource) -> None:
        self.upstream = upstream
        self.states = states
        self._known: dict[tuple[str, int | None], bool | None] = {}

    async def takes_tools(self, spec: ModelSpec, server_kind: str | None) -> bool | None:
        """Whether ``spec``'s template renders tools; None when it cannot be told (the
        ``auto`` policy then leaves them to the template, as a request that names none
        would be)."""
        entry = spec.entry
        if entry.remote:
            return True
        if entry.backend == "mlx":
            return entry.enable_auto_tool_choice
        if server_kind != "llama-server":
            return None
        state = self.states.get(spec.role, entry.port)
        key = (spec.role, state.pid if state is not None else None)
        if key in self._known:
            return self._known[key]
        answer = await self.upstream.fetch(spec, "/props", PROPS_TIMEOUT, MAX_PROPS_BYTES)
        takes = _supports_tools(answer[1]) if answer is not None and answer[0] == 200 else None
        if takes is not None or (state is not None and state.state == "ready"):
            # Kept for the process (a ready one that cannot say is not asked each time).
            if len(self._known) > 1024:
                self._known.clear()
            self._known[key] = takes
        return takes


def _supports_tools(body: bytes) -> bool | None:
    try:
        props = json.loads(body)
    except (ValueError, RecursionError):
        return None
    caps = props.get("chat_template_caps") if isinstance(props, dict) else None
    value = caps.get("supports_tools") if isinstance(caps, dict) else None
    return value if isinstance(value, bool) else None


__all__ = ["TemplateCaps"]
