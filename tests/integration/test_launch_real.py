"""``python -m slm_server launch`` starts each real agent (Claude Code, Codex CLI and
opencode, from npm at the releases of ``config/agents.pin``) against the real router
with the default Gemma model on the pinned llama-server, and each finishes a one-line
task: it exits 0 and the gateway's own record of recent requests shows the agent's API
answered, by the model ``launch`` chose (no ``--model``: the agent alias, capped), with
the key ``launch`` read from the settings. The user's own agent configuration in the
(fake) home points elsewhere and is left byte for byte as it was.

Kept cheap (about 10-30 s an agent on two CPUs): the default model's context, the
alias's cap lowered to a few tokens, a one-line prompt, and each agent's smallest
configuration (Claude Code without tools and with a one-line system prompt; Codex CLI
with its tools switched off and a one-line instructions file; opencode with a project
config giving its agent a one-line prompt and no tools).

The agents come from ``SLM_AGENTS_BIN`` (``scripts/test.sh`` installs them with
``scripts/install_agents.sh``), else from where that script puts them; missing, the
test fails, it never skips."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests import one_shot
from tests.integration.real_stack import example_registry, running_registry
from tests.processes import ROOT, free_port, running_router

# One stack for the three agents; an agent's minute of CPU beside the parallel part
# would make its timing anyone's guess: these run alone (scripts/test.sh).
pytestmark = [pytest.mark.real_model, pytest.mark.serial]

PROGRAMS = ("claude", "codex", "opencode")
KEY = "sk-launch-real"
AGENT_ALIAS = "gemma-3-270m-agent"
CAP = 24  # tokens an answer may have: enough to see one come back
TASK = "Say hello in one short sentence."
BRIEF = "You answer in one short sentence."
# Codex CLI's tools, switched off for the test (`codex features list`).
CODEX_TOOLS = (
    "shell_tool",
    "unified_exec",
    "view_image",
    "multi_agent",
    "image_generation",
    "goals",
    "sleep_tool",
    "tool_suggest",
    "plugins",
    "apps",
    "browser_use",
    "computer_use",
    "hooks",
    "skill_search",
)
# The user's own configuration, each pointing at another server and model.
USER_FILES = {
    ".claude/settings.json": json.dumps(
        {"env": {"ANTHROPIC_BASE_URL": "http://127.0.0.1:9", "ANTHROPIC_MODEL": "theirs"}}
    ),
    ".codex/config.toml": 'model = "theirs"\nmodel_provider = "theirs"\n\n'
    '[model_providers.theirs]\nname = "theirs"\nbase_url = "http://127.0.0.1:9/v1"\n'
    'wire_api = "responses"\n',
    ".config/opencode/opencode.json": json.dumps(
        {
            "$schema": "https://opencode.ai/config.json",
            "model": "theirs/model",
            "provider": {
                "theirs": {
                    "npm": "@ai-sdk/openai-compatible",
                    "options": {"baseURL": "http://127.0.0.1:9/v1"},
                    "models": {"model": {}},
                }
            },
        }
    ),
}
# What the agent is started with, after `--`, in the scratch project ``work``.
ENDPOINTS = {
    "claude": "/v1/messages",
    "codex": "/v1/responses",
    "opencode": "/v1/chat/completions",
}


def agents_bin() -> Path:
    """Where the pinned agents are; the test command installs them before pytest runs."""
    configured = os.environ.get("SLM_AGENTS_BIN")
    if configured:
        path = Path(configured)
    else:
        printed = subprocess.run(
            ["bash", str(ROOT / "scripts" / "install_agents.sh"), "--print"],
            check=True,
            capture_output=True,
            text=True,
        )
        path = Path(printed.stdout.strip())
    missing = [p for p in PROGRAMS if not os.access(path / p, os.X_OK)]
    if missing:
        raise AssertionError(
            f"{', '.join(missing)} not found in {path}: run the README's test command "
            "(scripts/test.sh), which installs the agents (scripts/install_agents.sh)"
        )
    return path


def agent_args(agent: str, work: Path) -> list[str]:
    if agent == "claude":
        return ["-p", TASK, "--tools", "", "--system-prompt", BRIEF]
    if agent == "codex":
        disabled = [arg for tool in CODEX_TOOLS for arg in ("--disable", tool)]
        return [
            "exec",
            "--skip-git-repo-check",
            *disabled,
            "-c",
            'web_search="disabled"',
            "-c",
            f"model_instructions_file={work / 'instructions.md'}",
            TASK,
        ]
    return ["run", TASK]


@dataclass
class Gateway:
    url: str
    port: int
    agents: Path


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    agents = agents_bin()  # first: a missing agent fails before a model is loaded
    workdir = tmp_path_factory.mktemp("launch-real")
    ports = {"standard": 0, "gemma": free_port(), "embeddings": 0}
    registry = example_registry(ports, roles=("gemma",))
    [alias] = registry["models"]["gemma"]["aliases"]
    assert alias["name"] == AGENT_ALIAS
    alias["preset"]["max_output_tokens"] = CAP
    with (
        running_registry(workdir, registry) as stack,
        running_router({**stack.env, "SLM_API_KEYS": KEY}, workdir) as (_router, url),
    ):
        yield Gateway(url, int(url.rsplit(":", 1)[1]), agents)


def requests(url: str) -> list[dict[str, Any]]:
    """The router's recent requests (``GET /v1/ui/requests``), newest first."""
    answer = one_shot.get(
        f"{url}/v1/ui/requests", headers={"Authorization": f"Bearer {KEY}"}, timeout=10
    )
    assert answer.status_code == 200, answer.text
    data: list[dict[str, Any]] = answer.json()["data"]
    return data


