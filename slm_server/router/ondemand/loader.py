"""Loading on demand, the router's side: requests for an unloaded ``load: on_demand``
model wait (holding their admission slot, within their deadline) while one planner
task makes room and asks the supervisor to load it; idle models are unloaded at their
``idle_ttl``; ``POST /v1/models/load`` and ``/unload`` go through the same planner.

The router decides, because only it knows what is in flight and queued: the supervisor
carries out (:mod:`slm_server.contracts.commands`) and publishes the result in the state file,
which the planner reads every ``POLL_SECONDS`` while anything is loading, unloading or
waiting. Before a model is unloaded its gate is paused, in the same step as the check
that it is idle, so no request can be admitted to a process that is about to stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from slm_server.contracts.commands import Command, CommandError, Reply
from slm_server.contracts.records import HOLDING_STATES as HOLDING
from slm_server.contracts.records import BackendState
from slm_server.errors import BackendUnavailable, ModelNotFound
from slm_server.registry.schema import ModelSpec
from slm_server.router.call.admission import Gate
from slm_server.router.call.backend_state import StateSource, given_up
from slm_server.router.call.periodic import Periodic
from slm_server.router.call.waits import ClientWatch, Waits, running_loop
from slm_server.router.dispatch.lookup import Registry
from slm_server.router.ondemand.memory_fit import Holder, Room, Rules, make_room
from slm_server.router.ondemand.memory_pressure import refusal_reason
from slm_server.router.ondemand.pressure_watch import PressureWatch
from slm_server.router.upstream.client import RETRY_AFTER_SECONDS

log = logging.getLogger("slm_server.router")

POLL_SECONDS = 0.02  # the state file, while a load or unload is under way
IDLE_POLL_SECONDS = 1.0  # otherwise (idle TTLs)
PLAN_FAILED = "the on-demand planner failed a turn"
# States in which a load that was asked for has failed.
LOAD_FAILED = frozenset({"restarting", "abandoned", "failed", "stopped"})
LAUNCHING = frozenset({"loading", "starting"})  # an unload refused in these is asked again
# States in which the model's process is gone: what an asked unload waits for.
GONE = frozenset({"unloaded", "stopped", "abandoned", "failed"})
UNLOAD_WAIT_SECONDS = 60.0  # bound on waiting for an asked unload to be published
# The supervisor publishes a load at once: one the file still says nothing of after this
# long is taken as gone, and asked for again if anyone waits.
LOAD_UNSEEN_SECONDS = 2.0

Commander = Callable[[Command], Awaitable[Reply]]


class Clock(Protocol):
    def __call__(self) -> float: ...


@dataclass
class Waiting:
    """The requests waiting for one model to be ready."""

    since: float
    futures: list[asyncio.Future[None]] = field(default_factory=list)
    why: str = ""  # why it does not load yet, for the answer when the deadline passes


@dataclass
class Model:
    """What the planner keeps about one on-demand model: its entry and admission gate
    (both replaced when a reload changes them), and its load's progress."""

    spec: ModelSpec
    gate: Gate
    waiting: Waiting | None = None
    load_sent_at: float | None = None
    load_seen: bool = False  # the state file has shown the load asked for
    last_load_seconds: float | None = None  # how long its last load took, as seen here
    # When waiters last gave up (their deadlines passed) and since when they had waited:
    # the next ones carry the age on, so a model whose deadline is shorter than the
    # aging still ages.
    gave_up_at: float | None = None
    wanted_since: float | None = None
    unload_sent: bool = False
    draining: bool = False
    # The role of the waiter this model is drained for (its gate paused until it is
    # idle and can be evicted): resumed when that waiter no longer needs the room.
    drained_for: str | None = None
    ready_seen_at: float | None = None  # router clock when it was first seen ready
    # How many planner turns have seen it gone (:data:`GONE`): an unload by request
    # that began after one of them knows its process went even when the state was
    # "unloaded" only between two of its own looks (a waiting request loads it again
    # within one turn).
    gone_seen: int = 0
    # The idle TTL a client set for the process loaded now (Ollama's ``keep_alive``):
    # seconds, ``inf`` to keep it; None: the entry's ``idle_ttl``.
    keep_alive: float | None = None

    @property
    def idle_ttl(self) -> float | None:
        """The idle TTL in force: the client's, else the entry's (None: kept)."""
        ttl = self.spec.entry.idle_ttl if self.keep_alive is None else self.keep_alive
        return None if ttl is None or ttl == math.inf else ttl


