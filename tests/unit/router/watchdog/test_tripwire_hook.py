"""The tripwire tells its ``on_failure`` hook about every failure verdict, and only those."""

from __future__ import annotations

from pathlib import Path

from slm_server.contracts.events import EventLog
from slm_server.contracts.verdicts import HEALTHY, STALLED, Outcome, classify_status
from slm_server.router.watchdog.tripwire import Tripwire
from slm_server.settings import WatchdogSettings
from tests.registry_entries import model_spec

SPEC = model_spec("alpha", "alpha")


def test_failure_verdicts_reach_the_hook(tmp_path: Path) -> None:
    heard: list[tuple[str, Outcome]] = []
    settings = WatchdogSettings.from_env({}, tmp_path)
    tripwire = Tripwire(
        settings,
        EventLog(tmp_path / "watchdog.jsonl"),
        on_failure=lambda spec, outcome: heard.append((spec.role, outcome)),
    )
    for outcome in (HEALTHY, classify_status(500), classify_status(299), STALLED):
        tripwire.observe(SPEC, outcome)
    assert heard == [("alpha", classify_status(500)), ("alpha", STALLED)]


def test_a_disabled_watchdog_hears_nothing(tmp_path: Path) -> None:
    heard: list[Outcome] = []
    settings = WatchdogSettings.from_env({"SLM_WATCHDOG_ENABLED": "false"}, tmp_path)
    tripwire = Tripwire(
        settings, EventLog(tmp_path / "w.jsonl"), on_failure=lambda _s, o: heard.append(o)
    )
    tripwire.observe(SPEC, classify_status(503))
    assert heard == []
