"""What choosing a replica costs per request: the leading text of a chat request, its
block hashes and the balancer's choice (which records the blocks), for a 4 KB prompt
and for a prompt past the hashing bound, under prefix affinity and least outstanding;
and the memory of a full prefix index.

    python -m benchmarks.routing            # writes benchmarks/results/routing-<date>.*
    python -m benchmarks.routing --quick    # a short trial; writes nothing

Pure CPU on one core, no server: the goal is at most 20 µs per request for a 4 KB
prompt (issue 15). Each figure is the median of ``ROUNDS`` rounds of ``PER_ROUND``
requests, the requests taking eight conversations in turn (each its own ~3.5 KB
system prompt, a new user turn every time), so the index sees hits and new blocks.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

from benchmarks.machine import describe_machine
from benchmarks.report import write_measurements
from slm_server.router.dispatch.affinity import (
    INDEX_BLOCKS,
    PrefixIndex,
    block_hashes,
    leading_text,
)
from slm_server.router.dispatch.balance import Balancer, Routing

ROUNDS = 15
PER_ROUND = 2000
CONVERSATIONS = 8
GOAL_US = 20.0


def conversation(n: int, system_chars: int, turn: int) -> dict[str, Any]:
    """A chat request of conversation ``n``: its own system prompt, then a user turn."""
    sentence = f"Conversation {n} follows these rules, number {{}}, to the letter. "
    system = "".join(sentence.format(i) for i in range(system_chars // 50 + 1))[:system_chars]
    return {
        "model": "m",
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": f"Turn {turn}: what next? " * 20},
        ],
    }


def requests(system_chars: int, count: int) -> list[dict[str, Any]]:
    return [conversation(i % CONVERSATIONS, system_chars, i) for i in range(count)]


def per_request_us(step: Callable[[dict[str, Any]], object], bodies: list[dict[str, Any]]) -> float:
    """The median over rounds of the time per request, in microseconds."""
    rounds = []
    for _ in range(ROUNDS):
        gc.disable()
        started = time.perf_counter()
        for body in bodies:
            step(body)
        rounds.append((time.perf_counter() - started) / len(bodies) * 1e6)
        gc.enable()
    return round(statistics.median(rounds), 2)


def choosing(routing: Routing) -> Callable[[dict[str, Any]], object]:
    """The router's work for one request: hash (under prefix affinity) and choose
    among three replicas with some load on them."""
    balancer = Balancer(3, routing, threshold=2)
    serving = [0, 1, 2]
    outstanding = [1, 0, 2]

    def step(body: dict[str, Any]) -> object:
        hashes = block_hashes(leading_text(body)) if balancer.indexes else ()
        return balancer.choose(serving, outstanding, hashes)

    return step


def index_memory_kib() -> float:
    """The memory of one prefix index holding ``INDEX_BLOCKS`` block hashes."""
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    index = PrefixIndex()
    for n in range(INDEX_BLOCKS // 64 + 1):
        index.record(block_hashes(leading_text(conversation(n, 4096, n))))
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert INDEX_BLOCKS // 2 <= len(index) <= INDEX_BLOCKS
    return round((after - before) / 1024, 1)


def measure(per_round: int) -> dict[str, Any]:
    four_kb = requests(3700, per_round)
    chars = len(leading_text(four_kb[0]))
    long = requests(40_000, per_round // 4)
    return {
        "prompt_chars": chars,
        "prefix_affinity_4kb_us": per_request_us(choosing("prefix_affinity"), four_kb),
        "least_outstanding_4kb_us": per_request_us(choosing("least_outstanding"), four_kb),
        "leading_text_and_hashes_4kb_us": per_request_us(
            lambda body: block_hashes(leading_text(body)), four_kb
        ),
        "prefix_affinity_40kb_us": per_request_us(choosing("prefix_affinity"), long),
        "index_blocks": INDEX_BLOCKS,
        "index_memory_kib": index_memory_kib(),
        "goal_us": GOAL_US,
    }


def report(results: dict[str, Any]) -> str:
    rows = [
        ("prefix affinity, 4 KB prompt (hash + choose + record)", "prefix_affinity_4kb_us"),
        ("leading text and block hashes only, 4 KB prompt", "leading_text_and_hashes_4kb_us"),
        ("least outstanding, 4 KB prompt", "least_outstanding_4kb_us"),
        ("prefix affinity, 40 KB prompt (hashed up to 16 KiB)", "prefix_affinity_40kb_us"),
    ]
    lines = [
        f"# Routing cost per request ({results['machine']['date']})",
        "",
        f"Commit {results['machine']['commit']}, {results['machine']['cpu_model']}, "
        f"Python {results['machine']['python']}, 1-minute load {results['machine']['load_1m']} "
        f"(a shared machine); median of {ROUNDS} rounds; the 4 KB prompt is "
        f"{results['prompt_chars']} characters of leading text.",
        "",
        "| Path | µs per request |",
        "|---|---|",
        *(f"| {label} | {results[key]} |" for label, key in rows),
        "",
        f"A full prefix index ({results['index_blocks']} blocks, one per replica): "
        f"{results['index_memory_kib']} KiB. Goal: at most {GOAL_US:g} µs per request "
        "for a 4 KB prompt.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short trial; writes nothing")
    args = parser.parse_args()
    results = measure(200 if args.quick else PER_ROUND)
    results["machine"] = describe_machine()
    text = report(results)
    print(text)
    if not args.quick:
        write_measurements("routing", results, text)


if __name__ == "__main__":
    main()
