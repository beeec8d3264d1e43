"""Choosing a replica: least outstanding with ties in turn, prefix affinity with its
overload threshold, and what is recorded for whom."""

from __future__ import annotations

from collections import Counter

from slm_server.router.dispatch.affinity import block_hashes
from slm_server.router.dispatch.balance import Balancer

CONVERSATION_A = block_hashes("A system prompt for the first conversation. " * 30)
CONVERSATION_B = block_hashes("Another system prompt, quite different. " * 30)


def test_least_outstanding_takes_the_least_loaded() -> None:
    balancer = Balancer(3)
    for _ in range(6):
        pick = balancer.choose([0, 1, 2], [3, 1, 2])
        assert (pick.position, pick.matched_blocks, pick.rule) == (1, 0, "least_outstanding")


def test_ties_rotate_instead_of_always_taking_the_first() -> None:
    balancer = Balancer(3)
    chosen = Counter(balancer.choose([0, 1, 2], [0, 0, 0]).position for _ in range(30))
    assert chosen == {0: 10, 1: 10, 2: 10}
    # Among two tied out of three, the two share.
    chosen = Counter(balancer.choose([0, 1, 2], [1, 0, 0]).position for _ in range(30))
    assert chosen == {1: 15, 2: 15}


def test_only_serving_replicas_are_chosen() -> None:
    balancer = Balancer(3)
    chosen = {balancer.choose([0, 2], [0, 0, 0]).position for _ in range(10)}
    assert chosen == {0, 2}
    assert balancer.choose([1], [9, 9, 0]).rule == "only"


def test_least_outstanding_keeps_no_index() -> None:
    balancer = Balancer(2)
    assert balancer.indexes == ()
    assert balancer.choose([0, 1], [0, 1], CONVERSATION_A).rule == "least_outstanding"


def test_prefix_affinity_sends_a_conversation_back_where_it_went() -> None:
    balancer = Balancer(3, "prefix_affinity", threshold=2)
    first = balancer.choose([0, 1, 2], [0, 0, 0], CONVERSATION_A)
    assert (first.matched_blocks, first.rule) == (0, "least_outstanding")
    for load in ([0, 0, 0], [1, 0, 0], [0, 2, 1]):
        again = balancer.choose([0, 1, 2], load, CONVERSATION_A)
        assert again.position == first.position
        assert again.rule == "prefix_match"
        assert again.matched_blocks == len(CONVERSATION_A)


def test_a_new_conversation_goes_to_the_least_loaded() -> None:
    balancer = Balancer(2, "prefix_affinity")
    balancer.choose([0, 1], [0, 0], CONVERSATION_A)
    home = balancer.choose([0, 1], [0, 0], CONVERSATION_A).position
    other = 1 - home
    load = [0, 0]
    load[home] = 1
    pick = balancer.choose([0, 1], load, CONVERSATION_B)
    assert (pick.position, pick.rule) == (other, "least_outstanding")


def test_an_overloaded_favourite_is_bypassed_past_the_threshold() -> None:
    balancer = Balancer(2, "prefix_affinity", threshold=2)
    home = balancer.choose([0, 1], [0, 0], CONVERSATION_A).position
    other = 1 - home
    load = [0, 0]
    load[home] = 2  # exceeds the other's by 2: not more than the threshold
    assert balancer.choose([0, 1], load, CONVERSATION_A).position == home
    load[home] = 3  # by 3: bypassed
    pick = balancer.choose([0, 1], load, CONVERSATION_A)
    assert (pick.position, pick.rule, pick.matched_blocks) == (other, "prefix_overloaded", 0)
    # The bypass was recorded: the conversation now matches on both.
    load[home] = 0
    load[other] = 1
    assert balancer.choose([0, 1], load, CONVERSATION_A).position == home  # both match, least


def test_threshold_zero_bypasses_on_any_excess() -> None:
    balancer = Balancer(2, "prefix_affinity", threshold=0)
    home = balancer.choose([0, 1], [0, 0], CONVERSATION_A).position
    load = [0, 0]
    load[home] = 1
    assert balancer.choose([0, 1], load, CONVERSATION_A).rule == "prefix_overloaded"


def test_a_replica_that_restarted_is_forgotten() -> None:
    balancer = Balancer(2, "prefix_affinity")
    home = balancer.choose([0, 1], [0, 0], CONVERSATION_A).position
    balancer.forget(home)
    pick = balancer.choose([0, 1], [0, 0], CONVERSATION_A)
    assert (pick.matched_blocks, pick.rule) == (0, "least_outstanding")


def test_a_favourite_that_is_not_serving_is_not_chosen() -> None:
    balancer = Balancer(2, "prefix_affinity")
    home = balancer.choose([0, 1], [0, 0], CONVERSATION_A).position
    other = 1 - home
    pick = balancer.choose([other], [0, 0], CONVERSATION_A)
    assert (pick.position, pick.matched_blocks, pick.rule) == (other, 0, "only")
    # What the only one was sent is recorded, and matched the next time.
    again = balancer.choose([other], [0, 0], CONVERSATION_A)
    assert (again.matched_blocks, again.rule) == (len(CONVERSATION_A), "only")


def test_a_request_too_short_to_hash_goes_by_load() -> None:
    balancer = Balancer(2, "prefix_affinity")
    assert balancer.choose([0, 1], [1, 0], []).position == 1


def test_round_robin_takes_the_serving_replicas_in_turn_whatever_their_load() -> None:
    balancer = Balancer(3, "round_robin")
    assert balancer.indexes == ()
    picks = [balancer.choose([0, 1, 2], [5, 0, 0], CONVERSATION_A) for _ in range(6)]
    assert [p.position for p in picks] == [1, 2, 0, 1, 2, 0]
    assert {(p.matched_blocks, p.rule) for p in picks} == {(0, "round_robin")}
    # A replica that cannot serve is skipped; the others share.
    chosen = Counter(balancer.choose([0, 2], [0, 0, 0]).position for _ in range(10))
    assert chosen == {0: 5, 2: 5}
    assert balancer.choose([1], [0, 0, 0]).rule == "only"
