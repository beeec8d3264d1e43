"""Footprints (:mod:`slm_server.supervise.shell.footprints`) in process, on the fake process
layer: what is expected of an entry, which backends are measured again, and what is
remembered across runs (a failed write reported once)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from slm_server.contracts.states import State
from slm_server.supervise.core.observations import Measured
from slm_server.supervise.shell.footprints import Expected
from tests.unit.supervise.fakes import PROMPT_CACHE_MB, events, make, serving, until


def test_an_entry_is_expected_at_what_an_earlier_run_measured(tmp_path: Path) -> None:
    supervisor, _control = make(tmp_path)
    spec = supervisor.registry.models[0]
    first = supervisor.footprints.expect(spec)
    assert first.key is not None and first.remembered_mb is None
    supervisor.footprints.store.put(first.key, 777)
    again, _control = make(tmp_path)
    assert again.footprints.expect(spec) == Expected(
        first.key, first.estimate_mb, 777, PROMPT_CACHE_MB
    )


def test_only_ready_live_backends_are_measured_again(tmp_path: Path) -> None:
    supervisor, control = make(tmp_path, ("a", "b", "c"))

    async def scenario() -> None:
        supervisor.start()
        control.health[8603] = None  # c never answers: still starting
        await until(
            supervisor,
            lambda: all(supervisor.backends[r].life.state is State.READY for r in "ab"),
            "a and b ready",
        )
        for role, mb in (("a", 300), ("c", 400)):  # b: no figure (gone)
            control.resident[control.child(role).pid] = mb
        measured = supervisor.footprints.measure(supervisor.backends.values())
        admitted = supervisor.backends["a"].footprint_mb
        assert measured == [Measured("a", 300, admitted, PROMPT_CACHE_MB)]
        await supervisor.stop_all()

    asyncio.run(scenario())


def test_a_footprint_is_remembered_and_a_failed_write_reported_once(tmp_path: Path) -> None:
    supervisor, _control = make(tmp_path)

    async def scenario() -> None:
        await serving(supervisor)
        backend = supervisor.backends["a"]
        footprints = supervisor.footprints
        footprints.remember(backend, 500)
        assert backend.footprint_key is not None
        assert make(tmp_path)[0].footprints.store.get(backend.footprint_key) == 500
        store = footprints.store.path
        store.unlink()
        store.mkdir()  # every write fails from now on
        footprints.remember(backend, 600)
        footprints.remember(backend, 700)
        await supervisor.stop_all()

    asyncio.run(scenario())
    [failed] = events(supervisor, "state_write_failed")
    assert failed["path"] == str(supervisor.settings.footprints_path)


def test_a_disabled_entry_expects_nothing(tmp_path: Path) -> None:
    supervisor, control = make(tmp_path, ("a", "b"), fields={"enabled": False})
    supervisor.start()
    assert all(b.footprint_mb is None for b in supervisor.backends.values())
    assert all(b.life.state is State.DISABLED for b in supervisor.backends.values())
    assert control.children == []
