"""The one module of ``launch`` that starts the agent: in a private directory made for
this run (``tempfile.mkdtemp``: mode 0700, its files 0600, removed when the agent has
exited), with its configuration over the caller's environment, in the caller's process
group so that it keeps the terminal.

Signals: Ctrl-C and Ctrl-\\ at the terminal reach the agent directly (the terminal
signals the whole foreground group), so they are not sent again; SIGINT and SIGQUIT from
elsewhere, and SIGTERM and SIGHUP, are passed on. ``launch`` waits for the agent and
exits with its status (128 + N when a signal N ended it). On Linux the agent is also
asked to receive SIGTERM should ``launch`` itself die (``PR_SET_PDEATHSIG``), so even a
``kill -9`` of it leaves no agent behind."""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from types import FrameType

from slm_server.cli.launch.agents import Invocation

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
# Sent by the terminal to its whole foreground group: the agent has them already.
FROM_THE_KEYBOARD = (signal.SIGINT, signal.SIGQUIT)
PR_SET_PDEATHSIG = 1


def write_private(directory: Path, files: Mapping[str, str]) -> None:
    """Each file into ``directory``, readable by its owner only, never over another."""
    for name, text in files.items():
        if Path(name).name != name:
            raise ValueError(f"not a plain file name: {name!r}")
        handle = os.open(directory / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)


def run_agent(
    program: str,
    build: Callable[[Path], Invocation],
    environ: Mapping[str, str] | None = None,
) -> int:
    """Build the agent's invocation for a fresh private directory, write its files,
    run ``program`` with its arguments and environment, and remove the directory; the
    agent's exit status."""
    private = Path(tempfile.mkdtemp(prefix="slm-launch-"))
    try:
        invocation = build(private)
        write_private(private, invocation.files)
        env = {**(os.environ if environ is None else environ), **invocation.env}
        return supervise([program, *invocation.argv[1:]], env)
    finally:
        shutil.rmtree(private, ignore_errors=True)


def supervise(argv: list[str], env: Mapping[str, str]) -> int:
    """Run ``argv`` to its end, passing signals on as the module says; its status."""
    linux = sys.platform.startswith("linux")
    proc = subprocess.Popen(  # noqa: S603  (the agent the user named, found on PATH)
        argv, env=dict(env), preexec_fn=_die_with(os.getpid()) if linux else None
    )

    def forward(signum: int, _frame: FrameType | None) -> None:
        if signum in FROM_THE_KEYBOARD and _terminal_sent_it():
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED}
    try:
        status = proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 128 - status if status < 0 else status


def _terminal_sent_it() -> bool:
    """Whether this process is its terminal's foreground group: a Ctrl-C there went to
    the agent too."""
    try:
        return os.tcgetpgrp(sys.stdin.fileno()) == os.getpgrp()
    except (OSError, ValueError, AttributeError):
        return False


def _die_with(parent: int) -> Callable[[], None]:
    """In the child before it runs the agent: SIGTERM when ``parent`` dies (Linux)."""

    def arrange() -> None:
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))
        if os.getppid() != parent:  # the parent died before the request was made
            os._exit(128 + int(signal.SIGTERM))

    return arrange


__all__ = ["run_agent", "supervise", "write_private"]
