"""What exporting a span costs the router's export thread: the router's exporter
(``otlp_wire``'s encoding, POSTed with httpx) beside the SDK's public
``OTLPSpanExporter`` (its protobuf encoder, POSTed with requests), side by side.

    python -m benchmarks.otlp_encoding            # writes benchmarks/results/otlp-encoding-<date>.*
    python -m benchmarks.otlp_encoding --quick    # a short trial; writes nothing

Both exporters send the same spans to the same local sink answering 200
(:mod:`benchmarks.otlp_sink`, its own process, so its work is not counted), and the
figure is the CPU time of the exporting thread (``time.thread_time``) per span: the
encoding, the HTTP request and the wait for its answer, which is what the
BatchSpanProcessor's thread spends on each span in the router. The spans are made by
the router's own telemetry (``Telemetry.open_span`` / ``close_span``) for chat requests
with varied token counts, parents and request ids, in batches of 512 (the
BatchSpanProcessor's default batch under load) and of 8 (a quiet router: the batch its
5-second schedule finds at ~2 requests a second). Rounds interleave the two exporters,
in alternating order; each figure is the median over rounds, with [min-max]. The
encoding alone is measured the same way.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from benchmarks.machine import describe_machine
from benchmarks.report import DASH, TIMES, write_measurements
from benchmarks.servers import otlp_sink
from slm_server.router.apis.table import TABLE
from slm_server.router.call.exchange import Exchange
from slm_server.router.observe.otlp_export import ExportConfig, OtlpHttpExporter
from slm_server.router.observe.otlp_wire import PairCache, encode_request
from slm_server.router.observe.telemetry import UNIQUE_ATTRIBUTES, Inbound, Telemetry
from slm_server.settings import TelemetrySettings
from tests.registry_entries import model_spec

CHAT_PATH = "/v1/chat/completions"

ROUNDS = 9
SPANS_PER_ROUND = 8192
BATCHES = (512, 8)
# The router's CPU per whole answer at the defaults, 1 client (defaults-2026-12-05.md).
ROUTER_DEFAULTS_US = 317.0


class Kept(SpanExporter):
    """Keeps the finished spans the router's telemetry hands over."""

    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans.extend(spans)
        return SpanExportResult.SUCCESS


def router_spans(count: int) -> list[ReadableSpan]:
    """``count`` spans as the router makes them for chat requests, half of them
    streamed, half with a caller's traceparent, with varied usage and settings."""
    spec = model_spec("chat", "smollm2-135m-instruct")
    entry = spec.entry
    settings = TelemetrySettings(
        enabled=True, otlp_endpoint="http://unused:4318", service_name="slm-server", log_json=False
    )
    kept = Kept()
    telemetry = Telemetry(settings, environ={}, exporter=kept)
    telemetry.start()
    for n in range(count):
        exchange = Exchange(
            request_id=uuid.uuid4().hex, method="POST", path=CHAT_PATH, shape=TABLE.at(CHAT_PATH)
        )
        stream = n % 2 == 1
        body: dict[str, Any] = {"model": entry.id, "stream": stream, "max_tokens": 64 + n % 7 * 64}
        if n % 3:
            body["temperature"] = (0.2, 0.7, 1.0)[n % 3]
        exchange.note_request(body)
        exchange.spec = spec
        traceparent = f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-01" if n % 2 else None
        span = telemetry.open_span(exchange, Inbound(traceparent))
        assert span is not None
        exchange.status = 200
        if stream:
            exchange.first_chunk = exchange.started + 0.05 + n % 13 / 100
        exchange.note_response(
            {
                "id": f"chatcmpl-{uuid.uuid4().hex}",
                "model": entry.id,
                "choices": [{"finish_reason": "stop" if n % 5 else "length"}],
                "usage": {"prompt_tokens": 12 + n * 37 % 2000, "completion_tokens": 1 + n % 400},
            }
        )
        telemetry.close_span(span, exchange)
    assert telemetry.provider is not None
    telemetry.provider.force_flush()
    telemetry.provider.shutdown()
    assert len(kept.spans) == count
    return kept.spans


def batches(spans: list[ReadableSpan], size: int) -> list[list[ReadableSpan]]:
    return [spans[i : i + size] for i in range(0, len(spans) - size + 1, size)]


def thread_us_per_span(
    step: Callable[[list[ReadableSpan]], object], work: list[list[ReadableSpan]]
) -> float:
    """CPU time of this thread per span, in microseconds, to pass every batch to ``step``."""
    started = time.thread_time()
    for batch in work:
        step(batch)
    return (time.thread_time() - started) / sum(map(len, work)) * 1e6


