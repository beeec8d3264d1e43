"""The ``agent_request`` benchmark on real processes, in a fraction of a second per cell:
the router forwards each shape's agent-sized request to the fake as a chat completions
body (which ``direct`` then sends the fake itself, byte for byte), and the load
generator reads every shape's answers, whole and streamed, from the router and from the
fake alike."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.agent_request import PRESET, Plan, run_target, upstream_bodies
from benchmarks.loadgen import SERIAL

PLAN = Plan(rounds=1, warmup=0.05, duration=0.2, chunks=3, concurrency=(1,))


def test_every_shape_is_measured_directly_and_through_the_router(tmp_path: Path) -> None:
    said: list[str] = []
    bodies = upstream_bodies(PLAN, tmp_path / "upstream", said.append)
    assert len(said) == len(bodies.sent) == 12
    # Chat completions pass through as they came; the others are translated.
    assert bodies.upstream["chat-whole"] == bodies.sent["chat-whole"]
    for key, forwarded in bodies.upstream.items():
        chat = json.loads(forwarded)
        assert forwarded.count(SERIAL) == 1, key
        assert chat["messages"][0]["role"] == "system", key
        assert len(chat["tools"]) == 20, key
        assert chat.get("stream", False) is key.endswith("-stream"), key
        if "+preset" in key:
            assert chat["max_tokens"] == PRESET["max_output_tokens"], key
            assert (chat["temperature"], chat["top_p"], chat["top_k"]) == (0.6, 0.95, 20), key
        else:
            assert chat["max_tokens"] == PLAN.max_tokens and "temperature" not in chat, key

    for target in ("direct", "slm_server"):
        run = run_target(target, 1, PLAN, bodies, tmp_path / target, said.append)
        assert [cell["cell"] for cell in run["cells"]] == [c.key for c in PLAN.cells()]
        for cell in run["cells"]:
            assert cell["ok"] > 0 and cell["errors"] == {}, (target, cell["cell"], cell["errors"])
            assert cell["server"]["cpu_us_per_request"] is not None
            if cell["kind"] == "stream":  # the shape's token events were recognised
                assert cell["ttft_ms"]["p50"] is not None, (target, cell["cell"])
