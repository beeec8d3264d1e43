"""The reload that follows an add: the running gateway's supervisor asked to apply the
registry file again (:mod:`slm_server.contracts.commands`), and what came of it, for
the command line (:meth:`Reloaded.lines`) and the router's API (:meth:`Reloaded.as_json`)
alike."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slm_server.contracts import commands
from slm_server.contracts.commands import Command, CommandError, Reply

Sender = Callable[[Command], Awaitable[Reply]]

NOT_RUNNING = "no gateway is running: the entry takes effect at its next start"
CHANGES = ("added", "removed", "replaced", "unchanged")


@dataclass(frozen=True)
class Reloaded:
    """The supervisor's reply to the reload (refused or not), or why none was asked."""

    reply: Reply | None
    skipped: str | None = None  # no reply: the sentence that says why

    @property
    def applied(self) -> bool:
        return self.reply is not None and self.reply.ok

    def lines(self) -> tuple[list[str], list[str]]:
        """What the command line prints: (on stdout, on stderr)."""
        reply = self.reply
        if reply is None:
            return [self.skipped or NOT_RUNNING], []
        if not reply.ok:
            why = f"reload refused ({reply.refused or 'error'}): nothing was changed"
            problems = reply.problems or (reply.error or "",)
            return [], [why, *(f"  {problem}" for problem in problems)]
        out = [f"registry version {reply.version} (generation {reply.generation}) in force"]
        for what in CHANGES:
            roles = getattr(reply, what) or ()
            out.append(f"  {what}: {', '.join(roles) if roles else '-'}")
        return out, []

    def as_json(self) -> dict[str, Any]:
        """``{"reloaded": true, "version", "generation", "added", "removed", "replaced",
        "unchanged"}``; or ``{"reloaded": false, "reason"}`` (with ``refused`` and
        ``problems`` when the supervisor refused it)."""
        reply = self.reply
        if reply is None:
            return {"reloaded": False, "reason": self.skipped or NOT_RUNNING}
        if not reply.ok:
            problems = list(reply.problems or ())
            return {
                "reloaded": False,
                "reason": f"the reload was refused ({reply.refused or 'error'}): "
                + ("; ".join(problems) or reply.error or "nothing was changed"),
                "refused": reply.refused or "error",
                "problems": problems,
            }
        return {
            "reloaded": True,
            "version": reply.version,
            "generation": reply.generation,
            **{what: list(getattr(reply, what) or ()) for what in CHANGES},
        }


async def reload_gateway(send: Sender) -> Reloaded:
    """Ask for a reload through ``send``; a supervisor that cannot be reached is no
    error: the entry then applies at the gateway's next start."""
    try:
        reply = await send(Command("reload"))
    except CommandError as exc:
        return Reloaded(
            None, f"no running gateway answered ({exc}): the entry takes effect at its next start"
        )
    return Reloaded(reply)


async def reload_running(log_dir: Path) -> Reloaded:
    """:func:`reload_gateway` through the supervisor's socket under ``log_dir``; none
    asked when there is no socket (no gateway running)."""
    path = commands.socket_path(log_dir)
    if not path.exists():
        return Reloaded(None, NOT_RUNNING)

    async def send(command: Command) -> Reply:
        return await commands.send(path, command)

    return await reload_gateway(send)


__all__ = ["NOT_RUNNING", "Reloaded", "Sender", "reload_gateway", "reload_running"]
