"""Signalling and stopping a fake started in a process group of its own (the fakes'
``start()`` uses ``start_new_session=True``)."""

from __future__ import annotations

import os
import signal
import subprocess
from contextlib import suppress
from types import TracebackType
from typing import Self


def signal_group(process: subprocess.Popen[bytes], sig: int) -> None:
    """Send ``sig`` to ``process``'s group, unless it has been reaped (then its group id
    could belong to another process)."""
    if process.poll() is None:
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, sig)


def stop_group(process: subprocess.Popen[bytes], timeout: float) -> None:
    """SIGTERM (and SIGCONT, in case a test left it stopped), then SIGKILL after
    ``timeout``; always reaps."""
    if process.poll() is None:
        signal_group(process, signal.SIGTERM)
        signal_group(process, signal.SIGCONT)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            signal_group(process, signal.SIGKILL)
            process.wait()


class StopsOnExit:
    """A fake used as a context manager: stopped when the block ends."""

    def stop(self, timeout: float = 5.0) -> str:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


__all__ = ["StopsOnExit", "signal_group", "stop_group"]
