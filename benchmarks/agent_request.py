"""Scenario ``agent_request``: what the router adds to an agent-sized request (a system
prompt of about 20k tokens and 20 tools, :mod:`tests.agent_request`) on each API shape
it serves, side by side with the same request asked of the backend directly.

The backend is the fast fake (:mod:`benchmarks.fastfake`, answers of ``chunks`` tokens,
streamed back to back), which costs next to nothing, so what is measured is the
router's own work on a ~90 KB request: parsing it, checking it, translating it
(Responses and Messages to chat completions, and the answer back), a preset.

* ``slm_server``: the router (telemetry off) in front of the fakes, asked in each
  shape: chat completions (passed through), the Responses API and Anthropic's Messages
  API (both translated to chat completions), whole and streamed; and the same three
  for a second model, on a second fake, whose registry entry has a preset that caps the
  output and sets sampling parameters (``+preset``).
* ``direct``: the fake asked with the chat completions body the router sends it for
  that request, byte for byte: before the rounds, one router in front of fakes that
  record what they get is asked each request once (:func:`upstream_bodies`).

Every request differs from the one before in its user message (a serial number), as an
agent's turns do. Each round starts the fakes (and the router) afresh, targets
alternating (direct, slm_server, direct, slm_server, ...), and measures every cell
after an unrecorded warm-up: the latency the client sees (p50, p90), the time to first
token, the router's CPU per request; the comparisons are taken within each round.

With ``benchmarks.run --against REV`` the router of that commit (``slm_server@<rev>``)
runs in every round too, after this tree's, and a table sets the two side by side.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import httpx
import uvloop

from benchmarks.loadgen import SERIAL, Workload
from benchmarks.machine import ROOT
from benchmarks.overhead import AGAINST, Rounds, measure_load
from benchmarks.report import DASH, DIVIDE, TIMES, Check, show, spread, table
from benchmarks.servers import BENCH_MODEL, Server, fast_fake, slm_router
from tests.agent_request import (
    AGENT_RULES,
    chat_request,
    messages_request,
    responses_request,
    system_prompt,
)

TARGETS: Final = ("direct", "slm_server")
CHAT: Final = "/v1/chat/completions"
ENDPOINTS: Final = {"chat": CHAT, "responses": "/v1/responses", "messages": "/v1/messages"}
LABELS: Final = {
    "chat": "chat completions",
    "responses": "Responses",
    "messages": "Messages",
}
# A model whose entry has a preset: the cap binds (the client asks for more), two
# parameters are set over the client's, one is a default.
PRESET_MODEL: Final = f"{BENCH_MODEL}-preset"
PRESET: Final = {
    "max_output_tokens": 128,
    "set": {"temperature": 0.6, "top_p": 0.95},
    "default": {"top_k": 20},
}
ENTRIES: Final = {PRESET_MODEL: {"preset": PRESET}}
ASK: Final = f"[{SERIAL.decode()}] Which tool lists a directory? Answer with its name."
BUILDERS: Final[dict[str, Callable[[str, str, str, int], dict[str, Any]]]] = {
    "chat": chat_request,
    "responses": responses_request,
    "messages": messages_request,
}


@dataclass(frozen=True)
class Variant:
    """One API shape, for the model without a preset or for the one with it."""

    shape: str
    preset: bool = False

    @property
    def key(self) -> str:
        return f"{self.shape}+preset" if self.preset else self.shape

    @property
    def label(self) -> str:
        return LABELS[self.shape] + (", preset" if self.preset else "")

    @property
    def endpoint(self) -> str:
        return ENDPOINTS[self.shape]

    @property
    def model(self) -> str:
        return PRESET_MODEL if self.preset else BENCH_MODEL

    def body(self, system: str, max_tokens: int, stream: bool) -> bytes:
        """The request as the client sends it to the router."""
        body = BUILDERS[self.shape](self.model, system, ASK, max_tokens)
        if stream:
            body["stream"] = True
        return json.dumps(body).encode()


@dataclass(frozen=True)
class Cell:
    variant: Variant
    stream: bool
    concurrency: int

    @property
    def kind(self) -> str:
        return "stream" if self.stream else "whole"

    @property
    def key(self) -> str:
        return f"{self.variant.key}-{self.kind}-c{self.concurrency}"


@dataclass(frozen=True)
class Plan:
    """How long and how hard the scenario runs."""

    rounds: int = 3
    warmup: float = 1.0
    duration: float = 3.0
    # Tokens per answer, streamed back to back.
    chunks: int = 32
    # The client's output bound (above the preset's cap, which then binds).
    max_tokens: int = 256
    rules: int = AGENT_RULES
    concurrency: tuple[int, ...] = (1, 8)
    preset_concurrency: tuple[int, ...] = (1,)

    def cells(self, round_index: int = 1) -> list[Cell]:
        """Every cell, in the order measured in round ``round_index``: each cell with the
        preset next to the same cell without it, so the two see the machine alike, after
        it in odd rounds and before it in even ones, so neither always comes first."""
        levels = {False: self.concurrency, True: self.preset_concurrency}
        found = []
        for c in dict.fromkeys(self.concurrency + self.preset_concurrency):
            for shape in ENDPOINTS:
                for stream in (False, True):
                    pair = [
                        Cell(Variant(shape, preset), stream, c)
                        for preset in (False, True)
                        if c in levels[preset]
                    ]
                    found += pair if round_index % 2 else pair[::-1]
        return found

    def shown(self) -> list[Cell]:
        """The cells in the order of the tables: without the preset, then with it."""
        return sorted(self.cells(), key=lambda cell: (cell.variant.preset, cell.concurrency))

    def variants(self) -> list[tuple[Variant, bool]]:
        return list(dict.fromkeys((cell.variant, cell.stream) for cell in self.cells()))


QUICK = Plan(rounds=1, warmup=0.2, duration=0.8, concurrency=(1,))

Say = Callable[[str], None]


@dataclass(frozen=True)
class Bodies:
    """Each request as the client sends it to the router, and as the router sends it
    on to the backend; the sizes of both and of the router's answer."""

    sent: dict[str, bytes]
    upstream: dict[str, bytes]
    answer_bytes: dict[str, int]

    def sizes(self) -> dict[str, dict[str, int]]:
        return {
            key: {
                "sent": len(self.sent[key]),
                "upstream": len(self.upstream[key]),
                "answer": self.answer_bytes[key],
            }
            for key in self.sent
        }


