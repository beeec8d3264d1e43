"""``python -m slm_server launch``'s place among the commands: the agent's arguments
after ``--`` kept apart from its own, and a preflight error stopping it in-process."""

from __future__ import annotations

from pathlib import Path

import pytest

from slm_server.cli.commands import main, split_agent_args
from tests.processes import free_port


def test_the_agents_arguments_are_everything_after_the_first_double_dash() -> None:
    assert split_agent_args(["launch", "claude", "--model", "m", "--", "-p", "--", "x"]) == (
        ["launch", "claude", "--model", "m"],
        ["-p", "--", "x"],
    )
    assert split_agent_args(["launch", "codex"]) == (["launch", "codex"], [])
    # Only launch hands arguments on; any other command parses its own as ever.
    assert split_agent_args(["settings", "--", "x"]) == (["settings", "--", "x"], [])


def test_a_gateway_that_does_not_answer_stops_the_launch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SLM_ENV_FILE", str(tmp_path / "no.env"))
    monkeypatch.setenv("PATH", str(tmp_path))  # and no agent to start
    url = f"http://127.0.0.1:{free_port()}"
    assert main(["launch", "claude", "--url", url, "--", "-p", "hi"]) == 1
    said = capsys.readouterr().err.splitlines()
    assert said[0].startswith(f"launch: error: the gateway at {url} does not answer")
    assert said[1] == (
        "launch: error: claude is not on PATH: install Claude Code with "
        "npm install -g @anthropic-ai/claude-code"
    )
    assert said[-1] == "launch: Claude Code not started"
