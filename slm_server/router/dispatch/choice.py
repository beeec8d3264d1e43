"""Choosing the backend that serves a request: among the replicas of the entry its
``model`` names, those the supervisor says can serve, as the entry's routing says
(:mod:`~slm_server.router.dispatch.balance`, :mod:`~slm_server.router.dispatch.affinity`);
and the router's own refusal when none can (:meth:`Choice.down`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from slm_server.contracts.records import BackendState
from slm_server.errors import BackendUnavailable
from slm_server.registry.schema import ModelSpec
from slm_server.router.call.admission import Gate
from slm_server.router.call.backend_state import StateSource, awaits_reload, given_up
from slm_server.router.call.exchange import Exchange
from slm_server.router.dispatch.affinity import BLOCK_CHARS, request_hashes
from slm_server.router.dispatch.balance import Balancer, Routing
from slm_server.router.dispatch.lookup import Registry
from slm_server.router.upstream.client import RETRY_AFTER_SECONDS

BalancerShape = tuple[int, Routing, int]  # replicas, routing, affinity threshold
# Refusals of a backend that is (re)starting: a request for it waits instead, once
# admitted, when no other replica serves.
WAITED_FOR = frozenset({"backend_starting", "backend_restarting"})


class Choice:
    """The choice of a backend for one registry: a balancer per entry with replicas,
    the supervisor's published states, and whether a replica is one a reload started
    and has not yet seen ready (``awaited``, set by the orchestrator)."""

    def __init__(self, registry: Registry, states: StateSource, gates: Mapping[str, Gate]) -> None:
        self.registry = registry
        self.states = states
        self.gates = gates
        self.awaited: Callable[[ModelSpec], bool] = lambda _spec: False
        # One per entry with replicas, by the entry's position in the file.
        self.balancers: dict[int, Balancer] = {}
        self._balanced: dict[str, tuple[BalancerShape, Balancer]] = {}  # by the entry's role
        self.follow()

    def follow(self) -> None:
        """A balancer for each entry with replicas; an entry whose role, replica count
        and routing a reload left as they were keeps its own (what its prefix indexes
        learnt, and its turn)."""
        registry = self.registry
        balancers: dict[int, Balancer] = {}
        balanced: dict[str, tuple[BalancerShape, Balancer]] = {}
        for spec in registry.entries:
            size = registry.size(spec)
            if size == 1:
                continue
            entry = spec.entry
            shape = (size, entry.routing, entry.affinity_threshold)
            kept = self._balanced.get(spec.role)
            balancer = kept[1] if kept is not None and kept[0] == shape else Balancer(*shape)
            balancers[spec.index] = balancer
            balanced[spec.role] = (shape, balancer)
        self.balancers, self._balanced = balancers, balanced

    def choose(
        self, spec: ModelSpec, payload: dict[str, Any], exchange: Exchange, tried: list[str]
    ) -> ModelSpec:
        """The replica of ``spec``'s entry that serves this request: among those the
        supervisor says can serve (and that did not just refuse the connection), as
        the entry's routing says. With none, one that is (re)starting, which the
        request then waits for (:mod:`~slm_server.router.reload.readiness`); else the
        refusal of one that may come back soonest.
        Whether a replica can serve is :meth:`down`'s one decision: a replica
        with no process of its own would be judged there by whatever ejects it."""
        balancer = self.balancers.get(spec.index)
        # A spec routed before a reload is alone: its position may name another entry.
        group = self.registry.replicas(spec) if balancer is not None else (spec,)
        if balancer is None or len(group) == 1:
            refusal = self.down(spec)
            if refusal is not None and refusal.code not in WAITED_FOR:
                raise refusal
            return spec
        serving: list[int] = []
        refusals: list[BackendUnavailable] = []
        downs: list[int] = []  # the position of each refusal's replica
        for position, replica in enumerate(group):
            refusal = self.down(replica)
            if refusal is not None:
                refusals.append(refusal)
                downs.append(position)
                balancer.forget(position)
            elif replica.role not in tried:
                serving.append(position)
        if len(serving) > 1:  # one a reload started is waited for only if no other serves
            settled = [p for p in serving if not self.awaited(group[p])]
            serving = settled or serving
        if not serving:
            back = next((r for r, why in enumerate(refusals) if why.code in WAITED_FOR), None)
            if back is not None:  # none serves, one is coming back: wait for it
                chosen = group[downs[back]]
                exchange.spec = chosen
                return chosen
            if not refusals:
                raise BackendUnavailable(
                    f"No replica of '{spec.entry.id}' can be reached; retry shortly",
                    retry_after=1.0,
                )
            raise next((r for r in refusals if r.retry_after is not None), refusals[0])
        gates = self.gates
        outstanding = [gates[r.role].active + gates[r.role].queued for r in group]
        hashes = request_hashes(payload) if balancer.indexes else ()
        pick = balancer.choose(serving, outstanding, hashes)
        chosen = group[pick.position]
        exchange.spec = chosen
        exchange.routing_rule = pick.rule
        if balancer.indexes:
            exchange.prefix_match_chars = pick.matched_blocks * BLOCK_CHARS
        return chosen

    def refuse_if_down(self, spec: ModelSpec) -> None:
        """Answer for the supervisor when it says the backend cannot serve (see
        :meth:`down`)."""
        refusal = self.down(spec)
        if refusal is not None:
            raise refusal

    def down(self, spec: ModelSpec) -> BackendUnavailable | None:
        """Why the supervisor says the backend cannot serve, None when it can (or no
        supervisor says anything): abandoned or failed (503, with why), or
        (re)starting (503 with ``Retry-After``), a remote ejected (503 with
        ``Retry-After`` until its ejection ends). These are the router's own refusals,
        never counted against the backend. The router's view of the state file may
        be up to 20 ms old: a refusal is decided again on the file as it is now, so
        that a backend the supervisor has just published ready is not refused."""
        refusal = self._down(spec, self.states.get(spec.role, spec.entry.port))
        if refusal is None:
            return None
        return self._down(spec, self.states.current(spec.role, spec.entry.port))

    def _down(self, spec: ModelSpec, state: BackendState | None) -> BackendUnavailable | None:
        if state is None or not self.states.launcher_alive():
            return None
        name = f"The backend for '{spec.entry.id}'"
        size = self.registry.size(spec)
        if size > 1:
            name += f" (replica {spec.replica} of {size})"
        if state.state == "ejected":
            until = state.ejected_until
            wait = max(1.0, until - time.time()) if until is not None else RETRY_AFTER_SECONDS
            return BackendUnavailable(
                f"{name} is a remote the watchdog ejected: {state.reason or 'no reason recorded'}",
                code="backend_ejected",
                retry_after=round(wait, 1),
            )
        refusal = given_up(name, state)
        if refusal is not None:
            return refusal
        if state.state in ("starting", "restarting") and not awaits_reload(state):
            why = f" ({state.reason})" if state.reason else ""
            return BackendUnavailable(
                f"{name} is {state.state}{why}; retry shortly",
                code=f"backend_{state.state}",
                retry_after=RETRY_AFTER_SECONDS,
            )
        return None


__all__ = ["Choice"]
