"""``python -m slm_server launch`` as a real process against a real router (no model
server behind it: the preflight reads ``/health``, ``/v1/models`` and the registry
file, and the agents here are scripts that say what they were given): the default
model chosen, the preflight's findings on entries made to trip them, its errors
stopping the launch before any agent starts, the agent's exit status passed on, and the
user's own agent configuration under a fake home left as it was."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.processes import ROOT, RunningRouter, StartRouter, free_port
from tests.registry_entries import registry_entry

# Its module-scoped router starts once: one worker runs the whole module.
pytestmark = pytest.mark.xdist_group("test_launch")

KEY = "sk-launch-test"
AGENT_ALIAS = "roomy-agent"
# What an agent here does: write what it was given to $FAKE_AGENT_OUT, exit 13.
FAKE_AGENT = """\
#!{python}
import json, os, sys
given = {{"argv": sys.argv[1:], "env": {{k: v for k, v in os.environ.items()
    if k.startswith(("ANTHROPIC", "CLAUDE_CODE", "DISABLE_", "OPENCODE", "SLM_API_KEY"))}}}}
if "--settings" in sys.argv:
    with open(sys.argv[sys.argv.index("--settings") + 1]) as handle:
        given["settings"] = json.load(handle)
with open(os.environ["FAKE_AGENT_OUT"], "w") as out:
    json.dump(given, out)
sys.exit(13)
"""
# The user's own configuration, pointing elsewhere: launch must neither use nor touch it.
USER_FILES = {
    ".claude/settings.json": '{"env": {"ANTHROPIC_BASE_URL": "http://127.0.0.1:9"}}\n',
    ".codex/config.toml": 'model = "theirs"\nmodel_provider = "openai"\n',
    ".config/opencode/opencode.json": '{"$schema": "https://opencode.ai/config.json"}\n',
}


@dataclass
class Place:
    router: RunningRouter
    home: Path
    tmp: Path
    bin: Path
    out: Path

    @property
    def port(self) -> int:
        return int(self.router.url.rsplit(":", 1)[1])

    def launch(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        full = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("SLM_", "XDG_"))},
            "HOME": str(self.home),
            "TMPDIR": str(self.tmp),
            "PATH": f"{self.bin}{os.pathsep}{os.environ['PATH']}",
            "SLM_ENV_FILE": str(self.tmp / "no.env"),
            "SLM_ROUTER_PORT": str(self.port),
            "SLM_API_KEYS": KEY,
            "FAKE_AGENT_OUT": str(self.out),
            **env,
        }
        return subprocess.run(
            [sys.executable, "-m", "slm_server", "launch", *args],
            cwd=ROOT,
            env=full,
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
            check=False,
        )

    def given(self) -> dict[str, Any]:
        given: dict[str, Any] = json.loads(self.out.read_text())
        return given


@pytest.fixture(scope="module")
def router_process(
    start_router: StartRouter, tmp_path_factory: pytest.TempPathFactory
) -> RunningRouter:
    where = tmp_path_factory.mktemp("launch-router")
    tiny = where / "tiny.gguf"  # 10 kB of "weights": a model that rarely stops
    tiny.write_bytes(b"\0" * 10_000)
    agent_alias = {"name": AGENT_ALIAS, "preset": {"max_output_tokens": 64}}
    models = {
        "short": registry_entry(
            "short-native",
            free_port(),
            model_path=str(tiny),
            context_length=4096,
            tools={"mode": "native"},
        ),
        "roomy": registry_entry(
            "roomy",
            free_port(),
            model_path=str(tiny),
            context_length=32768,
            tools="render",
            aliases=[agent_alias],
        ),
        "embed": registry_entry("embed", free_port(), model_type="embeddings"),
    }
    return start_router(models, workdir=where, SLM_API_KEYS=KEY)


@pytest.fixture
def place(router_process: RunningRouter, tmp_path: Path) -> Iterator[Place]:
    home, tmp, bin_dir = tmp_path / "home", tmp_path / "tmp", tmp_path / "bin"
    for directory in (home, tmp, bin_dir):
        directory.mkdir()
    for name, text in USER_FILES.items():
        (home / name).parent.mkdir(parents=True, exist_ok=True)
        (home / name).write_text(text)
    for program in ("claude", "codex", "opencode"):
        script = bin_dir / program
        script.write_text(FAKE_AGENT.format(python=sys.executable))
        script.chmod(0o755)
    before = tree(home)
    yield Place(router_process, home, tmp, bin_dir, tmp_path / "given.json")
    assert tree(home) == before, "launch wrote under the home"
    assert [p.name for p in tmp.iterdir()] == [], "a private directory was left behind"


def tree(root: Path) -> dict[str, str]:
    """Every file under ``root`` and the SHA-256 of its bytes."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def lines(stderr: str) -> list[str]:
    return [line.removeprefix("launch: ") for line in stderr.splitlines()]


