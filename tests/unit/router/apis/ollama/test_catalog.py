"""When ``GET /api/ps`` says a loaded on-demand model unloads (``expires_at``): for
every ``keep_alive`` Ollama's API takes, a time, never a failure."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from slm_server.router.apis.ollama.catalog import FOREVER, _expiry
from slm_server.router.apis.ollama.options import keep_alive_seconds


def status(ttl: Any, remaining: Any = None, load: str = "on_demand") -> dict[str, Any]:
    return {"state": "ready", "load": load, "idle_ttl": ttl, "idle_ttl_remaining": remaining}


def test_a_model_kept_for_good_never_expires() -> None:
    assert _expiry(status(None, load="always")) == FOREVER
    assert _expiry(status(None)) == FOREVER
    assert _expiry(status(keep_alive_seconds(-1))) == FOREVER


def test_an_idle_model_expires_when_its_ttl_runs_out() -> None:
    found = datetime.fromisoformat(_expiry(status(600, 120)).replace("Z", "+00:00"))
    expected = datetime.now(UTC) + timedelta(seconds=120)
    assert abs((found - expected).total_seconds()) < 5


@pytest.mark.parametrize("keep_alive", ["2562047h", "300000000h", 10**12, 1e300, "1e308"])
def test_any_keep_alive_the_api_takes_has_an_expiry(keep_alive: Any) -> None:
    seconds = keep_alive_seconds(keep_alive)
    assert seconds is not None and seconds > 0
    found = _expiry(status(seconds))
    assert found.endswith("Z") and found >= "2318"
