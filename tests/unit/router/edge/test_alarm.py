"""The door's one timer: deadlines replaced, moved sooner at once and later lazily."""

from __future__ import annotations

from collections.abc import Callable

from slm_server.router.edge.alarm import Alarm


class Handle:
    def __init__(self, loop: FakeLoop, when: float, callback: Callable[[], None]) -> None:
        self.loop, self.when, self.callback, self.cancelled = loop, when, callback, False

    def cancel(self) -> None:
        self.cancelled = True


class FakeLoop:
    """``time`` and ``call_at`` on a clock the test moves; ``run_until`` fires what is due."""

    def __init__(self) -> None:
        self.now = 0.0
        self.handles: list[Handle] = []

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[[], None]) -> Handle:
        handle = Handle(self, when, callback)
        self.handles.append(handle)
        return handle

    @property
    def pending(self) -> list[Handle]:
        return [h for h in self.handles if not h.cancelled]

    def run_until(self, when: float) -> None:
        while True:
            due = sorted((h for h in self.pending if h.when <= when), key=lambda h: h.when)
            if not due:
                break
            handle = due[0]
            self.now = handle.when
            handle.cancelled = True  # fired
            handle.callback()
        self.now = when


def alarm() -> tuple[Alarm, FakeLoop, list[str]]:
    loop = FakeLoop()
    fired: list[str] = []
    return Alarm(loop), loop, fired  # type: ignore[arg-type]


def test_the_current_deadline_fires_once() -> None:
    clock, loop, fired = alarm()
    clock.set(10, lambda: fired.append(f"head@{loop.now:g}"))
    loop.run_until(9.9)
    assert fired == []
    loop.run_until(30)
    assert fired == ["head@10"]
    assert loop.pending == []


def test_a_later_deadline_moves_no_timer_until_the_early_one_fires() -> None:
    clock, loop, fired = alarm()
    clock.set(10, lambda: fired.append("head"))
    loop.now = 1
    clock.set(75, lambda: fired.append(f"idle@{loop.now:g}"))
    assert len(loop.handles) == 1
    loop.run_until(74)
    assert fired == [] and len(loop.pending) == 1  # re-set for 76 when it fired at 10
    loop.run_until(100)
    assert fired == ["idle@76"]


def test_a_sooner_deadline_moves_the_timer() -> None:
    clock, loop, fired = alarm()
    clock.set(75, lambda: fired.append("idle"))
    clock.set(10, lambda: fired.append(f"head@{loop.now:g}"))
    assert [h.when for h in loop.pending] == [10]
    loop.run_until(100)
    assert fired == ["head@10"]


def test_cleared_and_cancelled_alarms_do_nothing() -> None:
    clock, loop, fired = alarm()
    clock.set(10, lambda: fired.append("head"))
    clock.clear()
    assert clock.action is None
    loop.run_until(20)
    clock.set(10, lambda: fired.append("body"))
    clock.cancel()
    assert loop.pending == []
    loop.run_until(100)
    assert fired == []
