"""The router's commands to the supervisor (``load``, ``unload``) over a Unix socket in
the log directory: each becomes an observation for
:func:`~slm_server.supervise.core.decide.decide`, and its
:class:`~slm_server.supervise.core.decide.Answer` becomes the reply."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from pathlib import Path

from slm_server.contracts import commands
from slm_server.supervise.core.actions import Action, Answer
from slm_server.supervise.core.observations import LoadRequested, UnloadRequested

log = logging.getLogger("slm_server.supervisor")


def observation(command: commands.Command) -> LoadRequested | UnloadRequested:
    """The command as :func:`decide` observes it (an unload without a reason is the
    API's)."""
    if command.op == "load":
        return LoadRequested(command.role)
    return UnloadRequested(command.role, command.reason or "api", command.for_model)


def reply(actions: Sequence[Action]) -> commands.Reply:
    """The reply to a command: the answer among the actions it was decided into."""
    [answer] = [a for a in actions if isinstance(a, Answer)]
    return commands.Reply(answer.accepted, answer.state, answer.error)


class CommandSocket:
    """Listens for the router's commands while the supervisor runs."""

    def __init__(self, log_dir: Path) -> None:
        self.path = commands.socket_path(log_dir)
        self.server: asyncio.AbstractServer | None = None

    async def open(self, handle: Callable[[commands.Command], commands.Reply]) -> bool:
        """Listen, answering each command with ``handle``; False (logged) when the
        socket cannot be had: supervision goes on, without loads on demand."""
        try:
            self.server = await commands.serve(self.path, handle)
        except OSError as exc:
            log.error("cannot listen for the router's commands on %s: %s", self.path, exc)
            return False
        return True

    def close(self) -> None:
        """Stop listening and remove the socket file."""
        if self.server is None:
            return
        self.server.close()
        self.server = None
        with contextlib.suppress(OSError):
            self.path.unlink()
