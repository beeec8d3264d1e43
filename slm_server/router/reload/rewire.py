"""Rewiring the router to a reloaded registry, in one step with nothing awaited.

The parts that read the registry per request (reception, the model list and health
views, the load API, the dashboard, the metrics) hold the one
:class:`~slm_server.router.dispatch.lookup.Registry`, replaced in place. The parts that derived
state from it are brought along in the same step:

* the admission gates: a role in both registries keeps its gate, resized to its new
  limits (what is in flight and queued stays); a new role gets a new gate, and so does
  a role whose backend a reload retires (a new process for the same role), so that
  what is in flight on the old process can be seen to drain on the old gate
  (:class:`~slm_server.router.reload.retirements.Retirements`) while new requests
  queue on the new one; a role that left hands its gate over to be watched the same
  way;
* the replicas' balancers (:meth:`Choice.follow`) and the presets resolved
  (:meth:`Reception.forget_rules`), the
  on-demand planner (:meth:`Loader.follow`), the upstream pools
  (:meth:`Transport.retarget`), and the failure streaks of backends that changed.

A request routed before the step keeps the spec it was routed with, and with it the
gate it was admitted through and the backend it was sent to.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from slm_server.contracts.applied_registry import Retiring
from slm_server.registry.schema import ModelSpec
from slm_server.router.call.admission import Gate
from slm_server.router.dispatch.choice import Choice
from slm_server.router.dispatch.lookup import Registry
from slm_server.router.intake.reception import Reception
from slm_server.router.ondemand.loader import Loader
from slm_server.router.reload.retirements import Retirements
from slm_server.router.upstream.client import Transport
from slm_server.router.watchdog.tripwire import Tripwire


@dataclass(frozen=True)
class Change:
    """What a rewiring did, by role: backends added, removed, replaced (a new
    process for the role) and kept (their router-only settings may have changed)."""

    added: tuple[str, ...]
    removed: tuple[str, ...]
    replaced: tuple[str, ...]
    kept: tuple[str, ...]


def gate_for(spec: ModelSpec) -> Gate:
    """A new admission gate, sized by ``spec``'s entry."""
    return Gate(spec.entry.id, spec.entry.max_concurrency, spec.entry.max_queue)


@dataclass(frozen=True)
class Rewire:
    """The parts of one router that follow its registry."""

    registry: Registry
    gates: dict[str, Gate]
    choice: Choice
    reception: Reception
    loader: Loader
    upstream: Transport
    tripwire: Tripwire
    retirements: Retirements

    def apply(self, models: Sequence[ModelSpec], retiring: Sequence[Retiring]) -> Change:
        """Route by ``models`` from now on; ``retiring`` are the backends the reload
        retires that the router has not seen before (each role among them gets a new
        gate)."""
        gates = self.gates
        renewed = {r.role for r in retiring}
        self.registry.replace(models)
        added: list[str] = []
        replaced: list[str] = []
        kept: list[str] = []
        for spec in self.registry.enabled:
            gate = gates.get(spec.role)
            if gate is None:
                added.append(spec.role)
            elif spec.role in renewed:
                replaced.append(spec.role)
                self.retirements.hold(spec.role, gate)
            else:
                kept.append(spec.role)
                gate.resize(spec.entry.id, spec.entry.max_concurrency, spec.entry.max_queue)
                continue
            gates[spec.role] = gate_for(spec)
        roles = {spec.role for spec in self.registry.enabled}
        removed = [role for role in gates if role not in roles]
        for role in removed:
            self.retirements.hold(role, gates.pop(role))
        for role in (*replaced, *removed):
            self.tripwire.streaks.reset(role)  # a new backend, or none: nothing to judge
        self.choice.follow()
        self.reception.forget_rules()
        self.loader.follow()
        self.upstream.retarget(self.registry.enabled)
        return Change(tuple(added), tuple(removed), tuple(replaced), tuple(kept))


__all__ = ["Change", "Rewire", "gate_for"]
