"""The pure parts of the ``instructions`` benchmark: reading callgrind's totals and
the side-by-side table."""

from __future__ import annotations

from pathlib import Path

from benchmarks.instructions import _total, render


def test_the_total_adds_up_every_dump_of_the_run(tmp_path: Path) -> None:
    out = tmp_path / "callgrind.out"
    out.write_text("version: 1\nsummary: 1234\nevents: Ir\nfl=(1) x.c\n10 5\ntotals: 1234\n")
    (tmp_path / "callgrind.out.1").write_text("events: Ir\nsummary: 98765\n")
    (tmp_path / "other.out").write_text("totals: 99999999\n")  # another run's
    assert _total(out) == 1234 + 98765


def test_two_variants_are_shown_with_the_change() -> None:
    text = render(
        {
            "4e5a1f0": {"whole": 682_714.3, "chunk, spaced": 47_000.0},
            "7b91567": {"whole": 657_407.7, "chunk, spaced": 47_000.0},
        }
    )
    lines = text.splitlines()
    assert lines[0] == "| instructions per | 4e5a1f0 | 7b91567 | change |"
    assert "| whole | 682,714 | 657,408 | -3.7% |" in lines
    assert "| chunk, spaced | 47,000 | 47,000 | +0.0% |" in lines
    assert "change" not in render({"only": {"whole": 1.0}})
