"""How a pull's progress reads on a terminal and in a log."""

from __future__ import annotations

import io
from pathlib import Path

from slm_server.pull.events import FileReady, Planned, PlannedFile, Progress
from slm_server.pull.progress_view import (
    TerminalView,
    bar_line,
    human_bytes,
    human_seconds,
    plain_line,
)

HALF = Progress("o/r/model-Q4_K_M.gguf", 126_500_000, 253_000_000, 0, 21_400_000.0, 5.9)


def test_sizes_and_durations_read_like_a_hub() -> None:
    assert human_bytes(999) == "999 B"
    assert human_bytes(253_000_000) == "253.0 MB"
    assert human_bytes(1_500_000_000) == "1.5 GB"
    assert human_seconds(5.1) == "6 s"
    assert human_seconds(125) == "2 min 05 s"
    assert human_seconds(3_700) == "1 h 01 min"


def test_the_bar_shows_bytes_rate_and_time_left_within_the_width() -> None:
    assert len(bar_line(HALF, 40)) < 40
    for width in (80, 200):
        line = bar_line(HALF, width)
        assert len(line) < width
        assert "126.5 MB / 253.0 MB" in line
        assert "21.4 MB/s" in line and "6 s left" in line and " 50% [" in line
    wide = bar_line(HALF, 120)
    bar = wide[wide.index("[") + 1 : wide.index("]")]
    assert bar.count("=") == len(bar) // 2


def test_a_plain_line_says_the_same_in_words() -> None:
    assert (
        plain_line(HALF) == "o/r/model-Q4_K_M.gguf: 126.5 MB / 253.0 MB (50%), 21.4 MB/s, 6 s left"
    )
    resumed = Progress("f", 10, 100, 5, None, None)
    assert plain_line(resumed) == "f: 10 B / 100 B (10%), -- B/s, -- left, resumed at 5 B"


def test_on_a_terminal_the_bar_is_redrawn_in_place() -> None:
    out = io.StringIO()
    view = TerminalView(out, tty=True, width=lambda: 100)
    view(Progress("f.gguf", 0, 100, 0, None, None))
    view(HALF)
    view(FileReady("o/r/f.gguf", Path("/m/o/r/f.gguf"), True))
    text = out.getvalue()
    assert text.count("\r") == 2 and text.count("\x1b[K") == 2
    assert text.endswith("\no/r/f.gguf: checked and in place (/m/o/r/f.gguf)\n")


def test_elsewhere_a_line_each_tenth_and_no_control_characters() -> None:
    out = io.StringIO()
    now = [0.0]
    view = TerminalView(out, tty=False, clock=lambda: now[0])
    view(Planned("o/r", (PlannedFile("o/r/f", 1000, None, False),), 1000, 10**9))
    for done in range(0, 1001, 10):
        view(Progress("o/r/f", done, 1000, 0, 100.0, 1.0))
    lines = out.getvalue().splitlines()
    assert lines[0] == "pulling o/r: 1 file(s), 1 to fetch (1.0 kB; 1.0 GB free)"
    assert len(lines) == 1 + 11
    assert "\r" not in out.getvalue() and "\x1b" not in out.getvalue()


def test_elsewhere_a_slow_file_still_gets_a_line_every_ten_seconds() -> None:
    out = io.StringIO()
    now = [0.0]
    view = TerminalView(out, tty=False, clock=lambda: now[0])
    for second in range(0, 31):
        now[0] = float(second)
        view(Progress("f", second, 10**6, 0, 1.0, None))
    assert len(out.getvalue().splitlines()) == 4
