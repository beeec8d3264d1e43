"""The file watch's settling, a pure part of a reload (a fake ``stat``, a fake clock)."""

from __future__ import annotations

from pathlib import Path

from slm_server.supervise.reload.watch import ConfigWatch, Stamp


class Files:
    """A fake ``stat``: the stamp the watch sees."""

    def __init__(self) -> None:
        self.current: Stamp = (1, 10, 100)

    def __call__(self, _path: Path) -> Stamp:
        return self.current


def test_the_file_watch_waits_for_a_change_to_settle_and_says_so_once() -> None:
    files = Files()
    watch = ConfigWatch(Path("/r.yaml"), 1.0, files)
    assert not watch.due(0.0)  # nothing changed
    files.current = (1, 11, 200)
    assert not watch.due(0.1)  # changed: the timer starts
    files.current = (2, 12, 300)
    assert not watch.due(0.6)  # changed again: it starts over
    assert not watch.due(1.5)
    assert watch.due(1.7)  # settled for 1.1 s
    assert not watch.due(5.0)  # once per change
    files.current = None  # the file vanished: a change too
    assert not watch.due(6.0)
    assert watch.due(7.1)
