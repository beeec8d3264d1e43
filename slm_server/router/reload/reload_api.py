"""``POST /v1/config/reload``: have the supervisor reload the registry file, and route
by what it applied before answering.

The supervisor reads and validates the whole file, applies only the difference and
publishes the result (:mod:`slm_server.contracts.applied_registry`); the router
answers once it routes by that registry (waiting at most ``CATCH_UP_SECONDS`` for it
to be published), so a client that reloads and then asks for a model the reload added
is routed by the new registry. A refusal names every problem found.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from slm_server.contracts.commands import Command, CommandError, Reply
from slm_server.errors import BackendUnavailable, GatewayError, InvalidRequest, ModelConflict
from slm_server.router.ondemand.loader import Commander
from slm_server.router.reload.follower import Follower
from slm_server.router.upstream.client import RETRY_AFTER_SECONDS

CATCH_UP_SECONDS = 2.0


class _Problems(GatewayError):
    """A refusal whose error object also lists every problem, one by one."""

    def __init__(self, message: str, problems: tuple[str, ...]) -> None:
        super().__init__(message)
        self.problems = problems

    def body(self) -> dict[str, Any]:
        body = super().body()
        body["error"]["problems"] = list(self.problems)
        return body


class RegistryInvalid(_Problems, InvalidRequest):
    """The new registry does not validate (400): the message names every problem,
    and the error object lists them one by one in ``problems``."""

    default_code = "registry_invalid"


class RegistryConflict(_Problems, ModelConflict):
    """The new registry validates but cannot be applied to the machine as it runs
    (409); its problems listed as for :class:`RegistryInvalid`."""

    default_code = "registry_conflict"


def refusal(reply: Reply) -> GatewayError:
    """The error for a reload the supervisor refused, by why it refused (a refusal
    that says nothing of why, from a supervisor that does not know reloads, is a 503
    ``reload_refused``)."""
    problems = reply.problems or ()
    message = "; ".join(problems) or reply.error or "the supervisor refused the reload"
    if reply.refused == "stopping":
        return BackendUnavailable(message, code="supervisor_stopping")
    if reply.refused == "conflict":
        return RegistryConflict(message, problems)
    if reply.refused == "invalid" or problems:
        return RegistryInvalid(message, problems)
    return BackendUnavailable(message, code="reload_refused")


class ReloadApi:
    """The reload endpoint of one router."""

    def __init__(self, commander: Commander, follower: Follower) -> None:
        self.commander = commander
        self.follower = follower

    async def reload(self, _request: Request) -> JSONResponse:
        """``POST /v1/config/reload``; a body, if any, is not read."""
        try:
            reply = await self.commander(Command("reload"))
        except CommandError as exc:
            raise BackendUnavailable(
                f"The registry cannot be reloaded: the supervisor is not running or does "
                f"not answer ({exc})",
                code="supervisor_not_running",
                retry_after=RETRY_AFTER_SECONDS,
            ) from None
        if not reply.ok:
            raise refusal(reply)
        if reply.version is not None:
            await self.follower.catch_up(reply.version, CATCH_UP_SECONDS)
        return JSONResponse(
            {
                "object": "registry.reload",
                "version": reply.version,
                "generation": reply.generation,
                "added": list(reply.added or ()),
                "removed": list(reply.removed or ()),
                "replaced": list(reply.replaced or ()),
                "unchanged": list(reply.unchanged or ()),
            }
        )


__all__ = ["ReloadApi", "refusal"]
