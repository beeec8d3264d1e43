"""What a hostile hub can make the command line show: sizes of nothing or of no
number, a rate below zero, a terminal five columns wide, an error message full of
terminal escapes; and a transfer that goes past the size the hub announced."""

from __future__ import annotations

import io
import threading
from pathlib import Path

import pytest

from slm_server.pull import command
from slm_server.pull.errors import PullError
from slm_server.pull.events import Event, FileReady, Planned, PlannedFile, Progress
from slm_server.pull.progress_view import TerminalView, bar_line, percent, plain_line, printable
from slm_server.pull.result import Pulled
from slm_server.pull.transfer import Transfer
from slm_server.settings import PullSettings

ODD = [
    Progress("o/r/m.gguf", 0, 0, 0, None, None),
    Progress("o/r/m.gguf", 500, 0, 0, 10.0, None),
    Progress("o/r/m.gguf", 500, None, 0, 10.0, None),
    Progress("o/r/m.gguf", 5000, 100, 0, 10.0, 0.0),  # more than the hub announced
    Progress("o/r/m.gguf", 50, 100, 0, -10.0, -5.0),  # a rate below zero
    Progress("o/r/m.gguf", 50, -100, 0, 0.0, None),
    Progress("o/r/m.gguf", 10**18, 10**18, 10**17, 1e15, 1e9),
    Progress("o/r/" + "n" * 500 + ".gguf", 1, 2, 0, 1.0, 1.0),
]


@pytest.mark.parametrize("event", ODD)
def test_odd_figures_are_drawn_within_any_width(event: Progress) -> None:
    shown = percent(event)
    assert shown is None or 0 <= shown <= 100 or (event.total or 0) < 0
    assert plain_line(event).startswith(event.name)
    for width in (1, 2, 5, 10, 20, 21, 40, 80, 300):
        line = bar_line(event, width)
        assert len(line) < width, (width, line)


def test_a_terminal_five_columns_wide_never_wraps_the_bar() -> None:
    out = io.StringIO()
    view = TerminalView(out, tty=True, width=lambda: 5)
    for event in ODD:
        view(event)
    view.end_line()
    drawn = out.getvalue().split("\r")[1:]
    assert len(drawn) == len(ODD)
    for line in drawn:
        assert len(line.removesuffix("\n").removesuffix("\x1b[K")) <= 4, line


def test_printable_escapes_what_a_terminal_would_act_on_and_keeps_the_rest() -> None:
    assert printable("\x1b]0;owned\x07") == "\\x1b]0;owned\\x07"
    assert printable("a\rb\nc\x9bd\u202ee\u200b") == "a\\rb\\nc\\x9bd\\u202ee\\u200b"
    assert printable("modèle 模型 ok: 1.0 MB") == "modèle 模型 ok: 1.0 MB"


def test_an_error_full_of_escapes_is_printed_as_one_harmless_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    hostile = "registry says: \x1b]0;owned\x07\x1b[2J\x1b[1A\rall fine\n\u202eevil"

    def refuse(*_args: object) -> Pulled:
        raise PullError("hub_error", hostile)

    monkeypatch.setattr(command, "pull", refuse)
    out, err = io.StringIO(), io.StringIO()
    code, pulled = command.pull_command("o/r", PullSettings(), out, err)
    assert (code, pulled, out.getvalue()) == (1, None, "")
    [line] = err.getvalue().splitlines()
    assert line.startswith("error: registry says: ") and line.isprintable()
    assert "\\x1b]0;owned\\x07" in line and "\\u202eevil" in line


def test_the_view_shows_names_and_paths_as_they_are_when_they_are_plain(tmp_path: Path) -> None:
    out = io.StringIO()
    view = TerminalView(out, tty=False)
    events: list[Event] = [
        Planned("o/r", (PlannedFile("o/r/模型.gguf", 10, None, False),), 10, 10**9),
        FileReady("o/r/模型.gguf", tmp_path / "o/r/模型.gguf", True),
    ]
    for event in events:
        view(event)
    assert "o/r/模型.gguf: checked and in place" in out.getvalue()


def limited(limit: int | None, resumed: int = 0) -> Transfer:
    settings = PullSettings(stall_seconds=100.0, min_bytes_per_second=0)
    return Transfer("m.gguf", limit, resumed, settings, lambda _e: None, None, lambda: 0.0, limit)


def test_a_transfer_stops_at_the_first_byte_past_the_announced_size() -> None:
    transfer = limited(1000)
    transfer.advance(1000)
    with pytest.raises(PullError) as raised:
        transfer.advance(1)
    assert raised.value.kind == "checksum" and "more bytes than the hub's 1000" in str(raised.value)

    seen_on_the_network = limited(1000, resumed=400)
    seen_on_the_network.advance_from_network(600)
    with pytest.raises(PullError):
        seen_on_the_network.advance_from_network(1)


def test_a_transfer_that_starts_again_may_send_the_whole_size_again() -> None:
    transfer = limited(1000, resumed=600)
    transfer.advance_from_network(300)
    transfer.restart()  # the hub ignored the Range: the whole file comes again
    transfer.advance_from_network(1000)
    transfer.advance(1000)
    assert transfer.meter.done == 1000
    assert limited(None).meter.total is None
    unlimited = limited(None)
    unlimited.advance(10**12)  # no size announced: no limit to pass


def test_a_cancel_still_wins_over_the_size_check() -> None:
    cancel = threading.Event()
    cancel.set()
    settings = PullSettings()
    transfer = Transfer("m", 10, 0, settings, lambda _e: None, cancel, lambda: 0.0, 10)
    with pytest.raises(PullError) as raised:
        transfer.advance(5)
    assert raised.value.kind == "cancelled"
