"""The pure parts of the ``affinity`` benchmark: its conversations, their order, and
the numbers made of the turns."""

from __future__ import annotations

from collections import Counter

import pytest

from benchmarks import affinity
from benchmarks.affinity import Turn, schedule, summarize, system_prompt, user_message
from slm_server.router.dispatch.affinity import BLOCK_CHARS


def test_system_prompts_are_deterministic_long_and_distinct_from_the_first_block() -> None:
    assert system_prompt(3, 800) == system_prompt(3, 800)
    prompts = [system_prompt(c, 800) for c in range(1, 9)]
    assert all(790 <= len(p.split()) <= 830 for p in prompts)
    # Distinct from the start: no two conversations share a routing block.
    assert len({p[:BLOCK_CHARS] for p in prompts}) == 8
    assert user_message(2, 3) == user_message(2, 3)
    assert user_message(2, 3) != system_prompt(2, 10)


def test_schedule_interleaves_turns_and_shuffles_within_each() -> None:
    order = schedule(8, 4, 3)
    assert len(order) == 32
    turns = [turn for _, turn in order]
    assert turns == sorted(turns)  # every turn t before any turn t + 1
    for turn in range(1, 5):
        assert sorted(c for c, t in order if t == turn) == list(range(1, 9))
    assert order == schedule(8, 4, 3)  # the same for every policy
    # Not the fixed order, in which round robin over two replicas would be sticky.
    assert [c for c, t in order if t == 2] != list(range(1, 9))
    # No conversation's turn right after its previous one (no client waits for another).
    for turn in range(2, 5):
        ending = [c for c, t in order if t == turn - 1][-3:]
        starting = [c for c, t in order if t == turn][:3]
        assert not set(ending) & set(starting)


def test_schedule_of_few_conversations_still_has_every_turn() -> None:
    order = schedule(2, 3, 4)
    assert Counter(order) == {(c, t): 1 for c in (1, 2) for t in (1, 2, 3)}


def test_summarize_counts_the_cache_and_the_latencies() -> None:
    turns = [
        Turn(1, 1, 2.0, 2.5, "a", 10, 900),
        Turn(2, 1, 3.0, 3.5, "b", 10, 900),
        Turn(1, 2, 0.2, 0.7, "c", 920, 30),
        Turn(2, 2, 0.4, 0.9, "d", None, None),
    ]
    summary = summarize(turns, 8.0)
    assert summary["turns"] == 4
    assert summary["turns_per_s"] == 0.5
    assert summary["ttft_ms"]["p50"] == pytest.approx(1200)
    assert summary["later_ttft_ms"]["p50"] == pytest.approx(300)
    assert (summary["cache_n"], summary["prompt_n"]) == (940, 1830)
    assert summary["reuse"] == pytest.approx(940 / 2770)
    assert summary["timings_seen"] == 3
    assert summary["first_turn_prompt_tokens"] == 900


def _run(policy: str, index: int, p50: float, rate: float) -> dict[str, object]:
    return {"policy": policy, "round": index, "ttft_ms": {"p50": p50}, "turns_per_s": rate}


def test_checks_compare_round_by_round() -> None:
    runs = [
        _run("least_outstanding", 1, 1000, 0.5),
        _run("prefix_affinity", 1, 400, 0.6),
        _run("least_outstanding", 2, 2000, 0.4),
        _run("prefix_affinity", 2, 1200, 0.4),
        _run("round_robin", 1, 1000, 0.5),
    ]
    assert affinity.ratios(runs, affinity._p50) == [0.4, 0.6]
    ttft, rate = affinity.checks(runs)
    assert ttft.stat["median"] == pytest.approx(0.5) and ttft.passed
    assert rate.stat["median"] == pytest.approx(1.1) and rate.passed
    assert affinity.ratios(runs, affinity._p50, "round_robin") == [0.4]
