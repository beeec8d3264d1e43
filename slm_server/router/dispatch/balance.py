"""Choosing a replica for a request: the routing policy of one registry entry. Pure: the
caller says which replicas can serve and how many requests each has outstanding (in
flight and queued at its gate), and gets a position back.

``least_outstanding``
    The replica with the fewest outstanding requests. Ties are broken in turn (a
    counter of choices picks among the tied), so equal replicas share the traffic
    instead of the first taking all of it.

``round_robin``
    The serving replicas in turn, whatever their load: the ``n``-th choice takes the
    ``n``-th of them (modulo how many can serve). Blind to load and to caches; there for
    comparison, and for users of gateways where it is the default.

``prefix_affinity``
    The replica whose :class:`~slm_server.router.dispatch.affinity.PrefixIndex` matches most
    leading blocks of the request (ties: least outstanding among them, in turn), unless
    its outstanding requests exceed the least loaded replica's by more than the entry's
    ``affinity_threshold``: then, and when nothing matches, least outstanding. The
    request's blocks are recorded for the replica chosen, whichever rule chose it, so a
    conversation that moved stays where it went.

With one replica able to serve, it is chosen (rule ``only``), its match still measured
and recorded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Literal

from slm_server.router.dispatch.affinity import INDEX_BLOCKS, PrefixIndex

Routing = Literal["least_outstanding", "round_robin", "prefix_affinity"]
# Why a replica was chosen, as the span and the access log show it.
Rule = Literal["only", "least_outstanding", "round_robin", "prefix_match", "prefix_overloaded"]
RULES: Final = ("only", "least_outstanding", "round_robin", "prefix_match", "prefix_overloaded")


@dataclass(frozen=True, slots=True)
class Pick:
    """The replica chosen (a position among the entry's replicas), the leading blocks
    its index matched (0 under least outstanding), and the rule that chose it."""

    position: int
    matched_blocks: int
    rule: Rule


class Balancer:
    """The routing of one entry's ``replicas`` replicas."""

    def __init__(
        self,
        replicas: int,
        routing: Routing = "least_outstanding",
        threshold: int = 2,
        index_blocks: int = INDEX_BLOCKS,
    ) -> None:
        self.routing = routing
        self.threshold = threshold
        self.indexes = (
            tuple(PrefixIndex(index_blocks) for _ in range(replicas))
            if routing == "prefix_affinity"
            else ()
        )
        self._turn = 0

    def choose(
        self, serving: Sequence[int], outstanding: Sequence[int], hashes: Sequence[int] = ()
    ) -> Pick:
        """A replica among ``serving`` (positions, at least one), given every replica's
        ``outstanding`` requests and the request's block ``hashes``."""
        if len(serving) == 1:
            position = serving[0]
            matched = 0
            if self.indexes and hashes:
                matched = self.indexes[position].match(hashes)
                self.indexes[position].record(hashes)
            return Pick(position, matched, "only")
        self._turn += 1
        if self.routing == "round_robin":
            return Pick(serving[self._turn % len(serving)], 0, "round_robin")
        least = self._least(serving, outstanding)
        if not self.indexes or not hashes:
            return Pick(least, 0, "least_outstanding")
        indexes = self.indexes
        matches = [indexes[p].match(hashes) for p in serving]
        best = max(matches)
        if best == 0:
            pick = Pick(least, 0, "least_outstanding")
        else:
            favoured = [p for p, m in zip(serving, matches, strict=True) if m == best]
            chosen = self._least(favoured, outstanding)
            if outstanding[chosen] - outstanding[least] > self.threshold:
                matched = matches[serving.index(least)]
                pick = Pick(least, matched, "prefix_overloaded")
            else:
                pick = Pick(chosen, best, "prefix_match")
        indexes[pick.position].record(hashes)
        return pick

    def _least(self, candidates: Sequence[int], outstanding: Sequence[int]) -> int:
        """The candidate with the fewest outstanding requests; among several, the next
        in turn, so ties share the traffic."""
        fewest = min(outstanding[c] for c in candidates)
        tied = [c for c in candidates if outstanding[c] == fewest]
        return tied[self._turn % len(tied)]

    def forget(self, position: int) -> None:
        """The replica lost its cache (it is restarting, or was seen down)."""
        if self.indexes:
            self.indexes[position].clear()


__all__ = ["RULES", "Balancer", "Pick", "Routing", "Rule"]
