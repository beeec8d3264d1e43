"""The pure parts of two benchmark tools: the side-by-side targets of
``benchmarks.run --against`` and what ``benchmarks.mixed_load`` reads from the test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks import overhead
from benchmarks.mixed_load import findings, markdown


@pytest.fixture
def against() -> Iterator[None]:
    overhead.AGAINST["abc1234"] = Path("/nowhere")
    try:
        yield
    finally:
        overhead.AGAINST.clear()


def test_without_a_commit_the_targets_are_as_given() -> None:
    targets = ("direct", "bare_relay", "slm_server", "slm_server_default")
    assert overhead.with_against(targets) == targets


@pytest.mark.usefixtures("against")
def test_each_router_target_is_followed_by_itself_at_the_other_commit() -> None:
    assert overhead.with_against(("direct", "bare_relay", "slm_server", "slm_server_ui")) == (
        "direct",
        "bare_relay",
        "slm_server",
        "slm_server@abc1234",
        "slm_server_ui",
        "slm_server_ui@abc1234",
    )
    assert overhead.label_of("slm_server@abc1234") == "slm_server at abc1234"
    assert overhead.label_of("slm_server_ui@abc1234") == (
        "slm_server, pinned, dashboard open at abc1234"
    )
    assert overhead.starter("slm_server@abc1234") is not overhead.STARTERS["slm_server"]
    assert overhead.starter("slm_server_ui@abc1234") is not overhead.STARTERS["slm_server_ui"]
    assert overhead.starter("direct") is overhead.STARTERS["direct"]


OUTPUT = """
mixed load for 120 s: {'chat:ok': 78, 'one_deadline_cut:cut': 9, 'stream:ok': 83}
router after a third: 68.9 MB, 20 fds; at the end: 70.5 MB, 16 fds
watchdog: 6 failures counted, 5 trips, 4 not confirmed, 9 deadline cuts not counted
.
1 passed in 132.22s (0:02:12)
"""


def test_the_mixed_load_run_is_read_from_what_the_test_prints() -> None:
    found = findings(OUTPUT)
    assert found["seconds"] == 120
    assert found["endings"] == {"chat:ok": 78, "one_deadline_cut:cut": 9, "stream:ok": 83}
    assert found["router"] == {
        "rss_mb_after_a_third": 68.9,
        "fds_after_a_third": 20,
        "rss_mb_at_end": 70.5,
        "fds_at_end": 16,
    }
    assert found["watchdog"].startswith("6 failures counted, 5 trips")
    text = markdown(
        {"date": "2026-12-06", "asked_seconds": 600, "status": 0, "wall_seconds": 612.0}
        | {"machine": {"commit": "abc1234", "cpu_model": "cpu", "logical_cpus": 2}}
        | found
    )
    assert "passed in 612 s" in text
    assert "| one_deadline_cut:cut | 9 |" in text
    assert "70.5 MB and 16 at the end" in text


def test_a_tool_s_measurements_are_written_beside_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from benchmarks import report

    monkeypatch.setattr(report, "RESULTS", tmp_path / "results")
    json_path, md_path = report.write_measurements("tool", {"a": 1}, "# Tool\n")
    assert json_path.parent == md_path.parent == tmp_path / "results"
    assert json_path.name.startswith("tool-") and json_path.suffix == ".json"
    assert json_path.read_text() == '{\n  "a": 1\n}\n'
    assert md_path.read_text() == "# Tool\n"
