"""An asyncio load generator for OpenAI-compatible servers.

    # closed loop: N clients, each sending its next request when the last one ended
    uv run python -m benchmarks.loadgen --url http://127.0.0.1:8000 --model smollm2-135m-instruct \\
        --concurrency 1 8 --duration 10 --stream --out /tmp/run
    # open loop: Poisson arrivals at a mean rate, whatever the server does
    uv run python -m benchmarks.loadgen --url ... --model ... --rate 20 50 --duration 10

It reports throughput, latency, time to first token (TTFT) and the time between streamed
tokens, with p50/p90/p95/p99, errors by kind, and the client's own CPU time, as JSON and
CSV that carry the commit, the machine and the configuration. Every request gets a
unique prompt prefix unless ``--same-prompt``, so a server's prompt cache never turns
prefill into a cache hit. A workload may instead give its whole ``body`` (bytes sent as
they are, each ``{{serial}}`` in them replaced by a number unique to the request).

The client is a bare HTTP/1.1 ``asyncio.Protocol`` over httptools' response parser on
uvloop, one keep-alive connection per client, so that it costs far less per request than
the server it measures; ``client_cpu_share`` (client CPU seconds per wall second) shows
whether it kept out of the way. A streamed token is a server-sent event whose
``content`` (chat) or ``text`` (completions) is a non-empty string, a Responses
``response.output_text.delta`` or a Messages ``text_delta``; events that arrive in one
read share that read's time. A stream must end with its shape's last event (``data:
[DONE]``, ``response.completed`` or ``.incomplete``, ``message_stop``) and a whole
answer must hold its shape's list (``choices``, ``output``, ``content``).

Open-loop latency is measured from each request's scheduled arrival, so a server that
falls behind is charged for the wait (no coordinated omission).
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import itertools
import json
import random
import re
import socket
import time
from array import array
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final, cast
from urllib.parse import urlsplit

import httptools
import uvloop

from benchmarks.machine import describe_machine

TOKEN_EVENT: Final = re.compile(rb'"(?:content|text)": ?"(?!")')
COMPLETION_TOKENS: Final = re.compile(rb'"(?:completion|output)_tokens": ?(\d+)')
# In a workload's own body, replaced by a number unique to each request.
SERIAL: Final = b"{{serial}}"
DEFAULT_PROMPT: Final = "Write one short sentence about the sea."
# Inter-token gaps kept per run, for the pooled percentiles (8 bytes each).
MAX_GAPS: Final = 2_000_000


@dataclass(frozen=True)
class AnswerShape:
    """How an API shape's answers are read: what makes a streamed event a token, the
    events that end a stream, and the field every whole answer has."""

    name: str
    token_event: re.Pattern[bytes]
    stream_ends: tuple[bytes, ...]
    whole_field: str
    # The last event as an error names it when a stream ends without it.
    last_event: str


CHAT_ANSWERS: Final = AnswerShape("chat", TOKEN_EVENT, (b"data: [DONE]",), "choices", "[DONE]")
ANSWER_SHAPES: Final = {
    "/chat/completions": CHAT_ANSWERS,
    "/completions": CHAT_ANSWERS,
    "/responses": AnswerShape(
        "responses",
        re.compile(rb'"type": ?"response\.output_text\.delta"'),
        (b"event: response.completed", b"event: response.incomplete"),
        "output",
        "response.completed",
    ),
    "/messages": AnswerShape(
        "messages",
        re.compile(rb'"type": ?"text_delta"'),
        (b"event: message_stop",),
        "content",
        "message_stop",
    ),
}


def answer_shape(endpoint: str) -> AnswerShape:
    """How the answers of ``endpoint`` are read (chat completions' way by default)."""
    for suffix, shape in ANSWER_SHAPES.items():
        if endpoint.endswith(suffix):
            return shape
    return CHAT_ANSWERS


@dataclass(frozen=True)
class Workload:
    """What every request of a run looks like; ``body``, when given, is every request's
    body as it is (with :data:`SERIAL` replaced), and ``stream`` only says how to read
    the answers."""

    url: str
    model: str
    endpoint: str = "/v1/chat/completions"
    stream: bool = False
    max_tokens: int = 64
    prompt: str = DEFAULT_PROMPT
    unique_prompts: bool = True
    extra_body: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    timeout: float = 60.0
    body: bytes | None = None

    @property
    def host(self) -> str:
        return urlsplit(self.url).hostname or "127.0.0.1"

    @property
    def port(self) -> int:
        return urlsplit(self.url).port or 80

    @property
    def path(self) -> str:
        return urlsplit(self.url).path.rstrip("/") + self.endpoint

    @property
    def answers(self) -> AnswerShape:
        return answer_shape(self.endpoint)


class RequestMaker:
    """The bytes of each request: fixed head, unique prompt prefix, JSON body."""

    def __init__(self, workload: Workload) -> None:
        self.workload = workload
        self._serial = itertools.count()
        self._run = f"{random.getrandbits(32):08x}"
        head = [f"POST {workload.path} HTTP/1.1", f"host: {workload.host}:{workload.port}"]
        head += ["content-type: application/json", "accept: */*"]
        head += [f"{k}: {v}" for k, v in workload.headers.items()]
        self._head = ("\r\n".join(head) + "\r\n").encode()
        self._parts = None if workload.body is None else workload.body.split(SERIAL)

    def _prompt(self) -> str:
        if not self.workload.unique_prompts:
            return self.workload.prompt
        return f"[{self._run}-{next(self._serial)}] {self.workload.prompt}"

    def next(self) -> bytes:
        w = self.workload
        if self._parts is not None:
            serial = f"{self._run}-{next(self._serial)}".encode()
            data = serial.join(self._parts)
            return self._head + b"content-length: %d\r\n\r\n" % len(data) + data
        body: dict[str, Any] = {"model": w.model, "max_tokens": w.max_tokens}
        if w.endpoint.endswith("/chat/completions"):
            body["messages"] = [{"role": "user", "content": self._prompt()}]
        else:
            body["prompt"] = self._prompt()
        if w.stream:
            body["stream"] = True
        body.update(w.extra_body)
        data = json.dumps(body).encode()
        return self._head + b"content-length: %d\r\n\r\n" % len(data) + data


@dataclass
class Sample:
    """One request. Times are seconds from its start (open loop: its scheduled start)."""

    started: float
    status: int = 0
    latency: float = 0.0
    ttft: float | None = None
    tokens: int = 0
    error: str | None = None
    resent: bool = False


class Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection that runs one request at a time."""

    def __init__(self, gaps: array[float]) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.gaps = gaps
        self._done: asyncio.Future[None] | None = None
        self._sample: Sample | None = None
        self._shape = CHAT_ANSWERS
        self._now = 0.0
        self._last_token = 0.0
        self._pending = b""
        self._body: list[bytes] = []
        self._done_seen = False
        self._keep_alive = True
        self._sse = False
        self._start = 0.0

    @classmethod
    async def open(cls, host: str, port: int, gaps: array[float]) -> Connection:
        loop = asyncio.get_running_loop()
        _transport, connection = await loop.create_connection(lambda: cls(gaps), host, port)
        return connection

    @property
    def usable(self) -> bool:
        return self.transport is not None and not self.transport.is_closing() and self._keep_alive

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self._done is not None and not self._done.done():
            self._done.set_exception(ConnectionResetError("connection closed mid-response"))

    def data_received(self, data: bytes) -> None:
        self._now = time.perf_counter()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            if self._done is not None and not self._done.done():
                self._done.set_exception(exc)
            if self.transport is not None:
                self.transport.close()

    async def request(
        self,
        data: bytes,
        sample: Sample,
        started: float,
        timeout: float,
        shape: AnswerShape = CHAT_ANSWERS,
    ) -> None:
        """Send ``data`` and fill ``sample`` in; ``started`` is the clock the times
        count from; ``shape`` says how to read the answer."""
        assert self.transport is not None
        self._sample, self._pending, self._body, self._shape = sample, b"", [], shape
        self._done_seen, self._sse, self._start = False, False, started
        self._done = asyncio.get_running_loop().create_future()
        self.transport.write(data)
        try:
            await asyncio.wait_for(self._done, timeout)
        finally:
            self._sample = None

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"content-type":
            self._sse = b"event-stream" in value

    def on_headers_complete(self) -> None:
        if self._sample is not None:
            self._sample.status = self.parser.get_status_code()
        self._keep_alive = self.parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        sample = self._sample
        if sample is None:
            return
        if not self._sse or sample.status != 200:
            self._body.append(body)
            return
        data = self._pending + body
        cut = data.rfind(b"\n\n")
        if cut < 0:
            self._pending = data
            return
        events, self._pending = data[: cut + 2], data[cut + 2 :]
        shape = self._shape
        if any(end in events for end in shape.stream_ends):
            self._done_seen = True
        tokens = len(shape.token_event.findall(events))
        if not tokens:
            return
        now = self._now
        if sample.ttft is None:
            sample.ttft = now - self._start
            gaps = [0.0] * (tokens - 1)
        else:
            gaps = [now - self._last_token] + [0.0] * (tokens - 1)
        if len(self.gaps) < MAX_GAPS:
            self.gaps.extend(gaps)
        self._last_token = now
        sample.tokens += tokens

    def on_message_complete(self) -> None:
        sample = self._sample
        if sample is None or self._done is None:
            return
        sample.latency = self._now - self._start
        if sample.status != 200:
            text = b"".join(self._body)[:200].decode("utf-8", "replace")
            sample.error = f"http {sample.status}: {text}"
        elif not self._sse:
            whole = b"".join(self._body)
            found = COMPLETION_TOKENS.search(whole)
            sample.tokens = int(found.group(1)) if found else 0
            named = self._shape.whole_field
            if b'"%s"' % named.encode() not in whole:
                sample.error = f"answer without {named}"
        elif not self._done_seen:
            sample.error = f"stream ended without {self._shape.last_event}"
        if not self._done.done():
            self._done.set_result(None)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


@dataclass
class Run:
    """Everything one load level produced."""

    mode: str  # "closed" or "open"
    level: float  # concurrency, or arrivals per second
    samples: list[Sample]
    gaps: array[float]
    wall_seconds: float
    client_cpu_seconds: float

    def summary(self) -> dict[str, Any]:
        ok = [s for s in self.samples if s.error is None]
        errors = Counter(_error_kind(s.error) for s in self.samples if s.error is not None)
        tokens = sum(s.tokens for s in ok)
        latencies = sorted(s.latency for s in ok)
        ttfts = sorted(s.ttft for s in ok if s.ttft is not None)
        per_token = sorted(
            (s.latency - s.ttft) / (s.tokens - 1) for s in ok if s.ttft is not None and s.tokens > 1
        )
        gaps = sorted(self.gaps)
        wall = self.wall_seconds
        return {
            "mode": self.mode,
            "level": self.level,
            "requests": len(self.samples),
            "ok": len(ok),
            "errors": dict(errors),
            "resent": sum(1 for s in self.samples if s.resent),
            "wall_s": round(wall, 3),
            "throughput_rps": len(ok) / wall if wall else 0.0,
            "tokens_per_s": tokens / wall if wall else 0.0,
            "latency_ms": _percentiles(latencies),
            "ttft_ms": _percentiles(ttfts),
            "inter_token_ms": _percentiles(gaps),
            "time_per_token_ms": _percentiles(per_token),
            "client_cpu_s": round(self.client_cpu_seconds, 4),
            "client_cpu_share": self.client_cpu_seconds / wall if wall else 0.0,
            "client_cpu_us_per_request": (
                self.client_cpu_seconds / len(self.samples) * 1e6 if self.samples else None
            ),
            "client_cpu_us_per_token": self.client_cpu_seconds / tokens * 1e6 if tokens else None,
        }


def _error_kind(error: str) -> str:
    return error.split(":", 1)[0]


def percentile(ordered: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of sorted values, interpolated linearly."""
    if not ordered:
        return float("nan")
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _percentiles(ordered: Sequence[float]) -> dict[str, float | None]:
    if not ordered:
        return {"p50": None, "p90": None, "p95": None, "p99": None, "mean": None}
    return {
        "p50": percentile(ordered, 50) * 1000,
        "p90": percentile(ordered, 90) * 1000,
        "p95": percentile(ordered, 95) * 1000,
        "p99": percentile(ordered, 99) * 1000,
        "mean": sum(ordered) / len(ordered) * 1000,
    }


async def _send(
    pool: list[Connection],
    gaps: array[float],
    workload: Workload,
    data: bytes,
    sample: Sample,
    started: float,
) -> Connection | None:
    """One request on a pooled connection (or a new one); the connection to keep.

    A server may close an idle keep-alive connection just as the next request goes out
    on it (llama-server does, right after some streamed answers). When a reused
    connection fails before any byte of the answer came back, the request is sent
    once more on a new connection, as HTTP clients commonly do, and counted in
    ``resent``."""
    connection = pool.pop() if pool else None
    if connection is not None and not connection.usable:
        connection.close()
        connection = None
    for attempt in (1, 2):
        reused = connection is not None
        try:
            if connection is None:
                connection = await Connection.open(workload.host, workload.port, gaps)
            await connection.request(data, sample, started, workload.timeout, workload.answers)
        except (TimeoutError, OSError, httptools.HttpParserError) as exc:
            if connection is not None:
                connection.close()
                connection = None
            if attempt == 1 and reused and sample.status == 0 and not isinstance(exc, TimeoutError):
                sample.resent = True
                continue
            sample.error = (
                "timeout" if isinstance(exc, TimeoutError) else f"{type(exc).__name__}: {exc}"
            )
            sample.latency = time.perf_counter() - started
            return None
        break
    return connection if connection is not None and connection.usable else None


async def closed_loop(
    workload: Workload,
    concurrency: int,
    *,
    duration: float | None = None,
    requests: int | None = None,
) -> Run:
    """``concurrency`` clients, each starting its next request when its last one ended,
    until ``duration`` seconds passed or ``requests`` were sent (whichever first)."""
    if duration is None and requests is None:
        raise ValueError("give a duration or a number of requests")
    maker = RequestMaker(workload)
    samples: list[Sample] = []
    gaps: array[float] = array("d")
    budget = itertools.count() if requests is None else iter(range(requests))
    pools: list[list[Connection]] = [[] for _ in range(concurrency)]
    begin = time.perf_counter()
    end = begin + duration if duration is not None else float("inf")
    cpu = time.process_time()

    async def client(pool: list[Connection]) -> None:
        backoff = 0.0
        for _ in budget:
            started = time.perf_counter()
            if started >= end:
                return
            sample = Sample(started)
            samples.append(sample)
            kept = await _send(pool, gaps, workload, maker.next(), sample, started)
            if kept is not None:
                pool.append(kept)
            # A refused connection fails at once; do not spin on it.
            backoff = min(0.05, backoff * 2 or 0.001) if sample.status == 0 else 0.0
            if backoff:
                await asyncio.sleep(backoff)

    try:
        await asyncio.gather(*(client(pool) for pool in pools))
    finally:
        wall = time.perf_counter() - begin
        cpu = time.process_time() - cpu
        for pool in pools:
            for connection in pool:
                connection.close()
    return Run("closed", concurrency, samples, gaps, wall, cpu)


async def open_loop(
    workload: Workload, rate: float, *, duration: float, seed: int | None = None
) -> Run:
    """Poisson arrivals at ``rate`` per second for ``duration`` seconds, each on an
    idle connection or a new one; waits for the stragglers."""
    maker = RequestMaker(workload)
    rng = random.Random(seed)
    samples: list[Sample] = []
    gaps: array[float] = array("d")
    pool: list[Connection] = []
    tasks: set[asyncio.Task[None]] = set()
    begin = time.perf_counter()
    cpu = time.process_time()

    async def one(scheduled: float) -> None:
        sample = Sample(scheduled)
        samples.append(sample)
        kept = await _send(pool, gaps, workload, maker.next(), sample, scheduled)
        if kept is not None:
            pool.append(kept)

    try:
        arrival = begin
        while True:
            arrival += rng.expovariate(rate)
            if arrival - begin >= duration:
                break
            delay = arrival - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.ensure_future(one(arrival))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*tasks)
    finally:
        wall = time.perf_counter() - begin
        cpu = time.process_time() - cpu
        for connection in pool:
            connection.close()
    return Run("open", rate, samples, gaps, wall, cpu)


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    """Flat rows (nested dicts become ``outer.inner`` columns)."""
    flat = [_flatten(row) for row in rows]
    columns = list(dict.fromkeys(key for row in flat for key in row))
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, columns)
        writer.writeheader()
        writer.writerows(flat)


