"""Scenario ``affinity``: what routing by prompt prefix buys on real llama-server
replicas, against round robin and least outstanding.

Two replicas of SmolLM2 135M (one entry, ``replicas: 2``, one slot each, prompt cache
on, ``LLAMA_ARG_THREADS`` threads each), started by the real supervisor with the router
in front. ``conversations`` chats, each with its own system prompt of about 1,000
tokens (distinct text, generated from the conversation's number), play ``turns``
turns, interleaved: every conversation's turn *t* before any turn *t + 1*, each turn
the whole conversation so far (the previous answers included) and a new short user
message. ``clients`` clients take the turns in that order; short answers
(``max_tokens``, temperature 0) so that prompt processing is what a turn costs.

Within a turn the conversations come in a shuffled order (the same for every policy):
in a fixed order, with an even number of conversations, round robin over two replicas
would send every conversation to the same replica each turn, a coincidence of the
benchmark rather than a property of the policy. The order also keeps a conversation's
turn out of the first ``clients`` places of a turn when it was in the last ``clients``
of the previous one, so no client waits for another's answer.

Measured per policy and round, every run on fresh servers, the policies' order
rotating from round to round: time to first token (p50, p95) of the streamed turns,
turns per second from the first request to the last answer, and the backends' own
account of their prompt cache: the ``timings`` object of the last chunk of each
streamed answer, ``cache_n`` (prompt tokens reused, from the slot or from
llama-server's host-memory prompt cache) against ``prompt_n`` (prompt tokens processed).
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import httpx

from benchmarks.loadgen import percentile
from benchmarks.report import DASH, DIVIDE, TIMES, Check, show, spread, table
from benchmarks.servers import launcher, router_for
from tests.fakes.control import free_ports
from tests.integration.real_stack import example_registry, llama_server_bin

ROLE: Final = "standard"
POLICIES: Final = ("round_robin", "least_outstanding", "prefix_affinity")
TTFT_GOAL: Final = 0.5  # prefix affinity's p50 over least outstanding's
HELLO: Final = [{"role": "user", "content": "Say hello."}]

# The words the system prompts are made of: common, so about one token each.
_WORD_TEXT: Final = (
    "harbour ship boat sail wind tide river bridge market garden window table paper "
    "letter number morning evening winter summer autumn spring mountain valley forest "
    "field stone water light shadow colour music story travel kitchen bread apple "
    "orange coffee station train ticket road city village house door street corner "
    "friend teacher doctor farmer baker painter writer student engine machine clock "
    "lamp chair floor wall roof garden cloud rain snow storm island beach shell fish "
    "bird horse dog cat rabbit mouse field wheat corn honey salt pepper butter cheese "
    "careful quiet bright early late small large heavy light warm cold green blue red "
    "yellow brown white black simple clear quick slow gentle strong open closed "
    "always never often sometimes usually rarely before after during between under "
    "over behind beside near far inside outside answer question reason example method "
    "record report schedule plan project budget account service customer order "
    "delivery package system network signal message channel"
)
WORDS: Final = tuple(_WORD_TEXT.split())


def system_prompt(conversation: int, words: int) -> str:
    """The system prompt of ``conversation`` (from 1): ``words`` words in sentences,
    the same every time, and different from every other conversation's from its first
    characters."""
    rng = random.Random(f"system-{conversation}")
    sentences = [
        f"You are assistant {conversation} of the harbour office, and these are your notes."
    ]
    left = words
    while left > 0:
        length = min(left, rng.randint(8, 14))
        sentence = " ".join(rng.choice(WORDS) for _ in range(length))
        sentences.append(sentence[0].upper() + sentence[1:] + ".")
        left -= length
    return " ".join(sentences)


def user_message(conversation: int, turn: int) -> str:
    rng = random.Random(f"user-{conversation}-{turn}")
    return f"In one short sentence: what do your notes say about the {rng.choice(WORDS)}?"


def schedule(conversations: int, turns: int, clients: int, seed: int = 15) -> list[tuple[int, int]]:
    """The (conversation, turn) order, both from 1: turn by turn, the conversations
    shuffled within each turn, and none of the last ``clients`` of a turn among the
    first ``clients`` of the next (when the conversations allow it)."""
    rng = random.Random(seed)
    order: list[tuple[int, int]] = []
    previous: list[int] = []
    gap = min(clients, conversations // 2)
    for turn in range(1, turns + 1):
        chosen = list(range(1, conversations + 1))
        for _ in range(1000):
            rng.shuffle(chosen)
            if not set(chosen[:gap]) & set(previous[-gap:] if gap else ()):
                break
        order += [(c, turn) for c in chosen]
        previous = chosen
    return order


@dataclass(frozen=True)
class Plan:
    rounds: int = 3
    conversations: int = 8
    turns: int = 4
    clients: int = 3
    max_tokens: int = 16
    system_words: int = 800  # about 1,000 tokens of SmolLM2's tokenizer
    threads: int = 1  # per replica
    context_length: int = 4096  # per replica (one slot: all of it)
    cache_ram: int | None = None  # llama-server's own default (8192 MiB)
    policies: tuple[str, ...] = POLICIES


@dataclass
class Turn:
    """One streamed turn as the client saw it."""

    conversation: int
    turn: int
    ttft_s: float
    total_s: float
    answer: str
    cache_n: int | None
    prompt_n: int | None


def _stream_turn(
    client: httpx.Client, url: str, model: str, messages: list[dict[str, str]], max_tokens: int
) -> tuple[float, float, str, dict[str, Any]]:
    """Time to first content, total time, the answer and the last chunk's ``timings``."""
    body = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        # The router keeps the usage chunk, and llama-server's timings with it, from a
        # client that did not ask for it.
        "stream_options": {"include_usage": True},
    }
    started = time.perf_counter()
    first: float | None = None
    parts: list[str] = []
    timings: dict[str, Any] = {}
    with client.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=300) as reply:
        if reply.status_code != 200:
            raise AssertionError(f"{reply.status_code} {reply.read()[:300]!r}")
        for line in reply.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise AssertionError(f"error in the stream: {chunk['error']}")
            for choice in chunk.get("choices") or ():
                content = (choice.get("delta") or {}).get("content")
                if content:
                    if first is None:
                        first = time.perf_counter() - started
                    parts.append(content)
            if isinstance(chunk.get("timings"), dict):
                timings = chunk["timings"]
    total = time.perf_counter() - started
    return (total if first is None else first), total, "".join(parts), timings


