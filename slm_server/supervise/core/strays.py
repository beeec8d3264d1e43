"""Which process on a backend's port may be killed. Pure.

Only one that is verifiably ours: its pid *and* create time match a process we started
(a reused pid never matches), or its arguments are exactly those of a launch of ours
(the same model, port and flags). Anything else is left alive, however inconvenient.
"""

from __future__ import annotations

from collections.abc import Sequence

from slm_server.contracts.records import CREATE_TIME_TOLERANCE


def verifiably_ours(
    pid: int | None,
    create_time: float | None,
    argv: Sequence[str],
    started: Sequence[tuple[int, float]],
    launch_argv: Sequence[str],
) -> bool:
    """True when the process ``pid`` (created at ``create_time``, running ``argv``) is
    one of ``started`` (pid, create time) or runs ``launch_argv``'s exact arguments."""
    if pid is None:
        return False
    if create_time is not None and any(
        pid == known_pid and abs(create_time - known_time) <= CREATE_TIME_TOLERANCE
        for known_pid, known_time in started
    ):
        return True
    args = list(launch_argv[1:])
    return bool(args) and list(argv[-len(args) :]) == args