def test_claude_is_given_the_gateway_and_the_default_model_and_its_status_is_passed_on(
    place: Place,
) -> None:
    run = place.launch("claude", "--", "-p", "Say hello.")
    assert run.returncode == 13, run.stderr
    assert lines(run.stderr)[-1] == (
        f"Claude Code on the Messages API at http://127.0.0.1:{place.port}: model "
        f"{AGENT_ALIAS}; told a context window of 32,768 tokens and an output bound of 65 "
        "(the gateway caps at 64)"
    )
    given = place.given()
    settings = given["argv"][1]
    assert given["argv"] == ["--settings", settings, "-p", "Say hello."]
    assert Path(settings).parent.parent == place.tmp
    env = given["env"]
    assert env["ANTHROPIC_BASE_URL"] == f"http://127.0.0.1:{place.port}"
    assert env["ANTHROPIC_AUTH_TOKEN"] == KEY
    assert env["ANTHROPIC_MODEL"] == env["ANTHROPIC_DEFAULT_HAIKU_MODEL"] == AGENT_ALIAS
    assert env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] == "65"
    assert given["settings"]["env"] == {
        k: v for k, v in env.items() if k in given["settings"]["env"]
    }


def test_codex_and_opencode_are_given_the_gateway_too(place: Place) -> None:
    run = place.launch("codex", "--model", "roomy", "--", "exec", "Say hello.")
    assert run.returncode == 13, run.stderr
    given = place.given()
    assert given["argv"][-2:] == ["exec", "Say hello."]
    assert f'base_url="http://127.0.0.1:{place.port}/v1"' in " ".join(given["argv"])
    assert given["env"]["SLM_API_KEY"] == KEY
    run = place.launch("opencode", "--url", f"http://127.0.0.1:{place.port}/", "--", "run", "hi")
    assert run.returncode == 13, run.stderr
    given = place.given()
    config = json.loads(given["env"]["OPENCODE_CONFIG_CONTENT"])
    assert config["model"] == f"slm/{AGENT_ALIAS}"
    assert config["provider"]["slm"]["options"]["baseURL"] == f"http://127.0.0.1:{place.port}/v1"


def test_the_preflight_warns_of_a_short_context_native_tools_and_no_cap(place: Place) -> None:
    run = place.launch("codex", "--model", "short-native", "--check")
    assert run.returncode == 0, run.stderr
    said = lines(run.stderr)
    assert [line.split(":", 1)[0] for line in said[:3]] == ["warning"] * 3
    assert said[0].startswith("warning: short-native's context of 4,096 tokens is shorter")
    assert said[1].startswith("warning: short-native has tools: native")
    assert said[2].startswith("warning: short-native has no output cap")
    assert "(10 KiB of weights)" in said[2] and "give its entry or an alias preset" in said[2]
    assert not place.out.exists()  # --check starts nothing


def test_a_template_without_tools_is_said_to_be_rendered_by_the_gateway(place: Place) -> None:
    run = place.launch("claude", "--model", "roomy", "--check")
    assert run.returncode == 0, run.stderr
    said = lines(run.stderr)
    assert said[0].startswith("warning: roomy's chat template takes no tools: the gateway writes")
    assert said[1].startswith("warning: roomy has no output cap")
    assert f"name {AGENT_ALIAS} (capped at 64 tokens)" in said[1]


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (("--model", "embed"), "error: embed is not a chat model (model_type embeddings)"),
        (("--model", "nope"), "error: the gateway serves no model named 'nope'"),
        (("--api-key", "wrong"), "error: the gateway at http://127.0.0.1:"),
        (("--small-model", "nope"), "error: the gateway serves no model named 'nope'"),
    ],
)
def test_an_error_stops_the_launch(place: Place, args: tuple[str, ...], error: str) -> None:
    run = place.launch("opencode", *args, "--", "run", "hi")
    assert run.returncode == 1
    assert any(line.startswith(error) for line in lines(run.stderr)), run.stderr
    assert lines(run.stderr)[-1] == "opencode not started"
    assert not place.out.exists()


def test_a_gateway_that_is_not_running_starts_no_agent(place: Place) -> None:
    closed = free_port()
    run = place.launch("claude", "--url", f"http://127.0.0.1:{closed}", "--", "-p", "hi")
    assert run.returncode == 1
    assert lines(run.stderr)[0].startswith(
        f"error: the gateway at http://127.0.0.1:{closed} does not answer ("
    )
    assert not place.out.exists()


def test_an_agent_not_on_path_is_an_error(place: Place) -> None:
    run = place.launch("codex", "--check", PATH=str(place.tmp))
    assert run.returncode == 1
    assert "error: codex is not on PATH: install Codex CLI with npm install -g @openai/codex" in (
        lines(run.stderr)
    )