def _key(variant: Variant, stream: bool) -> str:
    return f"{variant.key}-{'stream' if stream else 'whole'}"


def upstream_bodies(plan: Plan, workdir: Path, say: Say) -> Bodies:
    """Every request of the plan sent once through a router in front of fakes that
    record what they get: the chat completions body the router sends upstream, byte
    for byte, for ``direct`` to send the fake itself."""
    workdir.mkdir(parents=True, exist_ok=True)
    system = system_prompt(plan.rules)
    record = workdir / "upstream.jsonl"
    sent: dict[str, bytes] = {}
    upstream: dict[str, bytes] = {}
    answers: dict[str, int] = {}
    with (
        fast_fake(workdir, plan.chunks, 0.0, BENCH_MODEL, record=record) as plain,
        fast_fake(workdir, plan.chunks, 0.0, PRESET_MODEL, record=record) as preset,
        slm_router(workdir, [plain, preset], entries=ENTRIES) as router,
        httpx.Client(base_url=router.url, timeout=30, trust_env=False) as http,
    ):
        for variant, stream in plan.variants():
            key = _key(variant, stream)
            body = variant.body(system, plan.max_tokens, stream)
            before = record.stat().st_size if record.exists() else 0
            answer = http.post(
                variant.endpoint, content=body, headers={"content-type": "application/json"}
            )
            if answer.status_code != 200:
                raise RuntimeError(f"{key}: {answer.status_code} {answer.text[:300]}")
            with record.open("rb") as lines:
                lines.seek(before)
                [line] = lines.read().splitlines()
            seen = json.loads(line)
            if seen["path"] != CHAT:
                raise RuntimeError(f"{key}: the router sent {seen['path']}, not {CHAT}")
            # The user's message, where each request's serial goes, passes unchanged.
            forwarded = seen["body"].encode()
            if forwarded.count(SERIAL) != 1:
                raise RuntimeError(f"{key}: the user's message is not once in {forwarded[:300]!r}")
            sent[key], upstream[key], answers[key] = body, forwarded, len(answer.content)
    for key, size in Bodies(sent, upstream, answers).sizes().items():
        say(
            f"  {key:24} sent {size['sent']:,} bytes, upstream {size['upstream']:,}, "
            f"answer {size['answer']:,}"
        )
    return Bodies(sent, upstream, answers)


