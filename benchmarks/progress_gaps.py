"""The longest silence of a healthy llama-server that reports its prompt progress:
what the watchdog's silence limit (``SLM_WATCHDOG_SILENCE_SECONDS``) must stay above.

    uv run python -m benchmarks.progress_gaps            # ~3 minutes on two cores

The pinned llama-server, started directly with the default entries' command lines as
the launcher plans them (``config/models.yaml.example``: SmolLM2 135M, two slots of
2,048 tokens; Gemma 3 270M, one slot of 32,768), on one thread and on the machine's
default, with the launcher's logical batch (512) and with llama-server's own (2048).
Each is sent a long prompt (about 1,800 tokens for SmolLM2, about 8,000 for Gemma) with
``stream`` and ``return_progress`` — on SmolLM2 while a second stream generates on the
other slot, as the router's admission allows. The silences that count: the longest gap
before and between the events of the reading stream (its prompt progress reports), and
between the tokens of the generating one (held up while the other's batch is decoded).
Written to ``benchmarks/results/progress-gaps-<date>.{json,md}``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.machine import ROOT, describe_machine
from benchmarks.report import DASH, machine_line, table, write_measurements
from benchmarks.servers import _process, free_port
from slm_server.launch.llama_argv import ModelFiles, native_argv
from slm_server.registry.schema import parse_registry
from tests.integration.real_stack import example_registry, llama_server_bin

WORDS = (
    "the lighthouse keeper watched the storm roll over the harbour while ships "
    "turned for home and gulls rode the wind above the grey water "
)
# Words of the long prompt per model (about 1.3 tokens each for these tokenizers).
PROMPT_WORDS = {"standard": 1350, "gemma": 6000}


def entry_argv(role: str, port: int, threads: int | None, batch: int | None) -> list[str]:
    """The launcher's llama-server command line for ``role`` of the example registry,
    with the thread count and logical batch of the variant."""
    registry = example_registry({"standard": port, "gemma": port, "embeddings": port}, (role,))
    text = json.dumps(registry)
    spec = parse_registry(text, ROOT / "config" / "models.yaml.example").models[0]
    entry = spec.entry
    template = entry.chat_template_file
    files = ModelFiles(
        model=str(ROOT / str(entry.model_path)),
        chat_template_file=str(ROOT / template) if template else None,
        draft_model=None,
        mmproj=None,
    )
    argv = native_argv(llama_server_bin(), entry, files)
    if threads is not None:
        argv += ["--threads", str(threads), "--threads-batch", str(threads)]
    if batch is not None:  # the later flag wins
        argv += ["--batch-size", str(batch)]
    return argv


async def stream_times(
    client: httpx.AsyncClient, url: str, model: str, prompt: str, max_tokens: int
) -> dict[str, Any]:
    """One streamed request with progress: the time of each event, by kind."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "stream": True,
        "return_progress": True,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
    }
    started = time.perf_counter()
    times: list[tuple[float, str]] = []
    total = 0
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as answer:
        if answer.status_code != 200:
            raise RuntimeError(f"{answer.status_code}: {(await answer.aread())[:300]!r}")
        async for line in answer.aiter_lines():
            if not line.startswith("data: {"):
                continue
            data = json.loads(line[6:])
            kind = "progress" if "prompt_progress" in data else "token"
            if kind == "progress":
                total = data["prompt_progress"]["total"]
            times.append((time.perf_counter() - started, kind))
    return {"times": times, "total": total}


def gaps(times: list[tuple[float, str]], total: int) -> dict[str, float]:
    """The longest silences of one stream: before its first event, between any two
    events before its first token (reading the prompt), between tokens."""
    first_token = next((i for i, (_, kind) in enumerate(times) if kind == "token"), len(times))
    stamps = [0.0] + [t for t, _ in times[: first_token + 1]]
    reading = [b - a for a, b in itertools.pairwise(stamps)]
    tokens = [t for t, kind in times if kind == "token"]
    between = [b - a for a, b in itertools.pairwise(tokens)]
    return {
        "first_event_s": round(times[0][0], 3) if times else 0.0,
        "longest_reading_gap_s": round(max(reading, default=0.0), 3),
        "time_to_first_token_s": round(times[first_token][0], 3) if tokens else 0.0,
        "longest_token_gap_s": round(max(between, default=0.0), 3),
        "reports": sum(1 for _, kind in times if kind == "progress"),
        "prompt_tokens": total,
    }


