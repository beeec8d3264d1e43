"""The benchmarks' bare byte relay (the floor the router is measured against): each
client connection reaches the backend its first request names, whole answers and
streams pass through byte for byte, and keep-alive holds across requests."""

from __future__ import annotations

from pathlib import Path

import uvloop

from benchmarks.loadgen import Workload, closed_loop
from benchmarks.servers import bare_relay, fast_fake


def test_the_bare_relay_reaches_the_backend_each_connection_names(tmp_path: Path) -> None:
    with (
        fast_fake(tmp_path, chunks=3, model="bench") as three,
        fast_fake(tmp_path, chunks=5, model="bench-burst") as five,
        bare_relay(tmp_path, [three, five]) as relay,
    ):
        for backend, chunks in ((three, 3), (five, 5)):
            for stream in (True, False):
                work = Workload(
                    url=relay.url, model=backend.model, stream=stream, max_tokens=chunks
                )
                run = uvloop.run(closed_loop(work, 2, requests=10))
                assert run.summary()["ok"] == 10, run.summary()
                # Each answer is the named backend's own: 3 tokens, or 5.
                assert [s.tokens for s in run.samples] == [chunks] * 10
