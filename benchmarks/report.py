"""Turning rounds of measurements into medians with [min-max], pass/fail checks and
committed result files.

    stat = spread([1.2, 1.0, 1.4])          # {"median": 1.2, "min": 1.0, "max": 1.4, ...}
    show(stat, 2)                           # "1.20 [1.00 to 1.40]", with an en dash
    Check("added p50, c=1", 1.0, "ms", stat).passed
    write_results("overhead", report, markdown, rows)
"""

from __future__ import annotations

import datetime
import json
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.loadgen import write_csv
from benchmarks.machine import ROOT

RESULTS = ROOT / "benchmarks" / "results"
# Typography for the tables, spelled as escapes so the source stays ASCII-unambiguous.
DASH = "\u2013"
TIMES = "\u00d7"
DIVIDE = "\u00f7"


def spread(values: Iterable[float | None]) -> dict[str, Any]:
    """Median, min and max of the values that exist (None and NaN are left out)."""
    kept = [v for v in values if v is not None and not math.isnan(v)]
    if not kept:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {
        "median": statistics.median(kept),
        "min": min(kept),
        "max": max(kept),
        "n": len(kept),
    }


def kind_spread(trials: Iterable[dict[str, Any]], kind: str, key: str) -> dict[str, Any]:
    """:func:`spread` of ``key`` over the trials of one ``kind``."""
    return spread(t.get(key) for t in trials if t["kind"] == kind)


def event_time(ts: str) -> float:
    """A watchdog event's stamp (``2026-12-06T13:41:43.117Z``) as wall-clock seconds."""
    return datetime.datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


def pick(summary: dict[str, Any], path: str) -> float | None:
    """A value from a nested summary by a dotted path (``latency_ms.p50``)."""
    node: Any = summary
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return float(node) if isinstance(node, int | float) else None


def _number(value: float, digits: int) -> str:
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.{digits}f}"


def show(stat: dict[str, Any], digits: int = 2) -> str:
    """``median [min-max]`` (an en dash between); a single run shows its value alone."""
    if stat["median"] is None:
        return DASH
    median = _number(stat["median"], digits)
    if stat["n"] < 2:
        return median
    return f"{median} [{_number(stat['min'], digits)}{DASH}{_number(stat['max'], digits)}]"


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


@dataclass(frozen=True)
class Check:
    """One target: the median across rounds against a limit."""

    name: str
    limit: float
    unit: str
    stat: dict[str, Any]
    at_least: bool = False  # True when the value must reach the limit from below

    @property
    def passed(self) -> bool:
        median = self.stat["median"]
        if median is None:
            return False
        return bool(median >= self.limit if self.at_least else median <= self.limit)

    @property
    def shown(self) -> str:
        return show(self.stat, 0 if self.unit == "µs" else 2)

    def line(self) -> str:
        sign = "≥" if self.at_least else "≤"
        verdict = "PASS" if self.passed else "FAIL"
        return f"{verdict}  {self.name}: {self.shown} {self.unit} (target {sign} {self.limit:g})"

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "limit": self.limit,
            "unit": self.unit,
            "at_least": self.at_least,
            "passed": self.passed,
            **self.stat,
        }


def checks_table(checks: Sequence[Check]) -> str:
    rows = [
        (
            c.name,
            f"{'≥' if c.at_least else '≤'} {c.limit:g} {c.unit}",
            c.shown,
            "pass" if c.passed else "**FAIL**",
        )
        for c in checks
    ]
    return table(("target", "limit", f"measured (median [min{DASH}max])", "result"), rows)


def result_paths(scenario: str, day: datetime.date | None = None) -> tuple[Path, Path, Path]:
    stem = f"{scenario}-{(day or datetime.date.today()).isoformat()}"
    return RESULTS / f"{stem}.json", RESULTS / f"{stem}.md", RESULTS / f"{stem}.csv"


def write_measurements(name: str, data: dict[str, Any], markdown: str) -> list[Path]:
    """``benchmarks/results/<name>-<date>.{json,md}`` for a tool that runs on its own
    (no rounds of targets, no CSV): ``data`` as JSON, ``markdown`` as it is."""
    json_path, md_path, _ = result_paths(name)
    RESULTS.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(data, indent=2) + "\n")
    md_path.write_text(markdown)
    return [json_path, md_path]


def write_results(
    scenario: str, report: dict[str, Any], markdown: str, rows: list[dict[str, Any]]
) -> list[Path]:
    """``benchmarks/results/<scenario>-<date>.{json,md,csv}``."""
    json_path, md_path, csv_path = result_paths(scenario)
    RESULTS.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(report, indent=1, default=str) + "\n")
    md_path.write_text(markdown.rstrip() + "\n")
    machine = report["machine"]
    context = {
        "scenario": scenario,
        "commit": machine["commit"],
        "cpu": machine["cpu_model"],
        "cores": machine["logical_cpus"],
    }
    write_csv(csv_path, [context | row for row in rows])
    return [json_path, md_path, csv_path]


def machine_line(report: dict[str, Any]) -> str:
    """One sentence: commit, machine, load."""
    m = report["machine"]
    load = report.get("load", {})
    seen = load.get("load_when_measuring", (m["load_1m"], m["load_5m"], m["load_15m"]))
    after = report.get("load_after")
    text = (
        f"Commit `{m['commit']}`, {m['date']}; {m['cpu_model']}, {m['logical_cpus']} logical "
        f"CPUs, {m['memory_gb']} GB, {m['platform']}, Python {m['python']}. Load average "
        f"(1/5/15 min) when the run started: {seen[0]} / {seen[1]} / {seen[2]}"
    )
    if after:
        text += f"; when it ended: {after[0]} / {after[1]} / {after[2]}"
    text += f". Source digest of `slm_server/`: `{m['source_digest']}`"
    changed = report.get("source_digest_after")
    if changed and changed != m["source_digest"]:
        text += f" at the start, `{changed}` at the end (it was edited during the run)"
    return text + "."