def _flatten(row: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in row.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def _arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="base URL, e.g. http://127.0.0.1:8000")
    parser.add_argument("--model", required=True)
    parser.add_argument("--endpoint", default="/v1/chat/completions")
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--prompt", default=DEFAULT_PROMPT)
    parser.add_argument("--same-prompt", action="store_true", help="no unique prefixes")
    parser.add_argument("--extra-body", default="{}", help="JSON merged into every body")
    parser.add_argument("--header", action="append", default=[], help="NAME: VALUE")
    parser.add_argument("--timeout", type=float, default=60.0)
    levels = parser.add_mutually_exclusive_group()
    levels.add_argument("--concurrency", type=int, nargs="+", help="closed-loop levels")
    levels.add_argument("--rate", type=float, nargs="+", help="open-loop arrivals per second")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per level")
    parser.add_argument("--requests", type=int, help="closed loop: stop after this many")
    parser.add_argument("--warmup", type=float, default=1.0, help="unrecorded seconds first")
    parser.add_argument("--out", type=Path, help="write OUT.json, OUT.csv, OUT-requests.csv")
    return parser.parse_args(argv)


async def _main(args: argparse.Namespace) -> dict[str, Any]:
    headers = dict(h.split(":", 1) for h in args.header)
    workload = Workload(
        url=args.url,
        model=args.model,
        endpoint=args.endpoint,
        stream=args.stream,
        max_tokens=args.max_tokens,
        prompt=args.prompt,
        unique_prompts=not args.same_prompt,
        extra_body=json.loads(args.extra_body),
        headers={k.strip(): v.strip() for k, v in headers.items()},
        timeout=args.timeout,
    )
    runs: list[Run] = []
    for level in args.rate or args.concurrency or [1]:
        if args.warmup > 0:
            if args.rate:
                await open_loop(workload, level, duration=args.warmup)
            else:
                await closed_loop(workload, int(level), duration=args.warmup)
        if args.rate:
            run = await open_loop(workload, level, duration=args.duration)
        else:
            duration = None if args.requests else args.duration
            run = await closed_loop(workload, int(level), duration=duration, requests=args.requests)
        runs.append(run)
        print(_line(run.summary()), flush=True)
    config = {k: v for k, v in asdict(workload).items() if k != "headers"}
    report: dict[str, Any] = {
        "machine": describe_machine(),
        "config": config,
        "levels": [run.summary() for run in runs],
    }
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
        context = {"commit": report["machine"]["commit"], "cpu": report["machine"]["cpu_model"]}
        context |= {
            "cores": report["machine"]["logical_cpus"],
            "load_1m": report["machine"]["load_1m"],
        }
        rows = [
            context | {"url": workload.url, "stream": workload.stream} | s for s in report["levels"]
        ]
        write_csv(args.out.with_suffix(".csv"), rows)
        per_request = [
            {"mode": run.mode, "level": run.level} | asdict(s) for run in runs for s in run.samples
        ]
        write_csv(args.out.parent / f"{args.out.name}-requests.csv", per_request)
    return report


def _line(summary: dict[str, Any]) -> str:
    unit = "clients" if summary["mode"] == "closed" else "req/s offered"

    def ms(block: dict[str, float | None]) -> str:
        p50, p99 = block["p50"], block["p99"]
        return "-" if p50 is None or p99 is None else f"{p50:.2f}/{p99:.2f}"

    return (
        f"{summary['level']:g} {unit}: {summary['ok']}/{summary['requests']} ok, "
        f"{summary['throughput_rps']:.1f} req/s, {summary['tokens_per_s']:.0f} tok/s, "
        f"latency p50/p99 {ms(summary['latency_ms'])} ms, TTFT {ms(summary['ttft_ms'])} ms, "
        f"client CPU {summary['client_cpu_share']:.0%}"
        + (f", errors {summary['errors']}" if summary["errors"] else "")
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = _arguments(argv)
    report = uvloop.run(_main(args))
    return 0 if all(level["ok"] for level in report["levels"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
