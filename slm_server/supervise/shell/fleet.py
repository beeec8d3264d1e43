"""The backends one supervisor owns: those of the registry in force (by role, with the
launch key of each), those a reload retires while they drain, and the processes an
earlier launcher left. The loop, its acts and a reload all look at one fleet; a reload
replaces its registry, keys and backends.

Also which process holding a port is ours (:mod:`~slm_server.supervise.core.strays`),
what an entry would be admitted by, and how a backend is made for an entry: with a
fresh restart budget, its expected footprint and its saved slots, and no phase
(:class:`~slm_server.supervise.core.observations.Begin` chooses it).
"""

from __future__ import annotations

from slm_server.contracts.records import PidRecord
from slm_server.launch import process
from slm_server.launch.plan import LaunchPlan
from slm_server.registry.schema import ModelSpec, RegistryFile
from slm_server.settings import WatchdogSettings
from slm_server.supervise.core.decide import Lifecycle
from slm_server.supervise.core.registry_diff import LaunchKey
from slm_server.supervise.core.restart_budget import RestartBudget
from slm_server.supervise.core.strays import verifiably_ours
from slm_server.supervise.shell.backend import Backend, admitted_mb
from slm_server.supervise.shell.footprints import Expected, Footprints
from slm_server.supervise.shell.retiring import Retirements
from slm_server.supervise.shell.slot_saves import SlotSaves


class Fleet:
    """Every backend of one supervisor, and how a new one is made."""

    def __init__(
        self,
        registry: RegistryFile,
        watchdog: WatchdogSettings,
        footprints: Footprints,
        slot_saves: SlotSaves,
        retirements: Retirements,
    ) -> None:
        self.registry = registry  # the registry in force
        self.watchdog = watchdog
        self.footprints = footprints
        self.slot_saves = slot_saves
        self.backends: dict[str, Backend] = {}  # by role
        # The launch key of each backend in force, which a reload compares against.
        self.keys: dict[str, LaunchKey] = {}
        self.retirements = retirements
        self.previous: list[PidRecord] = []  # an earlier launcher's (its pidfile's)

    def lives(self) -> dict[str, Lifecycle]:
        return {role: b.life for role, b in self.backends.items()}

    def current(self, backend: Backend) -> bool:
        """Whether ``backend`` is still the one of its role (a reload may have replaced
        or removed it while a task of its own ran)."""
        return self.backends.get(backend.role) is backend

    def is_ours(self, holder: process.PortHolder, plan: LaunchPlan) -> bool:
        """Whether the process holding the port is one this supervisor (or the one
        before it) started."""
        known = [(r.pid, r.create_time) for r in self.previous]
        known += [
            (b.child.pid, b.child.create_time)
            for b in [*self.backends.values(), *self.retirements.backends()]
            if b.child is not None
        ]
        return verifiably_ours(holder.pid, holder.create_time, holder.argv, known, plan.argv)

    def footprint_of(self, spec: ModelSpec) -> int | None:
        """What ``spec`` would be admitted by: the running backend's footprint when its
        launch is unchanged, else its ``memory_mb``, remembered or estimated one."""
        running = self.backends.get(spec.role)
        key = self.keys.get(spec.role)
        if running is not None and key is not None and running.spec.entry == spec.entry:
            return running.footprint_mb
        expected = self.footprints.expect(spec)
        return admitted_mb(
            spec.entry, expected.remembered_mb, expected.estimate_mb, expected.prompt_cache_mb
        )

    def new_backend(
        self,
        spec: ModelSpec,
        plan: LaunchPlan | None = None,
        reloaded: bool = False,
        held_by: int | None = None,
    ) -> Backend:
        """A backend for ``spec`` (planned as ``plan``; None: it cannot be) with a fresh
        restart budget, not yet begun."""
        budget = RestartBudget(
            self.watchdog.max_restarts,
            self.watchdog.restart_window_seconds,
            self.watchdog.restart_cooldown_seconds,
        )
        entry = spec.entry
        expected = self.footprints.expect(spec) if entry.enabled else Expected()
        life = Lifecycle(
            role=spec.role,
            model_id=entry.id,
            port=entry.port,
            budget=budget,
            measured_mb=expected.remembered_mb,
            enabled=entry.enabled,
            on_demand=entry.load == "on_demand",
            reloaded=reloaded and entry.enabled and entry.load == "always",
            held_by=held_by,
        )
        backend = Backend(spec, life)
        backend.footprint_key, backend.estimate_mb = expected.key, expected.estimate_mb
        backend.prompt_cache_mb = expected.prompt_cache_mb
        if plan is not None:
            self.expect_slots(backend, plan)
        return backend

    def expect_slots(self, backend: Backend, plan: LaunchPlan) -> None:
        """Whether its slots are kept across unloads, and what is saved for it."""
        backend.slot_skip = plan.slot_cache_skip
        slots = backend.spec.entry.max_concurrency
        backend.slot_tokens = self.slot_saves.saved_tokens(plan.slot_cache_key, slots)