class Loader:
    """The planner for every ``load: on_demand`` model of one router."""

    def __init__(
        self,
        registry: Registry,
        states: StateSource,
        gates: Mapping[str, Gate],
        rules: Rules,
        commander: Commander,
        waits: Waits,
        *,
        drain_seconds: float = 30.0,
        pressure: PressureWatch | None = None,
        clock: Clock = time.monotonic,
        wall: Clock = time.time,
    ) -> None:
        self.registry = registry
        self.states = states
        self.gates = gates
        self.rules = rules
        self.commander = commander
        self.waits = waits
        self.drain_seconds = drain_seconds
        self.clock = clock
        self.wall = wall
        self.models = {
            spec.role: Model(spec, gates[spec.role])
            for spec in registry.enabled
            if spec.entry.load == "on_demand"
        }
        self._planner = Periodic(
            self._turn,
            after_failure=lambda: POLL_SECONDS,
            log=log,
            failure=PLAN_FAILED,
            wakeable=True,
        )
        self._started = False
        self.pressure = pressure
        if pressure is not None:
            pressure.bind(self.holders, self.wake)

    # -- the request path -----------------------------------------------------------

    def on_demand(self, spec: ModelSpec) -> bool:
        return spec.role in self.models

    def keep_alive(self, spec: ModelSpec, seconds: float | None) -> None:
        """Keep ``spec``'s on-demand model loaded ``seconds`` after its last request
        (Ollama's ``keep_alive``: 0 unloads it once idle, ``inf`` keeps it), until it is
        unloaded; None: its entry's ``idle_ttl`` again."""
        model = self.models.get(spec.role)
        if model is None:
            return
        state = self.state_of(spec)
        if state is None or state.state in GONE:
            return  # no process to keep: the next one starts with its entry's TTL
        model.keep_alive = seconds
        if seconds is not None and seconds != math.inf:
            self.wake()  # the planner looks at once: 0 unloads it when it is idle

    def state_of(self, spec: ModelSpec) -> BackendState | None:
        return self.states.get(spec.role, spec.entry.port)

    async def until_ready(self, spec: ModelSpec, client: ClientWatch, until: float) -> None:
        """Return once ``spec``'s backend is ready, loading it if it must; raises 503
        when it cannot be loaded (with why) or when ``until`` (loop time) passes."""
        state = self.state_of(spec)
        model = self.models[spec.role]
        if state is not None and state.state == "ready" and not model.unload_sent:
            return
        if not self.states.launcher_alive():
            raise BackendUnavailable(
                f"'{spec.entry.id}' is loaded on demand, and the supervisor that loads it "
                "is not running",
                code="supervisor_not_running",
                retry_after=RETRY_AFTER_SECONDS,
            )
        waiting = model.waiting
        if waiting is None:
            now = self.clock()
            since = now
            recent = (
                model.gave_up_at is not None and now - model.gave_up_at < self.rules.aging_seconds
            )
            if recent and model.wanted_since is not None:
                since = model.wanted_since
            waiting = model.waiting = Waiting(since)
        future: asyncio.Future[None] = running_loop().create_future()
        waiting.futures.append(future)
        self.wake()
        try:
            await self.waits.run(client, future, until)
        except TimeoutError:
            code = "insufficient_memory" if waiting.why else "model_loading"
            why = waiting.why or "it is still loading"
            raise BackendUnavailable(
                f"'{spec.entry.id}' was not ready within the request's deadline: {why}",
                code=code,
                retry_after=RETRY_AFTER_SECONDS,
            ) from None
        finally:
            with contextlib.suppress(ValueError):
                waiting.futures.remove(future)
            if not waiting.futures and model.waiting is waiting:
                model.waiting = None
                model.gave_up_at, model.wanted_since = self.clock(), waiting.since
                self.wake()

    # -- the planner ----------------------------------------------------------------

    def wake(self) -> None:
        self._planner.wake()

    def follow(self) -> None:
        """The registry and the gates were replaced (a reload): plan for the on-demand
        models of the new one. A model that stays keeps what the planner knows of it
        (a load or an unload under way goes on) with its new entry and gate; a new one
        starts unknown. Requests waiting for a model that left are answered: with 404
        when the registry no longer has it, and let through when it stays but is no
        longer loaded on demand (its backend is started by the supervisor)."""
        wanted = {
            spec.role: spec for spec in self.registry.enabled if spec.entry.load == "on_demand"
        }
        for role, model in list(self.models.items()):
            spec = wanted.get(role)
            if spec is not None:
                if spec.entry != model.spec.entry:
                    model.keep_alive = None  # the entry changed: its own TTL again
                model.spec, model.gate = spec, self.gates[role]
                continue
            del self.models[role]
            waiting, model.waiting = model.waiting, None
            kept = role in self.gates
            for future in waiting.futures if waiting is not None else ():
                if future.done():
                    continue
                if kept:
                    future.set_result(None)
                else:
                    future.set_exception(
                        ModelNotFound(
                            f"The model '{model.spec.entry.id}' was removed from the registry "
                            "by a reload",
                            param="model",
                        )
                    )
                    future.exception()  # retrieved here: a waiter that left never reads it
        for role, spec in wanted.items():
            if role not in self.models:
                self.models[role] = Model(spec, self.gates[role])
        if self._started:
            self.start()
        self.wake()

    def start(self) -> None:
        """Run the planner on the current loop (nothing to plan without an on-demand
        model: a reload that adds one starts it then)."""
        self._started = True
        if self.models:
            self._planner.start()

    async def stop(self) -> None:
        await self._planner.stop()

    async def _turn(self) -> float:
        """One turn of the planner; sooner again when it is busy."""
        return POLL_SECONDS if await self.plan() else IDLE_POLL_SECONDS

    def _last_used(self, role: str) -> float:
        """When (router clock) the model last finished a request, or became ready if
        that was later: what its idle TTL and the swap hold count from."""
        model = self.models.get(role)
        last = (model.gate if model is not None else self.gates[role]).last_release
        if model is not None and model.ready_seen_at is not None:
            last = max(last, model.ready_seen_at)
        return last

    def holders(self) -> list[Holder]:
        """Every model holding memory now (see :meth:`_holders`)."""
        return self._holders({spec.role: self.state_of(spec) for spec in self.registry.enabled})

    def _holders(self, states: Mapping[str, BackendState | None]) -> list[Holder]:
        """Every model holding memory: as published, and the ones this router just
        asked to load (the state file may not show it yet)."""
        holders: list[Holder] = []
        for spec in self.registry.enabled:
            state = states.get(spec.role)
            model = self.models.get(spec.role)
            asked = model is not None and model.load_sent_at is not None
            if state is None or (state.state not in HOLDING and not asked):
                continue
            gate = self.gates[spec.role]
            last = self._last_used(spec.role)
            unloading = state.state == "unloading" or (model is not None and model.unload_sent)
            holders.append(
                Holder(
                    spec.role,
                    spec.entry.id,
                    state.footprint_mb or 0,
                    on_demand=model is not None,
                    # A load API call waits without a slot: it is busy all the same.
                    in_flight=gate.active
                    + (len(model.waiting.futures) if model and model.waiting else 0),
                    queued=gate.queued,
                    last_used=last,
                    unloading=unloading,
                    draining=model is not None and model.draining,
                )
            )
        return holders

    async def plan(self) -> bool:
        """One turn: settle waiters, make room and load, unload the idle; whether
        anything is under way (to look again soon)."""
        now = self.clock()
        states = {spec.role: self.state_of(spec) for spec in self.registry.enabled}
        busy = False
        for role, model in self.models.items():
            busy = self._observe(model, states.get(role), now) or busy
        await self._relieve_pressure(states)
        await self._load_the_waiting(states, now)
        self._release_drained()
        await self._drop_unwanted_loads(states, now)
        await self._expire_idle(states, now)
        return busy

    def _observe(self, model: Model, state: BackendState | None, now: float) -> bool:
        """What ``model``'s state says of its load, its drain and its waiters; whether
        it is under way (loading, unloading, or waited for)."""
        name = state.state if state is not None else "unloaded"
        if name in GONE:
            model.gone_seen += 1
            model.keep_alive = None  # a client's TTL was for the process that went
        if name == "ready" and model.ready_seen_at is None:
            model.ready_seen_at = now
        if name != "ready":
            model.ready_seen_at = None
        if name in ("unloaded", "stopped") or state is None:
            model.unload_sent = False
            model.drained_for = None
            if model.draining:
                model.draining = False
                model.gate.resume()
        if model.load_sent_at is not None and name != "unloaded":
            model.load_seen = True  # loading, or already unloading again
        if model.load_sent_at is not None and name in ("ready", *LOAD_FAILED):
            if name == "ready":
                model.last_load_seconds = now - model.load_sent_at
                model.gave_up_at = model.wanted_since = None
            model.load_sent_at = None
            model.load_seen = False
            if name != "ready":
                exit = state.last_exit if state is not None else None
                why = f"{exit} while loading" if exit else (state and state.reason) or name
                self._fail(model, f"its load failed: {why}", "load_failed")
        elif (
            model.load_sent_at is not None
            and name == "unloaded"
            and (model.load_seen or now - model.load_sent_at > LOAD_UNSEEN_SECONDS)
        ):
            # Unloaded while loading (by hand, or nobody waited), or a load the
            # state file never showed (it came and went between two looks):
            # whoever still waits asks for a load again below.
            model.load_sent_at = None
            model.load_seen = False
        if model.waiting is not None and model.load_sent_at is None and state is not None:
            # Given up on while it served (no load of ours under way): it will not
            # become ready by itself, and a load is not taken in that state, so
            # nobody waits for it to their deadline.
            refusal = given_up(f"The backend for '{model.spec.entry.id}'", state)
            if refusal is not None:
                self._refuse(model, refusal)
        waiting = model.waiting
        if waiting is not None and name == "ready" and not model.unload_sent:
            for future in waiting.futures:
                if not future.done():
                    future.set_result(None)
            model.waiting = None
        return name in ("loading", "unloading") or model.waiting is not None

    async def _load_the_waiting(self, states: dict[str, BackendState | None], now: float) -> None:
        """Load the models requests wait for, oldest first, as memory allows; only the
        oldest may evict or drain others to make room (no starvation)."""
        queue = sorted(
            (m for m in self.models.values() if m.waiting is not None),
            key=lambda m: m.waiting.since if m.waiting is not None else 0.0,
        )
        first = True
        for model in queue:
            role = model.spec.role
            state = states.get(role)
            name = state.state if state is not None else "unloaded"
            waiting = model.waiting
            if waiting is None or model.load_sent_at is not None:
                continue
            if name not in ("unloaded", "stopped"):
                continue  # loading, or unloading first: look again next turn
            pressure = self.pressure
            if pressure is not None and pressure.below:
                why = refusal_reason(pressure.free_mb, pressure.floor)
                self._fail(model, why, "insufficient_memory")
                continue
            footprint = state.footprint_mb if state is not None else None
            room = make_room(
                role, footprint or 0, waiting.since, self._holders(states), self.rules, now
            )
            if room.impossible:
                self._fail(model, room.why, "insufficient_memory", retry=False)
                continue
            if room.load:
                await self._load(model)
                states[role] = self.state_of(model.spec)
                continue
            waiting.why = room.why
            if first:
                await self._make_room(model, waiting, room, now)
            first = False

    async def _make_room(self, model: Model, waiting: Waiting, room: Room, now: float) -> None:
        """Evict and drain what stands in the way of ``model``'s load (``waiting``: its
        waiters)."""
        role = model.spec.role
        for victim in room.evict:
            evicted = self.models.get(victim)  # (a reload may have removed it)
            if evicted is not None:
                await self._unload(evicted, "evicted", model.spec.entry.id)
        for role_in_way in room.drain:
            other = self.models.get(role_in_way)
            if other is not None and not other.draining:
                other.draining = True
                other.drained_for = role
                other.gate.pause()
                log.info(
                    "draining %s to make room for %s (waiting %.1fs)",
                    other.spec.entry.id,
                    model.spec.entry.id,
                    now - waiting.since,
                )

    async def _relieve_pressure(self, states: Mapping[str, BackendState | None]) -> None:
        """Unload the idle models the pressure watch's last reading asks to evict
        (each checked idle again as its gate is paused: a request may have come)."""
        if self.pressure is None:
            return
        for role in self.pressure.take_evictions():
            model = self.models.get(role)  # (a reload may have removed it)
            if model is None or model.unload_sent:
                continue
            state = states.get(role)
            footprint = state.footprint_mb if state is not None else None
            if await self._unload(model, "pressure"):
                entry = model.spec.entry
                self.pressure.evicted(role, entry.id, entry.port, footprint or 0)

    def _release_drained(self) -> None:
        """Resume a model drained for a waiter that no longer needs its room (it gave
        up or left, or is loading with room found elsewhere): nothing would unload it
        for that waiter any more, and its own requests would queue to their deadlines
        behind a gate paused for nobody."""
        for model in self.models.values():
            wanted = model.drained_for
            if wanted is None or model.unload_sent:
                continue
            waiter = self.models.get(wanted)
            if waiter is not None and waiter.waiting is not None and waiter.load_sent_at is None:
                continue  # still waiting for the room
            model.drained_for = None
            if model.draining:
                model.draining = False
                model.gate.resume()
                log.info("no longer draining %s: nothing waits for its room", model.spec.entry.id)

    async def _drop_unwanted_loads(
        self, states: Mapping[str, BackendState | None], now: float
    ) -> None:
        """A load whose waiters have all left goes on when it is near done (past half
        of the time this model's last load took, or its first: nothing to judge by);
        otherwise it is stopped, and the memory it was taking is free again."""
        for role, model in list(self.models.items()):  # a reload may change them
            state = states.get(role)
            started, took = model.load_sent_at, model.last_load_seconds
            if model.waiting is not None or started is None or took is None:
                continue
            if state is None or state.state != "loading" or now - started >= took / 2:
                continue
            if await self._unload(model, "no_waiter"):
                model.load_sent_at = None
                log.info("stopped loading %s: every request for it left", model.spec.entry.id)

    async def _expire_idle(self, states: Mapping[str, BackendState | None], now: float) -> None:
        for role, model in list(self.models.items()):  # a reload may change them
            ttl = model.idle_ttl
            state = states.get(role)
            if ttl is None or state is None or state.state != "ready" or model.unload_sent:
                continue
            gate = model.gate
            last = self._last_used(role)
            if gate.idle and model.waiting is None and now - last >= ttl:
                await self._unload(model, "idle_ttl")

    def _fail(self, model: Model, why: str, code: str, retry: bool = True) -> None:
        error = BackendUnavailable(
            f"'{model.spec.entry.id}' cannot be served: {why}",
            code=code,
            retry_after=RETRY_AFTER_SECONDS if retry else None,
        )
        self._refuse(model, error)

    def _refuse(self, model: Model, error: BackendUnavailable) -> None:
        """Answer every request waiting for ``model`` with ``error``."""
        waiting, model.waiting = model.waiting, None
        if waiting is None:
            return
        for future in waiting.futures:
            if not future.done():
                future.set_exception(error)
                future.exception()  # retrieved here: a waiter that left never reads it

    async def _load(self, model: Model) -> None:
        model.load_sent_at = self.clock()
        model.load_seen = False
        reply = await self._send(Command("load", model.spec.role))
        if reply is None or not reply.ok:
            model.load_sent_at = None
            if reply is None:
                why = "the supervisor cannot be reached (is `backends` running?)"
            else:
                why = reply.error or "the supervisor refused"
            self._fail(model, f"it could not be loaded: {why}", "load_failed")

    async def _unload(self, model: Model, reason: str, for_model: str | None = None) -> bool:
        """Pause the model's gate (while it is still idle: no await in between) and ask
        for its process to go; False when it was not idle or the supervisor refused."""
        gate = model.gate
        if reason != "api" and not (gate.idle or (model.draining and gate.active == 0)):
            return False
        reply = await self._ask_unload(model, reason, for_model)
        return reply is not None and reply.ok

    async def _ask_unload(
        self, model: Model, reason: str, for_model: str | None = None
    ) -> Reply | None:
        """Pause the model's gate and ask for its process to go: the supervisor's reply
        (None when it cannot be reached). A refusal resumes the gate unless the model is
        draining."""
        gate = model.gate
        gate.pause()
        model.unload_sent = True
        model.keep_alive = None  # the client's TTL was for the process that goes
        reply = await self._send(Command("unload", model.spec.role, reason, for_model))
        if reply is None or not reply.ok:
            model.unload_sent = False
            if not model.draining:
                gate.resume()
            return reply
        model.draining = True  # resumed once it is unloaded
        return reply

    async def _unload_by_request(self, model: Model, until: float) -> bool:
        """Ask for ``model``'s unload until it is taken: a load still launching (no
        process yet) refuses it for a moment, so it is asked again every
        ``POLL_SECONDS`` until ``until`` (router clock); gone meanwhile counts as
        taken. False when refused otherwise."""
        while True:
            reply = await self._ask_unload(model, "api")
            if reply is not None and reply.ok:
                return True
            if reply is None or reply.state not in LAUNCHING or self.clock() >= until:
                return False
            state = self.state_of(model.spec)
            if state is None or state.state in GONE:
                return True
            await asyncio.sleep(POLL_SECONDS)

    async def _send(self, command: Command) -> Reply | None:
        try:
            return await self.commander(command)
        except CommandError as exc:
            log.warning("cannot %s %s: %s", command.op, command.role, exc)
            return None

    # -- the API ----------------------------------------------------------------------

    async def load(self, spec: ModelSpec, client: ClientWatch) -> None:
        """``POST /v1/models/load``: ready within the model's ``default_timeout``."""
        until = running_loop().time() + spec.entry.default_timeout
        await self.until_ready(spec, client, until)

    async def unload(self, spec: ModelSpec) -> None:
        """``POST /v1/models/unload``: stop admitting, let what is in flight finish
        (up to the drain timeout), then stop the process and wait until it is gone."""
        model = self.models[spec.role]
        gate = model.gate
        gate.pause()
        model.draining = True
        model.drained_for = None  # drained by request now: not the planner's to resume
        deadline = self.clock() + self.drain_seconds
        while gate.active > 0 and self.clock() < deadline:
            await asyncio.sleep(POLL_SECONDS)
        stop_at = self.clock() + UNLOAD_WAIT_SECONDS
        # A load the planner has asked for that the state file does not show yet: wait
        # until it shows (or is taken as lost), so that it is stopped, not answered
        # "unloaded" just before it starts.
        while model.load_sent_at is not None and not model.load_seen and self.clock() < stop_at:
            self.wake()
            await asyncio.sleep(POLL_SECONDS)
        state = self.state_of(spec)
        seen = model.gone_seen  # read with the state: a later turn saw it after this
        loaded = state is not None and state.state in HOLDING and state.state != "unloading"
        if loaded and not await self._unload_by_request(model, stop_at):
            gate.resume()
            model.draining = False
            raise BackendUnavailable(
                f"'{spec.entry.id}' could not be unloaded (the supervisor refused)",
                code="unload_failed",
            )
        if loaded:
            # Whoever waits for this load is told now, not left to see it vanish.
            self._fail(model, "it was unloaded by request (POST /v1/models/unload)", "unloaded")
        self.wake()  # the planner looks at once, and then every POLL_SECONDS
        while self.clock() < stop_at:
            state = self.state_of(spec)
            if state is None or state.state in GONE or model.gone_seen > seen:
                break
            await asyncio.sleep(POLL_SECONDS)
        self.wake()

    def status(self, spec: ModelSpec) -> dict[str, Any]:
        """The ``status`` object of ``/v1/models``."""
        state = self.state_of(spec)
        gate = self.gates.get(spec.role)
        name = state.state if state is not None else ("unloaded" if self.on_demand(spec) else None)
        entry = spec.entry
        ttl_remaining = None
        model = self.models.get(spec.role)
        ttl = model.idle_ttl if model is not None else entry.idle_ttl
        if ttl is not None and name == "ready" and gate is not None and gate.idle:
            last = self._last_used(spec.role)
            ttl_remaining = round(max(0.0, ttl - (self.clock() - last)), 1)
        last_used_at = None
        if gate is not None:
            last_used_at = round(self.wall() - (self.clock() - gate.last_release), 3)
        return {
            "state": name,
            "load": entry.load,
            "memory_mb": {
                "estimate": state.memory_estimate_mb if state is not None else None,
                "measured": state.memory_measured_mb if state is not None else None,
                "admitted_as": state.footprint_mb if state is not None else entry.memory_mb,
                "prompt_cache": state.prompt_cache_mb if state is not None else None,
                "resident": state.memory_resident_mb if state is not None else None,
                "budget": self.rules.budget_mb,
            },
            "slot_cache": {
                "tokens": state.slot_cache_tokens if state is not None else None,
                "skip": state.slot_cache_skip if state is not None else None,
            },
            "loaded_at": state.loaded_at if state is not None else None,
            "last_used_at": last_used_at,
            "idle_ttl": ttl,
            "idle_ttl_remaining": ttl_remaining,
        }


__all__ = ["Loader"]