def _workload(cell: Cell, server: Server, direct: bool, bodies: Bodies) -> Workload:
    key = _key(cell.variant, cell.stream)
    return Workload(
        url=server.url,
        model=cell.variant.model,
        endpoint=CHAT if direct else cell.variant.endpoint,
        stream=cell.stream,
        body=bodies.upstream[key] if direct else bodies.sent[key],
    )


def targets() -> tuple[str, ...]:
    """The targets of each round: direct, this tree's router, and the router of each
    commit it is compared with (``--against``)."""
    return (*TARGETS, *(f"{ROUTER}@{revision}" for revision in AGAINST))


def run_target(
    name: str, round_index: int, plan: Plan, bodies: Bodies, workdir: Path, say: Say
) -> dict[str, Any]:
    """Fresh servers for one target, every cell, servers stopped."""
    workdir.mkdir(parents=True, exist_ok=True)
    direct = name == "direct"
    _, _, revision = name.partition("@")
    tree = AGAINST[revision] if revision else ROOT
    with contextlib.ExitStack() as stack:
        fakes = {
            model: stack.enter_context(fast_fake(workdir, plan.chunks, 0.0, model))
            for model in (BENCH_MODEL, PRESET_MODEL)
        }
        router = (
            None
            if direct
            else stack.enter_context(
                slm_router(workdir, [*fakes.values()], entries=ENTRIES, tree=tree)
            )
        )

        async def all_cells() -> list[dict[str, Any]]:
            found = []
            for cell in plan.cells(round_index):
                fake = fakes[cell.variant.model]
                server = router or fake
                workload = _workload(cell, server, direct, bodies)
                summary = await measure_load(
                    server, fake, workload, cell.concurrency, plan.warmup, plan.duration
                )
                found.append(
                    {
                        "cell": cell.key,
                        "shape": cell.variant.shape,
                        "preset": cell.variant.preset,
                        "kind": cell.kind,
                        "concurrency": cell.concurrency,
                    }
                    | summary
                )
            return found

        cells = uvloop.run(all_cells())
    for cell in cells:
        say(f"  round {round_index} {name:10} {cell['cell']:26} {_brief(cell)}")
    return {"round": round_index, "target": name, "cells": cells}


def _brief(cell: dict[str, Any]) -> str:
    cpu = cell["server"]["cpu_us_per_request"]
    errors = f" errors {cell['errors']}" if cell["errors"] else ""
    return (
        f"{cell['throughput_rps']:7.1f} req/s  p50 {cell['latency_ms']['p50'] or 0:7.2f} ms  "
        f"p90 {cell['latency_ms']['p90'] or 0:7.2f} ms  "
        f"server CPU {(cpu or 0) / 1000:6.2f} ms/req  "
        f"client CPU {cell['client_cpu_share']:.0%}{errors}"
    )


def run_rounds(plan: Plan, workdir: Path, say: Say) -> tuple[Bodies, list[dict[str, Any]]]:
    say("the requests, and what the router sends upstream for each:")
    bodies = upstream_bodies(plan, workdir / "upstream", say)
    runs = [
        run_target(name, r, plan, bodies, workdir / f"r{r}-{name}", say)
        for r in range(1, plan.rounds + 1)
        for name in targets()
    ]
    return bodies, runs


# ----------------------------------------------------------------- aggregation

ROUTER = "slm_server"
CPU = "server.cpu_us_per_request"


def _ms(stat: dict[str, Any], digits: int = 2) -> str:
    return show(stat, digits)


def _cpu_ms(rounds: Rounds, cell: str, target: str = ROUTER) -> dict[str, Any]:
    stat = rounds.stat(target, cell, CPU)
    return {k: v / 1000 if k != "n" and v is not None else v for k, v in stat.items()}


def _preset_twin(cell: Cell) -> str:
    """The same cell without the preset."""
    return Cell(Variant(cell.variant.shape), cell.stream, cell.concurrency).key


