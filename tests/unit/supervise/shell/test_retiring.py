"""Retiring backends: stopped when the router says they are drained, at their
deadline, or at once when their process already ended; never for a wrong role or pid."""

from __future__ import annotations

from slm_server.supervise.core.decide import Lifecycle
from slm_server.supervise.core.restart_budget import RestartBudget
from slm_server.supervise.shell.backend import Backend
from slm_server.supervise.shell.retiring import Retirements
from tests.registry_entries import model_spec


class Child:
    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.create_time = 1.0
        self.exit_status: int | None = None

    def poll(self) -> int | None:
        return self.exit_status


def backend(role: str, pid: int | None, port: int = 8501) -> Backend:
    spec = model_spec(role, role, port, default_timeout=10, quantization="Q4_0")
    life = Lifecycle(role, role, port, RestartBudget(3, 60, 0), alive=pid is not None, pid=pid)
    found = Backend(spec, life)
    if pid is not None:
        found.child = Child(pid)  # type: ignore[assignment]
    return found


def test_a_retiree_stops_when_drained_at_its_deadline_or_when_it_ended() -> None:
    wall = [100.0]
    retiring = Retirements(30.0, lambda: wall[0])
    a, b, c = backend("a", 11), backend("b", 12, 8502), backend("c", 13, 8503)
    c_child = Child(13)
    c.child = c_child  # type: ignore[assignment]
    record = retiring.add(a, "removed")
    assert record is not None and record.deadline == 130.0 and record.reason == "removed"
    retiring.add(b, "replaced")
    retiring.add(c, "replaced")
    assert retiring.due() == []
    assert not retiring.drained("b", 11)  # a pid of another role
    assert not retiring.drained("a", 99)
    assert retiring.drained("a", 11)
    c_child.exit_status = 0
    assert [(r.record.role, why) for r, why in retiring.due()] == [
        ("a", "drained"),
        ("c", "exited"),
    ]
    wall[0] = 130.0
    assert [why for _r, why in retiring.due()] == ["drained", "deadline", "exited"]
    for retiree, _why in retiring.due():
        retiree.stopping = True
    assert retiring.due() == []  # each stop is asked once


def test_nothing_to_drain_without_a_live_process() -> None:
    retiring = Retirements(30.0, lambda: 0.0)
    assert retiring.add(backend("a", None), "removed") is None
    assert retiring.records() == []


def test_a_new_backend_waits_for_the_retiree_of_its_role_else_of_its_port() -> None:
    retiring = Retirements(30.0, lambda: 0.0)
    retiring.add(backend("a", 11, 8501), "replaced")
    retiring.add(backend("b", 12, 8502), "removed")
    assert retiring.holder("a", 9000) == 11
    assert retiring.holder("z", 8502) == 12
    assert retiring.holder("z", 9000) is None
    retiring.done(11)
    assert retiring.holder("a", 9000) is None
