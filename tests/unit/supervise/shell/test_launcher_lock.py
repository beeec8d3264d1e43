"""The launcher lock: one holder per log directory, released with its descriptor."""

from __future__ import annotations

import os
from pathlib import Path

from slm_server.supervise.shell import launcher_lock
from slm_server.supervise.shell.launcher_lock import Held, LauncherLock


def test_the_second_taker_is_told_who_holds_it_until_it_is_released(tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"  # made when missing
    first = launcher_lock.take(log_dir)
    assert isinstance(first, LauncherLock)
    assert (log_dir / "launcher.lock").read_text() == f"{os.getpid()}\n"
    assert (log_dir / "launcher.lock").stat().st_mode & 0o777 == 0o600
    second = launcher_lock.take(log_dir)
    assert second == Held(log_dir / "launcher.lock", os.getpid())
    first.release()
    first.release()  # twice is harmless
    again = launcher_lock.take(log_dir)
    assert isinstance(again, LauncherLock)
    again.release()


def test_a_file_without_a_pid_still_locks(tmp_path: Path) -> None:
    first = launcher_lock.take(tmp_path)
    assert isinstance(first, LauncherLock)
    (tmp_path / "launcher.lock").write_text("not a pid\n")
    assert launcher_lock.take(tmp_path) == Held(tmp_path / "launcher.lock", None)
    first.release()


def test_a_stale_file_from_a_dead_holder_never_blocks(tmp_path: Path) -> None:
    (tmp_path / "launcher.lock").write_text("999999\n")  # left by a launcher long gone
    taken = launcher_lock.take(tmp_path)
    assert isinstance(taken, LauncherLock)
    assert (tmp_path / "launcher.lock").read_text() == f"{os.getpid()}\n"
    taken.release()