def tables(rounds: Rounds, plan: Plan, bodies: Bodies) -> str:
    header = ["request", "answer", "clients", "direct p50 (ms)", "router p50 (ms)"]
    header += ["added p50 (ms)", "added p90 (ms)", f"router {DIVIDE} direct, p50"]
    header += ["added TTFT p50 (ms)", "router CPU per request (ms)", "router req/s"]
    rows = []
    for cell in plan.shown():
        key = cell.key
        ttft = _ms(rounds.added(ROUTER, key, "ttft_ms.p50")) if cell.stream else DASH
        rows.append(
            [
                cell.variant.label,
                cell.kind,
                str(cell.concurrency),
                _ms(rounds.stat("direct", key, "latency_ms.p50")),
                _ms(rounds.stat(ROUTER, key, "latency_ms.p50")),
                _ms(rounds.added(ROUTER, key, "latency_ms.p50")),
                _ms(rounds.added(ROUTER, key, "latency_ms.p90")),
                _ms(rounds.ratio(ROUTER, "direct", key, "latency_ms.p50")) + f" {TIMES}",
                ttft,
                _ms(_cpu_ms(rounds, key)),
                show(rounds.stat(ROUTER, key, "throughput_rps"), 0),
            ]
        )
    parts = [
        "What the router adds to one agent-sized request (direct: the fake asked with the "
        "chat completions body the router sends it for that request); added and "
        f"{DIVIDE} are taken within each round:",
        table(header, rows),
    ]
    presets = [cell for cell in plan.shown() if cell.variant.preset]
    if presets:
        preset_rows = []
        for cell in presets:
            twin = _preset_twin(cell)
            cpu = rounds.stat(ROUTER, cell.key, CPU)
            plain = rounds.stat(ROUTER, twin, CPU)
            preset_rows.append(
                [
                    LABELS[cell.variant.shape],
                    cell.kind,
                    str(cell.concurrency),
                    show(plain, 0),
                    show(cpu, 0),
                    show(_difference(rounds, cell.key, twin, CPU), 0),
                    show(_difference(rounds, cell.key, twin, "latency_ms.p50"), 3),
                ]
            )
        parts += [
            f"What a preset ({json.dumps(PRESET)}) costs: the same request for a model "
            "whose entry has it, beside the model without one, in the same rounds:",
            table(
                [
                    "request",
                    "answer",
                    "clients",
                    "router CPU, no preset (µs)",
                    "router CPU, preset (µs)",
                    "preset's CPU (µs)",
                    "preset's added p50 (ms)",
                ],
                preset_rows,
            ),
        ]
    for revision in AGAINST:
        parts += [
            f"This tree's router beside the router of `{revision}`, in the same rounds "
            f"(its added p50 and CPU per request; {DIVIDE} taken within each round):",
            against_table(rounds, plan, f"{ROUTER}@{revision}"),
        ]
    size_rows = [
        [key, f"{size['sent']:,}", f"{size['upstream']:,}", f"{size['answer']:,}"]
        for key, size in bodies.sizes().items()
    ]
    parts += [
        "The bodies (bytes): the request as sent to the router, as the router sends it "
        "upstream (what `direct` sends), and the router's answer to it:",
        table(["request", "sent", "upstream", "router's answer"], size_rows),
        "CPU used by each process, in cores (CPU seconds per wall second), and the fake's "
        "CPU per request (µs):",
        headroom_table(rounds, plan),
    ]
    return "\n\n".join(parts)


def against_table(rounds: Rounds, plan: Plan, other: str) -> str:
    """This tree's router beside ``other`` (the router of another commit), per cell."""
    header = ["request", "answer", "clients", "added p50 (ms)", "added p50, other (ms)"]
    header += ["router CPU (ms)", "router CPU, other (ms)", f"CPU {DIVIDE} other"]
    rows = []
    for cell in plan.shown():
        key = cell.key
        ratio = rounds.ratio(ROUTER, other, key, CPU)
        rows.append(
            [
                cell.variant.label,
                cell.kind,
                str(cell.concurrency),
                _ms(rounds.added(ROUTER, key, "latency_ms.p50")),
                _ms(rounds.added(other, key, "latency_ms.p50")),
                _ms(_cpu_ms(rounds, key)),
                _ms(_cpu_ms(rounds, key, other)),
                show(ratio, 3) + f" {TIMES}",
            ]
        )
    return table(header, rows)


