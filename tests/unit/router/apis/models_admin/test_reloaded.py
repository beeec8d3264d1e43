"""What the reload after an add came to, for the command line and the API alike."""

from __future__ import annotations

import asyncio

from slm_server.add.reload import NOT_RUNNING, Reloaded, reload_gateway
from slm_server.contracts.commands import Command, CommandError, Reply


def test_an_applied_reload_says_what_changed() -> None:
    reply = Reply(True, version="v", generation=3, added=("b",), unchanged=("a",))
    out, err = Reloaded(reply).lines()
    assert out == [
        "registry version v (generation 3) in force",
        "  added: b",
        "  removed: -",
        "  replaced: -",
        "  unchanged: a",
    ]
    assert err == []
    assert Reloaded(reply).as_json() == {
        "reloaded": True,
        "version": "v",
        "generation": 3,
        "added": ["b"],
        "removed": [],
        "replaced": [],
        "unchanged": ["a"],
    }


def test_a_refused_or_missing_reload_says_why() -> None:
    refused = Reloaded(Reply(False, error="bad", problems=("p1", "p2"), refused="invalid"))
    assert refused.lines() == (
        [],
        ["reload refused (invalid): nothing was changed", "  p1", "  p2"],
    )
    assert refused.as_json()["problems"] == ["p1", "p2"]
    assert refused.as_json()["reloaded"] is False
    assert Reloaded(None, NOT_RUNNING).as_json() == {"reloaded": False, "reason": NOT_RUNNING}

    async def unreachable(_command: Command) -> Reply:
        raise CommandError("no socket")

    missing = asyncio.run(reload_gateway(unreachable))
    assert missing.reply is None and not missing.applied
    assert (
        missing.skipped is not None and "no running gateway answered (no socket)" in missing.skipped
    )
