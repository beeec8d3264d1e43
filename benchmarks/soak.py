"""Soak: hold many concurrent streaming clients through the router against the fake
backend for a bounded time; every request must succeed, and the router's RSS and open
file descriptors must stay flat.

    uv run python -m benchmarks.soak [--clients 200] [--seconds 180]

Writes ``benchmarks/results/soak-<date>.json`` and prints a summary; exits 1 when any
request failed or memory/descriptors grew.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import yaml

from tests.fakes.control import FakeBackend
from tests.processes import ROOT, running_router
from tests.registry_entries import registry_entry

RESULTS = ROOT / "benchmarks" / "results"


def commit() -> str:
    result = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    return result.stdout.strip() or "unknown"


async def client(
    http: httpx.AsyncClient, deadline: float, outcomes: dict[str, int], errors: list[str]
) -> None:
    body = {"model": "soak", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    while time.monotonic() < deadline:
        try:
            async with http.stream("POST", "/v1/chat/completions", json=body) as response:
                text = (await response.aread()).decode()
            if response.status_code == 200 and text.rstrip().endswith("data: [DONE]"):
                outcomes["ok"] += 1
            else:
                outcomes["failed"] += 1
                errors.append(f"{response.status_code}: {text[-200:]}")
        except httpx.HTTPError as exc:
            outcomes["failed"] += 1
            errors.append(f"{type(exc).__name__}: {exc}")


async def sample(process: psutil.Process, deadline: float, samples: list[dict[str, float]]) -> None:
    start = time.monotonic()
    while time.monotonic() < deadline:
        with process.oneshot():
            samples.append(
                {
                    "t": round(time.monotonic() - start, 1),
                    "rss_mb": process.memory_info().rss / 1e6,
                    "fds": float(process.num_fds()),
                    "cpu_s": sum(process.cpu_times()[:2]),
                }
            )
        await asyncio.sleep(2.0)


def growth(samples: list[dict[str, float]], key: str) -> float:
    """Relative growth from the first to the last third of the run (after warm-up)."""
    third = max(1, len(samples) // 3)
    early = statistics.mean(s[key] for s in samples[third : 2 * third] or samples[:third])
    late = statistics.mean(s[key] for s in samples[-third:])
    return (late - early) / early if early else 0.0


async def soak(url: str, router_pid: int, clients: int, seconds: float) -> dict[str, Any]:
    outcomes = {"ok": 0, "failed": 0}
    errors: list[str] = []
    samples: list[dict[str, float]] = []
    deadline = time.monotonic() + seconds
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    timeout = httpx.Timeout(60.0)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=timeout) as http:
        tasks = [client(http, deadline, outcomes, errors) for _ in range(clients)]
        await asyncio.gather(sample(psutil.Process(router_pid), deadline, samples), *tasks)
    return {"outcomes": outcomes, "errors": errors[:20], "samples": samples}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=180.0)
    parser.add_argument("--chunks", type=int, default=32)
    parser.add_argument("--chunk-interval", type=float, default=0.02)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, FakeBackend.start(model_id="soak") as fake:
        fake.script(chunks=args.chunks, chunk_interval_seconds=args.chunk_interval)
        workdir = Path(tmp)
        entry = registry_entry(
            "soak",
            fake.port,
            model_path="x.gguf",
            default_timeout=60,
            max_concurrency=args.clients,
            max_queue=args.clients,
        )
        (workdir / "models.yaml").write_text(yaml.safe_dump({"models": {"soak": entry}}))
        env = {
            "SLM_CONFIG": str(workdir / "models.yaml"),
            "SLM_BACKEND_LOG_DIR": str(workdir / "logs"),
            "SLM_OTEL_ENABLED": "false",
            "SLM_LLAMA_SERVER_BIN": "",
        }
        with running_router(env, workdir) as (router, url):
            result = asyncio.run(soak(url, router.pid, args.clients, args.seconds))
    samples = result["samples"]
    report = {
        "scenario": "soak",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "commit": commit(),
        "machine": {
            "cpus": psutil.cpu_count(),
            "platform": platform.platform(),
            "python": sys.version.split()[0],
        },
        "config": vars(args),
        "requests_ok": result["outcomes"]["ok"],
        "requests_failed": result["outcomes"]["failed"],
        "errors": result["errors"],
        "rss_mb_first": round(samples[0]["rss_mb"], 1),
        "rss_mb_last": round(samples[-1]["rss_mb"], 1),
        "rss_growth": round(growth(samples, "rss_mb"), 4),
        "fds_first": samples[0]["fds"],
        "fds_last": samples[-1]["fds"],
        "fds_growth": round(growth(samples, "fds"), 4),
        "router_cpu_seconds": round(samples[-1]["cpu_s"] - samples[0]["cpu_s"], 2),
        "samples": samples,
    }
    passed = (
        report["requests_failed"] == 0
        and report["requests_ok"] > 0
        and report["rss_growth"] < 0.10
        and report["fds_growth"] < 0.10
    )
    report["passed"] = passed
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"soak-{datetime.date.today().isoformat()}.json"
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(
        f"soak: {report['requests_ok']} ok, {report['requests_failed']} failed; "
        f"RSS {report['rss_mb_first']} -> {report['rss_mb_last']} MB "
        f"(growth {report['rss_growth']:+.1%}), fds {report['fds_first']:.0f} -> "
        f"{report['fds_last']:.0f}; {'PASS' if passed else 'FAIL'}; wrote {out}"
    )
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