def summary(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 2),
        "min": round(min(values), 2),
        "max": round(max(values), 2),
    }


def measure(spans_per_round: int, rounds: int) -> dict[str, Any]:
    spans = router_spans(spans_per_round)
    raw: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as workdir, otlp_sink(Path(workdir)) as sink:
        endpoint = f"{sink}/v1/traces"
        ours = OtlpHttpExporter(ExportConfig(endpoint, timeout=3.0), UNIQUE_ATTRIBUTES)
        sdk = OTLPSpanExporter(endpoint=endpoint, timeout=3.0)
        pairs = PairCache(unique_keys=UNIQUE_ATTRIBUTES)

        def sent(exporter: SpanExporter) -> Callable[[list[ReadableSpan]], object]:
            def step(batch: list[ReadableSpan]) -> object:
                result = exporter.export(batch)
                assert result is SpanExportResult.SUCCESS
                return result

            return step

        variants: dict[str, Callable[[list[ReadableSpan]], object]] = {
            "ours_export": sent(ours),
            "sdk_export": sent(sdk),
            "ours_encode": lambda batch: encode_request(batch, pairs),
            "sdk_encode": lambda batch: encode_spans(batch).SerializePartialToString(),
        }
        for step in variants.values():  # warm-up: connections, caches
            for size in BATCHES:
                thread_us_per_span(step, batches(spans, size)[:4])
        for round_ in range(rounds):
            order = list(variants.items())
            if round_ % 2:
                order.reverse()
            for size in BATCHES:
                work = batches(spans, size)
                if size < 64:  # small batches: the HTTP request dominates; fewer of them
                    work = work[: max(1, len(work) // 4)]
                for name, step in order:
                    raw.setdefault(f"{name}_{size}", []).append(thread_us_per_span(step, work))
        ours.shutdown()
        sdk.shutdown()  # type: ignore[no-untyped-call]
    results: dict[str, Any] = {key: summary(values) for key, values in raw.items()}
    results["raw_us_per_span"] = raw
    results["rounds"] = rounds
    results["spans_per_round"] = spans_per_round
    results["batches"] = list(BATCHES)
    results["router_defaults_us_per_answer"] = ROUTER_DEFAULTS_US
    return results


def cell(results: dict[str, Any], key: str) -> str:
    value = results[key]
    return f"{value['median']:.1f} [{value['min']:.1f}{DASH}{value['max']:.1f}]"


def report(results: dict[str, Any]) -> str:
    machine = results["machine"]
    lines = [
        f"# OTLP export: CPU of the export thread per span ({machine['date'][:10]})",
        "",
        f"Commit {machine['commit']}, {machine['cpu_model']}, {machine['logical_cpus']} logical "
        f"CPUs, Python {machine['python']}, 1-minute load {machine['load_1m']} (a shared "
        f"machine); {results['rounds']} interleaved rounds of {results['spans_per_round']} "
        f"spans made by the router's telemetry for chat requests; medians [min{DASH}max] across "
        "rounds, µs of the exporting thread's CPU time per span.",
        "",
        "| batch | router's exporter (otlp_wire + httpx) | SDK's OTLPSpanExporter | SDK ÷ router's"
        " | saved per span |",
        "|---|---|---|---|---|",
    ]
    for kind, label in (("export", "encoded and POSTed"), ("encode", "encoding only")):
        for size in results["batches"]:
            ours, sdk = results[f"ours_{kind}_{size}"], results[f"sdk_{kind}_{size}"]
            ratio = sdk["median"] / ours["median"]
            lines.append(
                f"| {size} spans, {label} | {cell(results, f'ours_{kind}_{size}')} | "
                f"{cell(results, f'sdk_{kind}_{size}')} | {ratio:.1f}{TIMES} | "
                f"{sdk['median'] - ours['median']:.1f} µs |"
            )
    saved = results["sdk_export_512"]["median"] - results["ours_export_512"]["median"]
    router = results["router_defaults_us_per_answer"]
    lines += [
        "",
        f"One span per request: at the defaults the router costs {router:g} µs of CPU per "
        f"whole answer at 1 client (`defaults-2026-12-05.md`, spans exported), so the SDK's "
        f"exporter would add {saved:.0f} µs to it under load ({saved / router:.0%}).",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short trial; writes nothing")
    args = parser.parse_args()
    results = measure(2048, 2) if args.quick else measure(SPANS_PER_ROUND, ROUNDS)
    results["machine"] = describe_machine()
    text = report(results)
    print(text)
    if not args.quick:
        write_measurements("otlp-encoding", results, text)


if __name__ == "__main__":
    main()
