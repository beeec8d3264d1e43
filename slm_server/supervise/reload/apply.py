"""Applying a reload: the registry file read, validated and planned again
(:mod:`.prepare`), then refused whole, naming every problem, or applied as the
difference from the registry in force. Unchanged backends keep their process (with
their new entry); removed and replaced ones retire
(:mod:`~slm_server.supervise.shell.retiring`: drained, then stopped); added and
replacing ones begin, a replacing one held until the process it replaces is gone.
Reloads spend no restart budget.

The registry the supervisor starts with is put in force here too (every entry
planned once, a backend made for each local one), and so is the record of the registry
in force: its snapshot and stamp (:mod:`slm_server.contracts.applied_registry`),
published at start and by each reload before its reply, and the watch on its file
(:mod:`.watch`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from slm_server.contracts import applied_registry, commands
from slm_server.contracts.applied_registry import RegistryStamp, RetireReason
from slm_server.launch.plan import LaunchPlan
from slm_server.registry.schema import ModelSpec
from slm_server.supervise.core.actions import Action
from slm_server.supervise.core.observations import Begin, Observation, Released
from slm_server.supervise.core.phases import Held
from slm_server.supervise.reload.prepare import Prepared, Refusal, conflicts, plan_all, prepare
from slm_server.supervise.reload.watch import ConfigWatch
from slm_server.supervise.shell.act import Actor, Shell, Tasks
from slm_server.supervise.shell.backend import Backend
from slm_server.supervise.shell.fleet import Fleet
from slm_server.supervise.shell.remotes import Remotes
from slm_server.supervise.shell.retiring import Retiree

log = logging.getLogger("slm_server.supervisor")


class Reloads:
    """The registry in force: put in force at start, its record published, and each
    reload of it. ``apply`` decides on an observation and carries it out; ``publish``
    writes the state file when it is behind (the supervisor's own)."""

    def __init__(
        self,
        shell: Shell,
        fleet: Fleet,
        tasks: Tasks,
        actor: Actor,
        remotes: Remotes,
        apply: Callable[[Observation], list[Action]],
        publish: Callable[[], None],
        registry_text: str | None = None,
    ) -> None:
        self.settings, self.tools, self.control = shell.settings, shell.tools, shell.control
        self.events, self.clock, self.wall = shell.events, shell.clock, shell.wall
        self.publisher, self.stopping = shell.publisher, shell.stopping
        self.slot_dir = shell.slot_dir
        self.fleet = fleet
        self.tasks = tasks
        self.actor = actor
        self.remotes = remotes
        self.apply = apply
        self.publish = publish
        # The registry in force (see contracts/applied_registry.py): its text and stamp.
        self.registry_text = registry_text
        self.stamp: RegistryStamp | None = None
        self.watch_file: ConfigWatch | None = None

    def file_changed(self) -> bool:
        """Whether the registry file changed and then settled (``SLM_CONFIG_WATCH``)."""
        return self.watch_file is not None and self.watch_file.due(self.clock())

    def start(self) -> None:
        """Put the registry the supervisor starts with in force: a backend for each
        local entry, and the registry published (:meth:`stamp_registry`)."""
        fleet = self.fleet
        # Every entry planned once: the launch keys a reload compares against, and
        # whether each one's slots are kept (the launches plan again, as they must).
        plans, fleet.keys, _problems = plan_all(
            fleet.registry,
            self.tools,
            self.settings.log_dir,
            budget_mb=self.settings.memory.budget_mb,
            slot_dir=self.slot_dir,
        )
        for spec in fleet.registry.models:
            if spec.role in self.remotes:
                continue  # nothing to start: see Remotes
            fleet.backends[spec.role] = fleet.new_backend(spec, plans.get(spec.role))
        self.stamp_registry()

    def stamp_registry(self) -> None:
        """Publish the registry at start: its snapshot, then (with the state file) its
        stamp."""
        text = self.registry_text
        if text is None:
            try:
                text = self.fleet.registry.path.read_text(encoding="utf-8")
            except OSError:
                text = None
        if text is not None:
            self.registry_text = text
            self.publish_registry(text, 1)
        if self.settings.config_watch:
            self.watch_file = ConfigWatch(
                self.fleet.registry.path, self.settings.config_watch_settle_seconds
            )

    def publish_registry(self, text: str, generation: int) -> bool:
        """Write the applied registry's snapshot now and its stamp with the next state
        file; False when the snapshot cannot be written (reported; the stamp then stays
        as it was)."""
        path = applied_registry.snapshot_path(self.settings.log_dir)
        try:
            applied_registry.write_snapshot(self.settings.log_dir, text)
        except OSError as exc:
            self.publisher.chores.failed("state_write_failed", str(path), exc)
            return False
        self.stamp = RegistryStamp(
            applied_registry.version_of(text),
            generation,
            round(self.wall(), 3),
            str(self.fleet.registry.path),
        )
        self.publisher.dirty = True
        return True

    def reload(self, source: str) -> commands.Reply:
        """Read, validate and apply the registry file again (``source``: ``command``,
        ``signal`` or ``file``): refused whole, naming every problem, or applied as the
        difference from the running one (see :mod:`.prepare`), published before the reply.
        Reloads are serialised: each runs whole on the loop."""
        started = self.clock()
        path = self.fleet.registry.path
        self.events.emit("config_reload_requested", source=source, config=str(path))
        if self.stopping.is_set():
            return self.refuse(source, Refusal("stopping", ()))
        try:
            prepared = prepare(
                path,
                self.fleet.keys,
                self.tools,
                self.settings.log_dir,
                budget_mb=self.settings.memory.budget_mb,
                slot_dir=self.slot_dir,
            )
            found = [] if isinstance(prepared, Refusal) else self.conflicts(prepared)
        except Exception as exc:  # a bug must not take supervision down with it
            log.exception("reload of %s failed", path)
            return self.refuse(source, Refusal("invalid", (f"{path}: cannot be read: {exc!r}",)))
        if isinstance(prepared, Refusal):
            return self.refuse(source, prepared)
        if found:
            return self.refuse(source, Refusal("conflict", tuple(found)))
        generation = self.stamp.generation + 1 if self.stamp is not None else 1
        if not self.publish_registry(prepared.text, generation):
            why = f"{applied_registry.snapshot_path(self.settings.log_dir)} cannot be written"
            return self.refuse(source, Refusal("conflict", (why,)))
        self.apply_registry(prepared)
        assert self.stamp is not None
        diff = prepared.diff
        self.events.emit(
            "config_reloaded",
            source=source,
            config=str(path),
            version=self.stamp.version,
            generation=self.stamp.generation,
            **diff.to_fields(),
            seconds=round(self.clock() - started, 3),
        )
        log.info(
            "reloaded %s (version %s): %d added, %d removed, %d replaced, %d unchanged",
            path,
            self.stamp.version,
            len(diff.added),
            len(diff.removed),
            len(diff.replaced),
            len(diff.unchanged),
        )
        self.tasks.wake_loop()
        return commands.Reply(
            True,
            version=self.stamp.version,
            generation=self.stamp.generation,
            added=diff.added,
            removed=diff.removed,
            replaced=diff.replaced,
            unchanged=diff.unchanged,
        )

    def refuse(self, source: str, refusal: Refusal) -> commands.Reply:
        self.events.emit(
            "config_reload_refused",
            source=source,
            config=str(self.fleet.registry.path),
            refused=refusal.kind,
            problems=list(refusal.problems),
        )
        log.error("reload refused: %s", refusal.message)
        return commands.Reply(
            False, error=refusal.message, problems=refusal.problems, refused=refusal.kind
        )

    def conflicts(self, prepared: Prepared) -> list[str]:
        """Why a valid registry cannot be applied now (see :func:`.prepare.conflicts`);
        also one that enables no model (the supervisor would have nothing left)."""
        found = conflicts(
            prepared, self.settings.memory.budget_mb, self.fleet.footprint_of, self.port_taken
        )
        if not prepared.registry.enabled:
            found.append(
                f"{prepared.registry.path}: no entry is enabled; the gateway would serve "
                "nothing (stop it instead)"
            )
        return found

    def port_taken(self, spec: ModelSpec, plan: LaunchPlan) -> str | None:
        """Who holds ``plan``'s port when it is not a process of ours. A port one of
        our backends (or retiring processes) listens on counts as ours whoever the
        system says holds it: just after a ``kill -9`` the dying process's socket is
        seen without a pid; its launch frees the port or waits, as a restart does."""
        ours = [*self.fleet.backends.values(), *self.fleet.retirements.backends()]
        if any(b.spec.entry.port == plan.port for b in ours):
            return None
        holder = self.control.port_holder(plan.host, plan.port)
        if holder is None or self.fleet.is_ours(holder, plan):
            return None
        return str(holder)

    def apply_registry(self, prepared: Prepared) -> None:
        """Apply a prepared reload: unchanged backends keep their process (with their
        new entry); removed and replaced ones retire (drained, then stopped); added and
        replacing ones begin, a replacing one held until the process it replaces is
        gone. Reloads spend no restart budget; a replacing backend's starts fresh."""
        # What running tasks reported is decided first, so a process spawned for a
        # backend about to retire is known to be alive, and no report of the old
        # backend reaches the new one of its role.
        while self.tasks.inbox:
            self.apply(self.tasks.inbox.pop(0))
        diff = prepared.diff
        registry = prepared.registry
        old = self.fleet.backends
        disabled = {s.role for s in registry.models if not s.entry.enabled}
        for role in (*diff.removed, *diff.replaced):
            backend = old.get(role)
            if backend is None:
                continue
            gone = role in diff.removed or role in disabled
            reason: RetireReason = "removed" if gone else "replaced"
            record = self.fleet.retirements.add(backend, reason)
            if record is not None:
                self.events.emit(
                    "backend_retiring",
                    **backend.life.ids(),
                    pid=record.pid,
                    reason=reason,
                    deadline_seconds=round(record.deadline - record.since, 3),
                )
        fresh = set(diff.added) | set(diff.replaced)
        backends: dict[str, Backend] = {}
        for spec in registry.models:
            if spec.entry.enabled and spec.entry.remote:
                continue
            kept = old.get(spec.role)
            plan = prepared.plans.get(spec.role)
            if kept is not None and spec.role not in fresh:
                kept.spec = spec
                if kept.plan is not None and plan is not None:
                    kept.plan = plan  # same command line; the request defaults may differ
                backends[spec.role] = kept
                continue
            held_by = self.fleet.retirements.holder(spec.role, spec.entry.port)
            backends[spec.role] = self.fleet.new_backend(spec, plan, reloaded=True, held_by=held_by)
        self.fleet.backends = backends
        remotes = [s for s in registry.enabled if s.entry.remote]
        self.remotes.replace(remotes, set(diff.unchanged))
        self.fleet.registry = registry
        self.fleet.keys = dict(prepared.keys)
        self.registry_text = prepared.text
        self.publisher.dirty = True
        self.apply(Begin())
        self.release_held()  # held by a process that was already gone
        self.publish()

    def release_held(self) -> None:
        """Release every held backend that no retiring process blocks any more (by its
        role or its port: a swap of ports holds each on the other's process)."""
        for backend in list(self.fleet.backends.values()):
            if not isinstance(backend.life.phase, Held):
                continue
            if self.fleet.retirements.holder(backend.role, backend.spec.entry.port) is None:
                self.apply(Released(backend.role))

    async def retire(self, retiree: Retiree, why: str) -> None:
        """Stop a retiring backend (``why``: drained, deadline, exited) and release the
        backend that waited for its port."""
        await self.actor.retire(retiree, why)
        self.release_held()
