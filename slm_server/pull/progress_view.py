"""A pull's progress for a person: on a terminal, one bar redrawn in place (bytes,
rate, time left); otherwise plain lines, one each tenth of a file or
:data:`PLAIN_EVERY_SECONDS`, whichever comes first, for logs and pipes."""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Callable
from typing import Final, TextIO

from slm_server.pull.events import Event, FileReady, Planned, Progress

PLAIN_EVERY_SECONDS: Final = 10.0
_UNITS: Final = ("B", "kB", "MB", "GB", "TB")


def human_bytes(n: float) -> str:
    """``n`` bytes in decimal units, as the hubs show sizes (``253.0 MB``)."""
    value = float(n)
    for unit in _UNITS:
        if abs(value) < 1000 or unit == _UNITS[-1]:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    raise AssertionError("unreachable")


def printable(text: str) -> str:
    """``text`` with each character a terminal would act on (an escape, a carriage
    return, a bidirectional override) written as its escape: what a hub sends (an error
    message, a file name) may hold them."""
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


def human_seconds(seconds: float) -> str:
    s = max(0, math.ceil(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def _figures(p: Progress) -> tuple[str, str, str]:
    size = (
        f"{human_bytes(p.done)} / {human_bytes(p.total)}"
        if p.total is not None
        else human_bytes(p.done)
    )
    rate = f"{human_bytes(p.bytes_per_second)}/s" if p.bytes_per_second is not None else "-- B/s"
    left = f"{human_seconds(p.seconds_left)} left" if p.seconds_left is not None else "-- left"
    return size, rate, left


def percent(p: Progress) -> int | None:
    if not p.total:
        return None
    return min(100, int(100 * p.done / p.total))


def bar_line(p: Progress, width: int) -> str:
    """One terminal line: name, percent, bar, bytes, rate, time left; fits ``width``."""
    size, rate, left = _figures(p)
    shown = percent(p)
    tail = f" {size}  {rate}  {left}"
    head = f"{shown:3d}% " if shown is not None else ""
    name = p.name.rsplit("/", 1)[-1]
    room = width - 1 - len(head) - len(tail) - 4  # a space, the brackets, the margin
    bar_width = max(10, min(40, room // 2))
    name_room = max(8, room - bar_width)
    if len(name) > name_room:
        name = "…" + name[-(name_room - 1) :]
    filled = bar_width * shown // 100 if shown is not None else 0
    bar = "=" * filled + (">" if filled < bar_width else "") + " " * (bar_width - filled - 1)
    return f"{name} {head}[{bar[:bar_width]}]{tail}"[: max(width - 1, 0)]


def plain_line(p: Progress) -> str:
    size, rate, left = _figures(p)
    shown = percent(p)
    share = f" ({shown}%)" if shown is not None else ""
    resumed = f", resumed at {human_bytes(p.resumed)}" if p.resumed else ""
    return f"{p.name}: {size}{share}, {rate}, {left}{resumed}"


class TerminalView:
    """The command line's report: call it with each event."""

    def __init__(
        self,
        stream: TextIO,
        tty: bool,
        clock: Callable[[], float] = time.monotonic,
        width: Callable[[], int] = lambda: shutil.get_terminal_size().columns,
    ) -> None:
        self._stream = stream
        self._tty = tty
        self._clock = clock
        self._width = width
        self._open_bar = False
        self._last_plain: dict[str, tuple[float, int]] = {}

    def _write(self, text: str) -> None:
        self._stream.write(text)
        self._stream.flush()

    def end_line(self) -> None:
        """Finish a bar left open (before an error is printed under it)."""
        if self._open_bar:
            self._write("\n")
            self._open_bar = False

    def __call__(self, event: Event) -> None:
        if isinstance(event, Planned):
            self._planned(event)
        elif isinstance(event, Progress):
            self._progress(event)
        elif isinstance(event, FileReady):
            self.end_line()
            how = "checked and in place" if event.fetched else "already there, checked"
            self._write(f"{event.name}: {how} ({event.path})\n")

    def _planned(self, event: Planned) -> None:
        fetch = sum(1 for f in event.files if not f.present)
        self._write(
            f"pulling {event.reference}: {len(event.files)} file(s), {fetch} to fetch "
            f"({human_bytes(event.to_fetch_bytes)}; {human_bytes(event.free_bytes)} free)\n"
        )

    def _progress(self, p: Progress) -> None:
        if self._tty:
            self._write("\r" + bar_line(p, self._width()) + "\x1b[K")
            self._open_bar = True
            return
        now = self._clock()
        shown = percent(p) or 0
        last = self._last_plain.get(p.name)
        due = last is None or now - last[0] >= PLAIN_EVERY_SECONDS or shown // 10 > last[1] // 10
        if due:
            self._last_plain[p.name] = (now, shown)
            self._write(plain_line(p) + "\n")


__all__ = [
    "PLAIN_EVERY_SECONDS",
    "TerminalView",
    "bar_line",
    "human_bytes",
    "human_seconds",
    "plain_line",
    "printable",
]
