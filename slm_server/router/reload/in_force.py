"""The registry the router routes by, as ``/health``, ``/v1/backends/health`` and the
dashboard name it."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from slm_server.contracts.applied_registry import RegistryStamp


@dataclass
class InForce:
    """The registry in force: its ``version`` (of its text; None when the router
    could not tell which text it was read from) and the file it came from; once the
    router follows a supervisor's stamp, also how many registries that supervisor
    has applied (``generation``) and when it applied this one (wall clock)."""

    version: str | None
    path: str
    generation: int | None = None
    loaded_at: float | None = None

    def adopt(self, stamp: RegistryStamp) -> None:
        """The router routes by the registry ``stamp`` names."""
        self.version = stamp.version
        self.path = stamp.path
        self.generation = stamp.generation
        self.loaded_at = stamp.loaded_at

    def headers(self) -> dict[str, str]:
        """``X-Registry-Version`` and ``X-Registry-Generation``, for the answers whose
        body has no room for the registry (``/v1/backends/health`` is keyed by role)."""
        found = {"x-registry-version": self.version or "unknown"}
        if self.generation is not None:
            found["x-registry-generation"] = str(self.generation)
        return found

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


__all__ = ["InForce"]
