"""The launcher's signal handlers may be interrupted by another signal at any point and
still return: ``start.sh``'s Ctrl-C sends SIGINT to the process group and SIGTERM right
after, and the launcher once hung for good when the second handler ran while the first
held a lock.

A Python signal handler runs between two bytecodes of the main thread, within whatever
that thread was doing, including another handler. The test runs each handler with a
profile hook that, at every call inside it, runs a second handler there (once per call
point, not inside the second itself): what a signal landing at that point would do.
The whole is run in a thread so that a deadlock fails the test at once rather than
hanging it.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from slm_server.supervise.supervisor import Supervisor
from tests.unit.supervise.fakes import make

Handler = Callable[[int, FrameType | None], None]


def interrupted_everywhere(
    first: Handler, first_signal: int, second: Handler, second_signal: int
) -> int:
    """Run ``first`` with ``second`` run at each call inside it; how many times ``second``
    ran. Fails when the two do not return within 5 s."""
    landed = [0]
    done = threading.Event()
    failure: list[BaseException] = []

    def hook(_frame: FrameType, event: str, _arg: Any) -> None:
        if event not in ("call", "c_call") or nested.active:
            return
        nested.active = True
        try:
            landed[0] += 1
            second(second_signal, None)
        finally:
            nested.active = False

    nested = threading.local()
    nested.active = True  # not while the hook is being installed

    def run() -> None:
        try:
            sys.setprofile(hook)
            nested.active = False
            try:
                first(first_signal, None)
            finally:
                sys.setprofile(None)
        except BaseException as exc:  # reported to the test's thread
            failure.append(exc)
        finally:
            done.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert done.wait(5.0), "a handler interrupted by another never returned (deadlock)"
    assert not failure, failure
    return landed[0]


@pytest.fixture
def supervisor(tmp_path: Path) -> Supervisor:
    made, _control = make(tmp_path)
    return made


@pytest.mark.parametrize(
    ("first_signal", "second_signal"),
    [
        (signal.SIGINT, signal.SIGTERM),
        (signal.SIGTERM, signal.SIGINT),
        (signal.SIGINT, signal.SIGHUP),
        (signal.SIGHUP, signal.SIGTERM),
        (signal.SIGHUP, signal.SIGHUP),
    ],
)
def test_a_signal_handler_interrupted_anywhere_by_another_returns(
    supervisor: Supervisor, first_signal: int, second_signal: int
) -> None:
    def handler(signum: int) -> Handler:
        return supervisor.request_reload if signum == signal.SIGHUP else supervisor.request_stop

    landed = interrupted_everywhere(
        handler(first_signal), first_signal, handler(second_signal), second_signal
    )
    assert landed >= 3  # the second handler ran at several points inside the first
    stops = {first_signal, second_signal} - {signal.SIGHUP}
    assert supervisor.stopping.is_set() == bool(stops)
    assert supervisor.reload_asked.is_set() == (signal.SIGHUP in (first_signal, second_signal))
