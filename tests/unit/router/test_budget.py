"""The budget for request bodies in flight."""

from __future__ import annotations

import pytest

from slm_server.errors import BodiesOverBudget
from slm_server.router.intake.body_budget import BodyBudget


def test_holdings_add_up_and_are_given_back() -> None:
    budget = BodyBudget(100)
    first, second = budget.hold(), budget.hold()
    first.take(60)
    second.take(30)
    second.take(10)
    assert budget.used == 100
    with pytest.raises(BodiesOverBudget) as refused:
        budget.hold().take(1)
    assert refused.value.status == 503
    assert refused.value.code == "bodies_over_budget"
    assert refused.value.headers() == {"Retry-After": "1"}
    first.release()
    assert budget.used == 40
    first.release()  # twice is harmless
    assert budget.used == 40
    second.release()
    assert budget.used == 0


def test_a_refused_take_holds_nothing() -> None:
    budget = BodyBudget(10)
    held = budget.hold()
    with pytest.raises(BodiesOverBudget):
        held.take(11)
    assert (budget.used, held.size) == (0, 0)
