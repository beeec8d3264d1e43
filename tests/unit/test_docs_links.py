"""The README and the pages under ``docs/``: every relative link reaches a file, every
``#anchor`` names a heading of its target (by GitHub's rules), and the README stays short.

GitHub's anchors: the heading's text (code spans and links by their text) in lower case,
every character but letters, digits, spaces, ``-`` and ``_`` dropped, each space made a
``-``; a repeated anchor gets ``-1``, ``-2``, ... in the order of the headings.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README_MAX_LINES = 200

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
INLINE_LINK_TEXT = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks."""
    lines: list[str] = []
    fenced = False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for one heading's text, before duplicates are numbered."""
    text = CODE_SPAN.sub(lambda m: m.group(2), heading)
    text = INLINE_LINK_TEXT.sub(lambda m: m.group(1), text)
    text = text.strip().lower()
    kept = "".join(c for c in text if c.isalnum() or c in " -_")
    return kept.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every anchor the headings of a markdown text define."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    for line in prose_lines(text):
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(text: str) -> list[str]:
    """The link targets of a markdown text, outside code blocks and code spans."""
    targets: list[str] = []
    for line in prose_lines(text):
        targets.extend(LINK.findall(CODE_SPAN.sub("", line)))
    return targets


def broken_links(files: list[Path]) -> list[str]:
    """One line per relative link or anchor in ``files`` that leads nowhere."""
    problems: list[str] = []
    for source in files:
        text = source.read_text(encoding="utf-8")
        for target in links(text):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):
                continue  # http(s), mailto: not checked here
            path_part, _, anchor = target.partition("#")
            dest = (source.parent / path_part).resolve() if path_part else source
            where = source.relative_to(ROOT) if source.is_relative_to(ROOT) else source
            if not dest.exists():
                problems.append(f"{where}: {target}: no such file")
                continue
            if (
                anchor
                and dest.suffix == ".md"
                and anchor not in anchors(dest.read_text(encoding="utf-8"))
            ):
                problems.append(f"{where}: {target}: no heading #{anchor} in {dest.name}")
    return problems


def documentation() -> list[Path]:
    return [ROOT / "README.md", ROOT / "SETUP.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_every_link_in_the_readme_and_docs_leads_somewhere() -> None:
    assert broken_links(documentation()) == []


def test_readme_fits_in_two_hundred_lines() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES


def test_readme_opens_with_the_two_set_up_commands() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = text.split("```sh\n", 1)[1].split("```", 1)[0].splitlines()
    assert [line.split("#")[0].strip() for line in block] == ["./start.sh", "./scripts/test.sh"]


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("Quick start", "quick-start"),
        ("GET /v1/models", "get-v1models"),
        ("POST /v1/models/load and /v1/models/unload", "post-v1modelsload-and-v1modelsunload"),
        ("Processes on a backend's port", "processes-on-a-backends-port"),
        ("`GET /v1/telemetry/effective-config`", "get-v1telemetryeffective-config"),
        ("The router's time, and what changed", "the-routers-time-and-what-changed"),
        ("snake_case and kebab-case", "snake_case-and-kebab-case"),
        ("A [linked](other.md) heading", "a-linked-heading"),
        ("Responses ↔ chat", "responses--chat"),
    ],
)
def test_anchors_follow_githubs_rules(heading: str, anchor: str) -> None:
    assert slug(heading) == anchor


def test_repeated_headings_are_numbered_and_code_blocks_are_not_headings() -> None:
    text = "# Settings\n## Settings\n### Settings\n```sh\n# not a heading\n```\n"
    assert anchors(text) == {"settings", "settings-1", "settings-2"}


def test_a_dead_file_or_anchor_is_reported(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (tmp_path / "README.md").write_text(
        "# Top\n\n## Part two\n\n"
        "[ok](docs/page.md#a-section) [ok too](#part-two) [web](https://example.com/x#y)\n"
        "[gone](docs/missing.md) [no anchor](docs/page.md#nowhere) [here](#part-three)\n"
        "`[in code](docs/missing.md)`\n",
        encoding="utf-8",
    )
    (docs / "page.md").write_text(
        "# Page\n\n## A section\n\n[back](../README.md#top) [bad](../README.md#bottom)\n",
        encoding="utf-8",
    )
    problems = broken_links([tmp_path / "README.md", docs / "page.md"])
    assert [p.split(": ", 1)[1] for p in problems] == [
        "docs/missing.md: no such file",
        "docs/page.md#nowhere: no heading #nowhere in page.md",
        "#part-three: no heading #part-three in README.md",
        "../README.md#bottom: no heading #bottom in README.md",
    ]