def _between(
    rounds: Rounds, a: str, b: str, path: str, combine: Callable[[float, float], float]
) -> dict[str, Any]:
    """``combine`` of the router's ``path`` in cell ``a`` and in cell ``b``, within each
    round, then median [min-max] across rounds."""
    values_a = rounds.values(ROUTER, a, path)
    values_b = rounds.values(ROUTER, b, path)
    return spread(
        None if x is None or y is None else combine(x, y)
        for x, y in zip(values_a, values_b, strict=True)
    )


def _difference(rounds: Rounds, a: str, b: str, path: str) -> dict[str, Any]:
    return _between(rounds, a, b, path, lambda x, y: x - y)


def _ratio(rounds: Rounds, a: str, b: str, path: str) -> dict[str, Any]:
    return _between(rounds, a, b, path, lambda x, y: x / y if y else float("nan"))


def headroom_table(rounds: Rounds, plan: Plan) -> str:
    header = ["target", "cell", "client CPU share", "fake CPU share", "router CPU share"]
    header += ["fake CPU per request (µs)"]
    rows = []
    for target in targets():
        for cell in plan.shown():
            key = cell.key
            router = (
                DASH if target == "direct" else show(rounds.stat(target, key, "server.cpu_share"))
            )
            rows.append(
                [
                    target,
                    key,
                    show(rounds.stat(target, key, "client_cpu_share")),
                    show(rounds.stat(target, key, "backend.cpu_share")),
                    DASH if target == "direct" else router,
                    show(_fake_cpu_per_request(rounds, target, key), 0),
                ]
            )
    return table(header, rows)


def _fake_cpu_per_request(rounds: Rounds, target: str, cell: str) -> dict[str, Any]:
    cpu = rounds.values(target, cell, "backend.cpu_s")
    ok = rounds.values(target, cell, "ok")
    return spread(None if c is None or not n else c / n * 1e6 for c, n in zip(cpu, ok, strict=True))


def headlines(rounds: Rounds, plan: Plan) -> list[tuple[str, dict[str, Any]]]:
    """Router ÷ direct, p50 latency, and the added p50, at one client."""
    found = []
    for cell in plan.shown():
        if cell.concurrency != 1 or cell.variant.preset:
            continue
        found.append(
            (
                f"{cell.variant.key} {cell.kind} c=1: p50 router {DIVIDE} direct ({TIMES})",
                rounds.ratio(ROUTER, "direct", cell.key, "latency_ms.p50"),
            )
        )
    return found


# A translated shape may cost the router up to this many times what passing the same
# request through costs it (CPU per request, one client): the Messages API one more
# serialisation of the body and the answer's own translation; the Responses API that
# and one serialisation more, since its answer repeats the request's instructions and
# tools (92 KB for this request, where a Messages answer is 0.4 KB).
TRANSLATION_LIMITS: Final = {"responses": 3.0, "messages": 2.0}
# A preset's rules may add up to this share to the router's CPU per request, where the
# router writes the body anew anyway: for every cell but a whole chat completions answer,
# which without a preset goes upstream byte for byte and with one is serialised again
# (shown in the preset's table, not checked).
PRESET_LIMIT: Final = 1.15


def checks(rounds: Rounds, plan: Plan) -> list[Check]:
    """Ratios within each round, at one client: each translated shape's CPU per request
    beside chat completions' (the pass-through), and each shape's with the preset
    beside without (see :data:`PRESET_LIMIT`)."""
    found = []
    if 1 in plan.concurrency:
        for stream in (False, True):
            chat = Cell(Variant("chat"), stream, 1)
            for shape in ("responses", "messages"):
                cell = Cell(Variant(shape), stream, 1)
                found.append(
                    Check(
                        f"router CPU per request, {LABELS[shape]} {DIVIDE} chat completions, "
                        f"{cell.kind}, c=1",
                        TRANSLATION_LIMITS[shape],
                        TIMES,
                        _ratio(rounds, cell.key, chat.key, CPU),
                    )
                )
    if 1 in plan.concurrency and 1 in plan.preset_concurrency:
        for shape in ENDPOINTS:
            for stream in (False, True):
                if shape == "chat" and not stream:
                    continue
                cell = Cell(Variant(shape, preset=True), stream, 1)
                found.append(
                    Check(
                        f"router CPU per request, preset {DIVIDE} none, {LABELS[shape]}, "
                        f"{cell.kind}, c=1",
                        PRESET_LIMIT,
                        TIMES,
                        _ratio(rounds, cell.key, _preset_twin(cell), CPU),
                    )
                )
    return found