async def measure(url: str, model: str, words: int, seed: int, slots: int) -> dict[str, Any]:
    prompt = f"Story {seed}: " + (WORDS * (words // len(WORDS.split()) + 1))
    prompt = " ".join(prompt.split()[:words])
    async with httpx.AsyncClient(timeout=600.0) as client:
        if slots < 2:
            reading = await stream_times(client, url, model, prompt, 8)
            return {"reading": gaps(reading["times"], reading["total"]), "generating": None}
        # A request generating on the other slot while the long prompt is read.
        generating = asyncio.ensure_future(
            stream_times(client, url, model, f"Count slowly, {seed}.", 400)
        )
        await asyncio.sleep(0.5)  # its generation under way before the long prompt
        reading = await stream_times(client, url, model, prompt, 8)
        generated = await generating
    return {
        "reading": gaps(reading["times"], reading["total"]),
        "generating": gaps(generated["times"], generated["total"]),
    }


VARIANTS = (
    ("1 thread, as launched", 1, None),
    ("1 thread, batch 2048", 1, 2048),
    ("default threads, as launched", None, None),
    ("default threads, batch 2048", None, 2048),
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--roles", nargs="+", default=["standard", "gemma"])
    args = parser.parse_args()
    started = time.time()
    machine = describe_machine()
    rows: list[dict[str, Any]] = []
    workdir = Path(os.environ.get("TMPDIR", "/tmp")) / "progress-gaps"
    workdir.mkdir(parents=True, exist_ok=True)
    for role in args.roles:
        for label, threads, batch in VARIANTS:
            port = free_port()
            argv = entry_argv(role, port, threads, batch)
            url = f"http://127.0.0.1:{port}"
            with _process(argv, workdir / f"{role}-{port}.log", url + "/health", 120):
                model = argv[argv.index("--alias") + 1]
                slots = int(argv[argv.index("--parallel") + 1])
                asyncio.run(measure(url, model, 200, 0, slots))  # warm up
                result = asyncio.run(measure(url, model, PROMPT_WORDS[role], 1, slots))
            rows.append({"model": model, "variant": label, **result})
            print(model, label, json.dumps(result), flush=True)
    report = {
        "machine": machine,
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "duration_s": round(time.time() - started, 1),
        "rows": rows,
    }
    markdown = render(report)
    for path in write_measurements("progress-gaps", report, markdown):
        print(f"wrote {path}")
    print(markdown)
    return 0


def render(report: dict[str, Any]) -> str:
    header = [
        "model",
        "variant",
        "reports",
        "first event (s)",
        "longest gap reading (s)",
        "time to first token (s)",
        "prompt tokens/s",
        "longest gap between tokens, other slot (s)",
    ]
    body = [
        [
            row["model"],
            row["variant"],
            str(row["reading"]["reports"]),
            f"{row['reading']['first_event_s']:.2f}",
            f"{row['reading']['longest_reading_gap_s']:.2f}",
            f"{row['reading']['time_to_first_token_s']:.2f}",
            f"{row['reading']['prompt_tokens'] / row['reading']['time_to_first_token_s']:.0f}",
            DASH
            if row["generating"] is None
            else f"{row['generating']['longest_token_gap_s']:.2f}",
        ]
        for row in report["rows"]
    ]
    return (
        "\n\n".join(
            [
                "# The longest silences of a healthy llama-server reporting its prompt progress",
                machine_line(report) + f" {report['duration_s']} s in all.",
                "A long prompt read with `return_progress` while another stream generates on "
                "the second slot; see `benchmarks/progress_gaps.py`.",
                table(header, body),
            ]
        )
        + "\n"
    )


if __name__ == "__main__":
    raise SystemExit(main())
