"""Following the supervisor's applied registry.

The supervisor publishes the registry in force as a stamp in the state file, after
writing its text as a snapshot beside the logs
(:mod:`~slm_server.contracts.applied_registry`). The follower looks at the stamp
every ``poll_seconds``; when it names a version other than the one the router routes
by, it reads the snapshot (only a text of that very version: a snapshot that does not
match is looked at again at the next poll), parses it, and rewires the router to it
(:class:`~slm_server.router.reload.rewire.Rewire`). It also keeps the backends a
reload retires draining (:class:`~slm_server.router.reload.retirements.Retirements`).

Only a running supervisor is followed: without one (or with a state file that names
no registry) the router routes by the registry it was started with, as before
reloads existed. The router follows once as it starts, so a router started after a
reload routes by the registry the supervisor applied, not by the file on disk.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from slm_server.contracts.applied_registry import RegistryStamp, read_snapshot
from slm_server.registry.schema import ConfigError, RegistryFile, parse_registry
from slm_server.router.call.backend_state import StateSource
from slm_server.router.call.periodic import Periodic
from slm_server.router.reload.in_force import InForce
from slm_server.router.reload.retirements import Retirements
from slm_server.router.reload.rewire import Rewire

log = logging.getLogger("slm_server.router")

POLL_SECONDS = 0.1
# While the reload endpoint waits for its registry to be published.
CATCH_UP_POLL_SECONDS = 0.02


def read_applied(log_dir: Path, stamp: RegistryStamp) -> RegistryFile | None:
    """The registry ``stamp`` names, from the snapshot; None while the snapshot holds
    another version (or none). Raises :class:`ConfigError` when it does not parse."""
    text = read_snapshot(log_dir, stamp.version)
    if text is None:
        return None
    return parse_registry(text, Path(stamp.path))


class Follower:
    """Keeps one router on the registry its supervisor applied."""

    def __init__(
        self,
        states: StateSource,
        log_dir: Path,
        rewire: Rewire,
        retirements: Retirements,
        in_force: InForce,
        *,
        poll_seconds: float = POLL_SECONDS,
    ) -> None:
        self.states = states
        self.log_dir = log_dir
        self.rewire = rewire
        self.retirements = retirements
        self.in_force = in_force
        self.poll_seconds = poll_seconds
        self._lock = asyncio.Lock()
        self._unreadable: set[str] = set()  # versions that did not parse (or apply)
        self._task = Periodic(
            self._turn,
            after_failure=lambda: self.poll_seconds,
            log=log,
            failure="following the applied registry failed a turn",
            first_wait=lambda: self.poll_seconds,
        )

    async def start(self) -> None:
        """Follow once now, then every ``poll_seconds``."""
        await self.sync()
        self._task.start()

    async def stop(self) -> None:
        await self._task.stop()

    async def _turn(self) -> float:
        await self.sync()
        return self.poll_seconds

    async def sync(self) -> None:
        """One look: follow the stamp if it names another registry, and move the
        retiring backends' drain on. Nothing without a running supervisor."""
        async with self._lock:
            if not self.states.launcher_alive():
                return
            stamp = self.states.stamp()
            if stamp is not None:
                await self._follow(stamp)
            await self.retirements.tick(self.states.retiring())

    async def catch_up(self, version: str, within: float) -> bool:
        """Look until the router routes by ``version`` (a reload the supervisor just
        answered for), at most ``within`` seconds; whether it does."""
        loop = asyncio.get_running_loop()
        until = loop.time() + within
        while True:
            await self.sync()
            if self.in_force.version == version or loop.time() >= until:
                return self.in_force.version == version
            await asyncio.sleep(CATCH_UP_POLL_SECONDS)

    async def _follow(self, stamp: RegistryStamp) -> None:
        in_force = self.in_force
        if stamp.version == in_force.version:
            if stamp.generation != in_force.generation:
                in_force.adopt(stamp)  # the same text, applied by this supervisor
            return
        if stamp.version in self._unreadable:
            return
        try:
            # A few kilobytes of YAML, validated: off the event loop all the same.
            applied = await asyncio.to_thread(read_applied, self.log_dir, stamp)
        except ConfigError as exc:
            self._unreadable.add(stamp.version)
            log.error(
                "the registry the supervisor applied (version %s) does not parse here; "
                "routing by version %s still: %s",
                stamp.version,
                in_force.version,
                exc,
            )
            return
        if applied is None:
            return  # the snapshot is of another version: a reload is being published
        fresh = [r for r in self.states.retiring() if not self.retirements.knows(r)]
        try:
            change = self.rewire.apply(applied.models, fresh)
        except Exception:  # a fault of ours: said once, not at every poll
            self._unreadable.add(stamp.version)
            log.exception("the router could not be rewired to registry version %s", stamp.version)
            return
        before = in_force.version
        in_force.adopt(stamp)
        log.info(
            "routing by registry version %s (generation %d, was %s): added %s, removed %s, "
            "replaced %s, %d kept",
            stamp.version,
            stamp.generation,
            before,
            list(change.added),
            list(change.removed),
            list(change.replaced),
            len(change.kept),
        )
        for warning in applied.warnings:
            log.warning("%s", warning)


__all__ = ["Follower", "read_applied"]
