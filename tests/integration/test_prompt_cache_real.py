"""The prompt cache inside the footprint, with the real llama-server: the size the
launcher gives it by default (twice the KV cache) holds however many distinct long
prompts come, and the footprint the router admits the backend by covers what it holds.

Without ``--cache-ram`` the server's own default (8 GiB) keeps every prompt state
(about 9 MiB each here), and the resident memory grows with every new prompt."""

from __future__ import annotations

import random
from pathlib import Path

import psutil
import pytest

from tests import one_shot
from tests.integration.real_stack import example_registry, llama_server_bin
from tests.integration.watched import watched
from tests.processes import free_port, poll

pytestmark = pytest.mark.real_model

WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "eta",
    "theta",
    "iota",
    "kappa",
    "lambda",
    "mu",
    "nu",
    "xi",
]
PROMPTS = 6
MIB = 1 << 20


def prompt(seed: int) -> str:
    """About 400 tokens, different from every other seed's from the first word on."""
    rng = random.Random(seed)
    return f"{seed} " + " ".join(rng.choice(WORDS) for _ in range(280))


def resident_mb(pid: int) -> int:
    return int(psutil.Process(pid).memory_info().rss) // MIB


def test_the_default_prompt_cache_holds_its_size_and_the_footprint_covers_it(
    tmp_path: Path,
) -> None:
    ports = {role: free_port() for role in ("standard", "gemma", "embeddings")}
    models = example_registry(ports, ("standard",))["models"]
    # 512 cells of SmolLM2's 30 layers x 3 KV heads x 64, K and V in f16: a 12 MiB KV
    # cache (11.25, rounded up), so a prompt cache of 24 MiB: two or three prompts.
    models["standard"].update(context_length=512, max_concurrency=1)
    with watched(tmp_path, models, router=False, llama_server=llama_server_bin()) as stack:
        state = stack.state("standard")
        assert state["prompt_cache_mb"] == 24, state
        assert state["footprint_mb"] == state["memory_measured_mb"] + 24, state
        pid = stack.pid("standard")
        argv = psutil.Process(pid).cmdline()
        assert argv[argv.index("--cache-ram") + 1] == "24"
        url = f"http://127.0.0.1:{stack.port('standard')}/v1/chat/completions"

        def ask(seed: int) -> None:
            body = {
                "messages": [{"role": "user", "content": prompt(seed)}],
                "max_tokens": 1,
                "temperature": 0,
            }
            answer = one_shot.post(url, json=body, timeout=120)
            assert answer.status_code == 200, answer.text
            assert answer.json()["usage"]["prompt_tokens"] > 300

        ask(0)  # the first full micro-batch touches the compute buffers
        served_one = resident_mb(pid)
        for seed in range(1, PROMPTS + 1):
            ask(seed)
        held = resident_mb(pid)
        log = next((tmp_path / "logs").glob("llama-*.log")).read_text(errors="replace")
        # The cache filled and kept to its size by dropping the oldest prompts ...
        assert log.count("making room for prompt cache entry") >= PROMPTS - 3, log[-2000:]
        # ... so what it holds did not grow with the prompts (6 x ~9 MiB without it).
        assert held - served_one <= 24 + 4, (served_one, held)

        def covered() -> bool:
            now = stack.state("standard")
            seen = now.get("memory_resident_mb")
            return isinstance(seen, int) and seen >= held - 2 and now["footprint_mb"] >= seen

        poll(covered, 10, "the sweep to measure it and the footprint to cover it")
        assert stack.state("standard")["prompt_cache_mb"] == 24