def play(url: str, model: str, plan: Plan) -> tuple[list[Turn], float]:
    """Every turn of every conversation through ``url``, by ``plan.clients`` clients;
    the turns and the wall seconds from the first request to the last answer."""
    order = schedule(plan.conversations, plan.turns, plan.clients)
    histories = {
        c: [{"role": "system", "content": system_prompt(c, plan.system_words)}]
        for c in range(1, plan.conversations + 1)
    }
    done = {(c, 0): threading.Event() for c in histories}
    for key in order:
        done[key] = threading.Event()
    for event in (done[(c, 0)] for c in histories):
        event.set()
    lock = threading.Lock()
    queue = list(order)
    turns: list[Turn] = []
    failures: list[BaseException] = []

    def client_loop() -> None:
        with httpx.Client(trust_env=False) as client:
            while not failures:
                with lock:
                    if not queue:
                        return
                    conversation, turn = queue.pop(0)
                if not done[(conversation, turn - 1)].wait(600):
                    failures.append(TimeoutError(f"turn {turn - 1} of {conversation}"))
                    return
                history = histories[conversation]
                history.append({"role": "user", "content": user_message(conversation, turn)})
                try:
                    ttft, total, answer, timings = _stream_turn(
                        client, url, model, list(history), plan.max_tokens
                    )
                except Exception as error:
                    failures.append(error)
                    return
                history.append({"role": "assistant", "content": answer})
                with lock:
                    turns.append(
                        Turn(
                            conversation,
                            turn,
                            ttft,
                            total,
                            answer,
                            _int(timings.get("cache_n")),
                            _int(timings.get("prompt_n")),
                        )
                    )
                done[(conversation, turn)].set()

    started = time.perf_counter()
    threads = [threading.Thread(target=client_loop, daemon=True) for _ in range(plan.clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    if failures:
        raise RuntimeError(f"{len(failures)} turn(s) failed: {failures[0]!r}") from failures[0]
    return turns, wall


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) else None


def summarize(turns: Sequence[Turn], wall: float) -> dict[str, Any]:
    """TTFT percentiles (ms) of all turns and of the turns after the first (whose
    conversation a replica may hold), turns per second, and the cache's account."""
    ttft = sorted(t.ttft_s * 1000 for t in turns)
    later = sorted(t.ttft_s * 1000 for t in turns if t.turn > 1)
    cached = sum(t.cache_n or 0 for t in turns)
    processed = sum(t.prompt_n or 0 for t in turns)
    first = [t.prompt_n for t in turns if t.turn == 1 and t.prompt_n is not None]
    return {
        "turns": len(turns),
        "wall_s": wall,
        "turns_per_s": len(turns) / wall if wall > 0 else None,
        "ttft_ms": {"p50": percentile(ttft, 50), "p95": percentile(ttft, 95)},
        "later_ttft_ms": {"p50": percentile(later, 50), "p95": percentile(later, 95)},
        "cache_n": cached,
        "prompt_n": processed,
        "reuse": cached / (cached + processed) if cached + processed else None,
        "timings_seen": sum(1 for t in turns if t.prompt_n is not None),
        "first_turn_prompt_tokens": sum(first) / len(first) if first else None,
    }


def entry(plan: Plan, policy: str, port: int) -> dict[str, Any]:
    """The registry entry: SmolLM2 as the example has it, as two one-slot replicas."""
    models: dict[str, dict[str, Any]] = example_registry(
        {ROLE: port, "gemma": 0, "embeddings": 0}, roles=(ROLE,)
    )["models"]
    fields = models[ROLE] | {
        "replicas": 2,
        "routing": policy,
        "max_concurrency": 1,
        "context_length": plan.context_length,
        "cache_prompt": True,
        "default_timeout": 300,
    }
    if plan.cache_ram is not None:
        fields["cache_ram"] = plan.cache_ram
    return fields


def run_once(plan: Plan, policy: str, workdir: Path, index: int) -> dict[str, Any]:
    """One policy on fresh replicas and router: every turn, summarized."""
    port = free_ports(2)
    models = {ROLE: entry(plan, policy, port)}
    model = models[ROLE]["id"]
    env = {"SLM_LLAMA_SERVER_BIN": llama_server_bin(), "LLAMA_ARG_THREADS": str(plan.threads)}
    with launcher(workdir, models, env) as launched, router_for(workdir, launched.env) as router:
        # Each replica answers once directly first: its first answer costs more.
        with httpx.Client(trust_env=False) as client:
            for replica_port in (port, port + 1):
                body = {"model": model, "messages": HELLO, "max_tokens": 4}
                reply = client.post(
                    f"http://127.0.0.1:{replica_port}/v1/chat/completions", json=body, timeout=120
                )
                reply.raise_for_status()
        turns, wall = play(router.url, model, plan)
    summary = summarize(turns, wall)
    return {
        "policy": policy,
        "round": index,
        **summary,
        "samples": [
            {
                "conversation": t.conversation,
                "turn": t.turn,
                "ttft_ms": round(t.ttft_s * 1000, 2),
                "total_ms": round(t.total_s * 1000, 2),
                "cache_n": t.cache_n,
                "prompt_n": t.prompt_n,
            }
            for t in sorted(turns, key=lambda t: (t.turn, t.conversation))
        ],
    }


def run_rounds(plan: Plan, workdir: Path, say: Callable[[str], None]) -> list[dict[str, Any]]:
    runs = []
    for index in range(1, plan.rounds + 1):
        shift = (index - 1) % len(plan.policies)
        for policy in plan.policies[shift:] + plan.policies[:shift]:
            run = run_once(plan, policy, workdir / f"{policy}-{index}", index)
            say(
                f"  round {index} {policy}: TTFT p50 {run['ttft_ms']['p50']:.0f} ms, "
                f"p95 {run['ttft_ms']['p95']:.0f} ms, {run['turns_per_s']:.2f} turns/s, "
                f"cache_n {run['cache_n']} / prompt_n {run['prompt_n']}"
            )
            runs.append(run)
    return runs


def _by_round(runs: Sequence[dict[str, Any]], policy: str) -> dict[int, dict[str, Any]]:
    return {int(r["round"]): r for r in runs if r["policy"] == policy}


def ratios(
    runs: Sequence[dict[str, Any]],
    key: Callable[[dict[str, Any]], float | None],
    over: str = "least_outstanding",
) -> list[float]:
    """Prefix affinity's ``key`` over ``over``'s, round by round."""
    mine, theirs = _by_round(runs, "prefix_affinity"), _by_round(runs, over)
    found = []
    for index in sorted(mine.keys() & theirs.keys()):
        a, b = key(mine[index]), key(theirs[index])
        if a is not None and b:
            found.append(a / b)
    return found


def _p50(run: dict[str, Any]) -> float | None:
    value = run["ttft_ms"]["p50"]
    return float(value) if value is not None else None


def _rate(run: dict[str, Any]) -> float | None:
    value = run["turns_per_s"]
    return float(value) if value is not None else None


def checks(runs: Sequence[dict[str, Any]]) -> list[Check]:
    return [
        Check(
            f"prefix affinity p50 TTFT {DIVIDE} least outstanding's",
            TTFT_GOAL,
            TIMES,
            spread(ratios(runs, _p50)),
        ),
        Check(
            f"prefix affinity turns/s {DIVIDE} least outstanding's",
            1.0,
            TIMES,
            spread(ratios(runs, _rate)),
            at_least=True,
        ),
    ]


def tables(runs: Sequence[dict[str, Any]], plan: Plan) -> str:
    def stat(policy: str, key: Callable[[dict[str, Any]], float | None]) -> dict[str, Any]:
        return spread(key(r) for r in runs if r["policy"] == policy)

    rows = []
    for policy in plan.policies:
        rows.append(
            [
                f"`{policy}`",
                show(stat(policy, lambda r: r["ttft_ms"]["p50"]), 0),
                show(stat(policy, lambda r: r["ttft_ms"]["p95"]), 0),
                show(stat(policy, lambda r: r["later_ttft_ms"]["p50"]), 0),
                show(stat(policy, lambda r: r["turns_per_s"]), 2),
                show(stat(policy, lambda r: r["cache_n"]), 0),
                show(stat(policy, lambda r: r["prompt_n"]), 0),
                show(stat(policy, lambda r: None if r["reuse"] is None else r["reuse"] * 100), 0),
            ]
        )
    header = [
        "routing",
        "TTFT p50 (ms)",
        "TTFT p95 (ms)",
        "TTFT p50, turns 2+ (ms)",
        "turns/s",
        "cache_n (tokens)",
        "prompt_n (tokens)",
        "reused (%)",
    ]
    first = spread(r["first_turn_prompt_tokens"] for r in runs)
    setup = (
        f"{plan.conversations} conversations {TIMES} {plan.turns} turns "
        f"({plan.conversations * plan.turns} streamed turns per run), {plan.clients} clients, "
        f"max_tokens {plan.max_tokens}, temperature 0; two replicas of SmolLM2 135M, one slot "
        f"and {plan.threads} thread(s) each, ctx {plan.context_length}, prompt cache on, "
        f"--cache-ram {'default (8192 MiB)' if plan.cache_ram is None else plan.cache_ram}. "
        f"A first turn's prompt: {show(first, 0)} tokens (llama-server's prompt_n). "
        f"cache_n and prompt_n are summed over a run's turns; reused = cache_n {DIVIDE} "
        f"(cache_n + prompt_n). Medians with [min{DASH}max] across rounds."
    )
    ratio_rows = [
        [
            "prefix affinity p50 TTFT, " + DIVIDE + " least outstanding's",
            show(spread(ratios(runs, _p50)), 2),
        ],
        [
            "prefix affinity p50 TTFT, " + DIVIDE + " round robin's",
            show(spread(ratios(runs, _p50, "round_robin")), 2),
        ],
        [
            "prefix affinity turns/s, " + DIVIDE + " least outstanding's",
            show(spread(ratios(runs, _rate)), 2),
        ],
    ]
    return "\n\n".join(
        [
            setup,
            table(header, rows),
            table(["ratio, round by round", "median [min" + DASH + "max]"], ratio_rows),
        ]
    )


def csv_rows(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in run.items() if k != "samples"} for run in runs]
