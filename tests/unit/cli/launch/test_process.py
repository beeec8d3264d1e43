"""The agent run under ``launch``: its files in a private directory (0700, 0600) that is
gone afterwards and never under the home, its exit status passed on, signals passed to it,
and no agent left behind, even when ``launch`` itself is killed. A small Python script
plays the agent; ``run_agent`` runs in a process of its own, as under ``launch``."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.processes import ROOT, pid_alive, poll

FAKE_AGENT = """\
#!{python}
import json, os, signal, sys, time
from pathlib import Path

out = Path(os.environ["FAKE_AGENT_OUT"])
mode = os.environ.get("FAKE_AGENT_MODE", "exit")


def caught(sig, _frame):
    out.with_suffix(".signal").write_text(str(sig))
    sys.exit(40 + sig)


if mode == "catch":
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, caught)
private = Path(sys.argv[1])
report = {{
    "pid": os.getpid(),
    "argv": sys.argv[1:],
    "var": os.environ.get("FAKE_VAR"),
    "dir_mode": private.stat().st_mode & 0o777,
    "files": {{p.name: [p.stat().st_mode & 0o777, p.read_text()] for p in private.iterdir()}},
}}
out.write_text(json.dumps(report))
if mode == "exit":
    sys.exit(int(os.environ.get("FAKE_AGENT_STATUS", "0")))
while True:
    time.sleep(0.05)
"""

RUNNER = """\
import sys
from slm_server.cli.launch.agents import Invocation
from slm_server.cli.launch.process import run_agent


def build(private):
    return Invocation(("agent", str(private), "--flag"), {"FAKE_VAR": "set"}, {"conf.json": "{}"})


sys.exit(run_agent(sys.argv[1], build))
"""


@dataclass
class Scene:
    agent: Path
    home: Path
    tmp: Path
    out: Path
    started: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start(self, **env: str) -> subprocess.Popen[bytes]:
        full = {
            **os.environ,
            "HOME": str(self.home),
            "TMPDIR": str(self.tmp),
            "FAKE_AGENT_OUT": str(self.out),
            **env,
        }
        runner = subprocess.Popen(
            [sys.executable, "-c", RUNNER, str(self.agent)],
            cwd=ROOT,
            env=full,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # the runner and its agent: one group to clean up
        )
        self.started.append(runner)
        return runner

    def report(self) -> dict[str, Any]:
        poll(lambda: self.out.exists() and self.out.stat().st_size > 0, 20, "the agent's report")
        report: dict[str, Any] = json.loads(self.out.read_text())
        return report


@pytest.fixture
def scene(tmp_path: Path) -> Iterator[Scene]:
    agent = tmp_path / "fake-agent"
    agent.write_text(FAKE_AGENT.format(python=sys.executable))
    agent.chmod(0o755)
    (tmp_path / "home").mkdir()
    (tmp_path / "tmp").mkdir()
    scene = Scene(agent, tmp_path / "home", tmp_path / "tmp", tmp_path / "report.json")
    yield scene
    for runner in scene.started:  # whatever a failed test left running
        with contextlib.suppress(ProcessLookupError):
            os.killpg(runner.pid, signal.SIGKILL)
        runner.wait()


def test_the_agent_gets_its_private_files_and_its_exit_status_is_passed_on(scene: Scene) -> None:
    runner = scene.start(FAKE_AGENT_STATUS="7")
    assert runner.wait(timeout=30) == 7
    report = scene.report()
    private = Path(report["argv"][0])
    assert report["argv"][1:] == ["--flag"]
    assert report["var"] == "set"
    assert report["dir_mode"] == 0o700
    assert report["files"] == {"conf.json": [0o600, "{}"]}
    assert private.parent == scene.tmp
    assert not private.exists()  # removed once the agent has exited
    assert list(scene.tmp.iterdir()) == []
    assert list(scene.home.iterdir()) == []  # nothing written under the home


@pytest.mark.parametrize(
    ("sig", "mode", "status"),
    [
        (signal.SIGTERM, "catch", 40 + signal.SIGTERM),
        (signal.SIGHUP, "catch", 40 + signal.SIGHUP),
        # Not from a terminal (no terminal here): passed on, not swallowed.
        (signal.SIGINT, "catch", 40 + signal.SIGINT),
        # An agent the signal ends: 128 + the signal, as a shell reports it.
        (signal.SIGTERM, "wait", 128 + signal.SIGTERM),
    ],
)
def test_a_signal_to_launch_reaches_the_agent_and_leaves_nothing(
    scene: Scene, sig: int, mode: str, status: int
) -> None:
    runner = scene.start(FAKE_AGENT_MODE=mode)
    agent_pid = scene.report()["pid"]
    runner.send_signal(sig)
    assert runner.wait(timeout=30) == status
    poll(lambda: not pid_alive(agent_pid), 10, "the agent to exit")
    if mode == "catch":
        assert scene.out.with_suffix(".signal").read_text() == str(int(sig))
    assert list(scene.tmp.iterdir()) == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_an_agent_outlives_no_killed_launch(scene: Scene) -> None:
    runner = scene.start(FAKE_AGENT_MODE="catch")
    agent_pid = scene.report()["pid"]
    runner.kill()
    runner.wait(timeout=10)
    poll(lambda: not pid_alive(agent_pid), 10, "the agent to follow launch")
    # It was asked to go with SIGTERM, which it caught (and said so) before exiting.
    assert scene.out.with_suffix(".signal").read_text() == str(int(signal.SIGTERM))