def tree(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def scene(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A fake home holding the user's own configuration, a scratch project, and the
    temporary directory ``launch`` makes its private one in."""
    home, work, tmp = tmp_path / "home", tmp_path / "work", tmp_path / "tmp"
    for directory in (home, work, tmp):
        directory.mkdir()
    for name, text in USER_FILES.items():
        (home / name).parent.mkdir(parents=True, exist_ok=True)
        (home / name).write_text(text)
    (work / "instructions.md").write_text(BRIEF + "\n")
    project = {"agent": {"build": {"prompt": BRIEF, "tools": {"*": False}}}}
    (work / "opencode.json").write_text(json.dumps(project))
    return home, work, tmp


@pytest.mark.parametrize("agent", PROGRAMS)
def test_launch_runs_the_agent_on_a_one_line_task_through_the_gateway(
    gateway: Gateway, agent: str, tmp_path: Path
) -> None:
    home, work, tmp = scene(tmp_path)
    user_files = {name: tree(home)[name] for name in USER_FILES}
    seen = {r["request_id"] for r in requests(gateway.url)}
    # Nothing of the machine's own agent or gateway settings: only what launch gives.
    inherited = ("SLM_", "XDG_", "ANTHROPIC_", "CLAUDE_", "CODEX_", "OPENAI_", "OPENCODE_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(inherited)}
    env.update(
        HOME=str(home),
        # opencode takes its project from $PWD, not from its working directory.
        PWD=str(work),
        TMPDIR=str(tmp),
        PATH=f"{gateway.agents}{os.pathsep}{os.environ['PATH']}",
        SLM_ENV_FILE=str(tmp_path / "no.env"),
        SLM_ROUTER_PORT=str(gateway.port),
        SLM_API_KEYS=KEY,
    )
    started = time.monotonic()
    run = subprocess.run(
        [sys.executable, "-m", "slm_server", "launch", agent, "--", *agent_args(agent, work)],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    took = time.monotonic() - started
    told = f"{run.stdout[-2000:]}\n{run.stderr[-3000:]}"
    assert run.returncode == 0, told
    assert f"model {AGENT_ALIAS}" in run.stderr, told
    answered = [
        r
        for r in requests(gateway.url)
        if r["request_id"] not in seen and r["endpoint"] == ENDPOINTS[agent]
    ]
    assert answered, f"no {ENDPOINTS[agent]} request reached the gateway\n{told}"
    assert all(r["alias"] == AGENT_ALIAS and r["status"] == 200 for r in answered), answered
    assert any(r["output_tokens"] for r in answered), answered
    # The user's configuration as it was; launch's private directory gone.
    assert {name: tree(home)[name] for name in USER_FILES} == user_files
    assert not [p for p in tmp.iterdir() if p.name.startswith("slm-launch-")]
    print(f"{agent}: exit 0 in {took:.1f} s, {len(answered)} request(s): {answered}")
