"""Claude Code, Codex CLI and opencode, each run one-shot against the router for a turn in
which the model calls a tool (issue 42). Not part of the suite: the three agents are
1.2 GB of native binaries from npm and each run takes seconds to minutes of CPU.

Each agent is asked to read a file whose one line holds a marker, through its own
file-reading tool (Claude Code's ``Read``, Codex CLI's ``exec_command`` with ``cat``,
opencode's ``read``), and its JSON events are read for what happened: the calls the
model made, whether the tool ran and its result held the marker, and whether the agent
asked the model again with that result (``sent_back``).

- ``--backend fake``: a scriptable fake backend answers the first request with a call to
  the agent's tool (``--broken``: its arguments as a small model writes them, single
  quotes and a trailing comma, which the router mends) and with text once a request
  carries the marker; the fake's record of the requests says what came back.
- ``--backend real``: the default Gemma 3 270M on the pinned llama-server, through its
  agent alias (``gemma-3-270m-agent``: the tools rendered into the prompt, every call
  checked), with a short system prompt and a prompt that asks for the call. The run is
  cut after ``--window`` seconds: a model this small that keeps calling the tool would
  go on.

    npm install --prefix DIR @anthropic-ai/claude-code @openai/codex opencode-ai
    uv run python -m benchmarks.agent_tool_turns --agents DIR/node_modules/.bin --backend real
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

from benchmarks.machine import ROOT
from tests.fakes.control import FakeBackend
from tests.integration.real_stack import example_registry, llama_server_bin
from tests.integration.watched import watched
from tests.processes import free_port, registry_env, running_router
from tests.registry_entries import registry_entry

AGENTS = ("claude", "codex", "opencode")
MARK = "MARKER7d1e"
REAL_MODEL = "gemma-3-270m-agent"
SYSTEM = (
    "You are a tool-calling agent. You never answer in words: each turn you call exactly "
    "one tool, with only its required arguments. When a tool result is given, say in one "
    "sentence what it shows."
)
RESULTS = ROOT / "benchmarks" / "results"


@dataclass
class Turn:
    """What one run of one agent did."""

    agent: str
    ended: str  # "exit N" or "cut after N s"
    seconds: float
    calls: list[str]  # tool names the agent was asked to call, in order
    ran_with_marker: bool  # a tool result held the file's marker
    sent_back: bool  # the agent asked the model again with a tool's result
    answer: str


def tool_call(agent: str, path: Path) -> tuple[str, dict[str, Any]]:
    """The agent's file-reading tool and its arguments for ``path``."""
    if agent == "claude":
        return "Read", {"file_path": str(path)}
    if agent == "codex":
        return "exec_command", {"cmd": f"cat {path.name}"}
    return "read", {"filePath": str(path)}


def command(
    agent: str, url: str, model: str, prompt: str, work: Path, *, short: bool, system: str = SYSTEM
) -> tuple[list[str], dict[str, str]]:
    """The agent's one-shot command line with JSON events, and its environment;
    ``short``: with ``system`` as its system prompt and only its file-reading tool."""
    if agent == "claude":
        argv = ["claude", "-p", prompt, "--allowedTools", "Read", "--output-format"]
        argv += ["stream-json", "--verbose"]
        if short:
            argv += ["--tools", "Read", "--system-prompt", system]
        env = {
            "ANTHROPIC_BASE_URL": url,
            "ANTHROPIC_AUTH_TOKEN": "unused",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_ERROR_REPORTING": "1",
        }
        for name in ("", "_DEFAULT_HAIKU", "_DEFAULT_SONNET", "_DEFAULT_OPUS"):
            env[f"ANTHROPIC{name}_MODEL"] = model
        return argv, env
    if agent == "codex":
        provider = (
            f'{{name="slm_server",base_url="{url}/v1",env_key="SLM_API_KEY",wire_api="responses"}}'
        )
        argv = ["codex", "exec", "--json", "--skip-git-repo-check", "--sandbox", "read-only"]
        if short:
            (work / "instructions.md").write_text(system)
            argv += ["-c", f"model_instructions_file={work / 'instructions.md'}"]
        argv += ["-c", "model_provider=slm", "-m", model, "-c", f"model_providers.slm={provider}"]
        return [*argv, prompt], {"SLM_API_KEY": "unused"}
    config: dict[str, Any] = {
        "model": f"slm/{model}",
        "permission": {"read": "allow", "bash": "allow", "external_directory": "allow"},
        "provider": {
            "slm": {
                "npm": "@ai-sdk/openai-compatible",
                "options": {"baseURL": f"{url}/v1"},
                "models": {model: {}},
            }
        },
    }
    if short:
        others = ("bash", "edit", "write", "glob", "grep", "list", "patch", "webfetch", "task")
        config["agent"] = {"build": {"prompt": system, "tools": dict.fromkeys(others, False)}}
        config["permission"] = {"read": "allow", "external_directory": "allow"}
    argv = ["opencode", "run", "--format", "json", prompt]
    return argv, {"OPENCODE_CONFIG_CONTENT": json.dumps(config)}


def run_agent(
    agent: str, argv: list[str], env: dict[str, str], cwd: Path, window: float
) -> tuple[str, float, list[dict[str, Any]]]:
    """Run the agent until it exits or ``window`` seconds pass; its JSON events."""
    started = time.monotonic()
    proc = subprocess.Popen(  # noqa: S603
        argv,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=window)
        ended = f"exit {proc.returncode}"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        ended = f"cut after {window:.0f} s"
    events = []
    for line in out.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            events.append(event)
    return ended, time.monotonic() - started, events


def read_events(agent: str, events: list[dict[str, Any]]) -> tuple[list[str], bool, bool, str]:
    """The tools called, whether a result held the marker, whether the model was asked
    again after a tool's result (anything the model did after it), and the model's last
    text, from the agent's JSON events."""
    calls: list[str] = []
    marked = seen_result = sent_back = False
    answer = ""
    for event in events:
        for kind, value in _items(agent, event):
            if kind == "result":
                seen_result = True
                marked = marked or MARK in value
                continue
            sent_back = sent_back or seen_result
            if kind == "call":
                calls.append(value)
            elif kind == "text":
                answer = value
    return calls, marked, sent_back, answer[:200]


def _items(agent: str, event: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """What one event says, as (kind, value): a ``call`` (tool name), a tool's
    ``result``, a ``text`` the model wrote, a ``model`` turn."""
    text = json.dumps(event)
    if agent == "claude":
        message = event.get("message")
        blocks = message.get("content") if isinstance(message, dict) else None
        for block in blocks if isinstance(blocks, list) else []:
            kind = block.get("type")
            if kind == "tool_use":
                yield "call", str(block.get("name"))
            elif kind == "tool_result":
                yield "result", json.dumps(block.get("content"))
            elif kind == "text":
                yield "text", str(block.get("text"))
        return
    if agent == "codex":
        item = event.get("item")
        if isinstance(item, dict):
            kind = item.get("type")
            if kind in ("command_execution", "function_call", "mcp_tool_call"):
                if event.get("type") == "item.started":
                    yield "call", str(item.get("command") or item.get("name") or kind)
                elif event.get("type") == "item.completed":
                    yield "result", str(item.get("aggregated_output") or text)
            elif kind == "agent_message" and event.get("type") == "item.completed":
                yield "text", str(item.get("text"))
        elif event.get("type") == "turn.started":
            yield "model", ""
        return
    part = event.get("part")
    if isinstance(part, dict):
        if part.get("type") == "tool":
            state = part.get("state") or {}
            yield "call", str(part.get("tool"))
            if isinstance(state, dict) and state.get("status") in ("completed", "error"):
                yield "result", json.dumps(state.get("output") or state.get("error"))
        elif part.get("type") == "text":
            yield "text", str(part.get("text"))
        elif part.get("type") == "step-start":
            yield "model", ""


def one_turn(
    agent: str,
    url: str,
    model: str,
    prompt: str,
    work: Path,
    base_env: dict[str, str],
    *,
    short: bool,
    window: float,
    system: str = SYSTEM,
) -> Turn:
    argv, env = command(agent, url, model, prompt, work, short=short, system=system)
    ended, seconds, events = run_agent(agent, argv, {**base_env, **env}, work / "repo", window)
    calls, marked, sent_back, answer = read_events(agent, events)
    return Turn(agent, ended, round(seconds, 1), calls, marked, sent_back, answer)


@contextmanager
def agent_home(agents_bin: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    """A work directory (with ``repo/hello.py``) and the agents' environment: an empty
    home of their own, the agents first on ``PATH``."""
    with TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "repo").mkdir()
        (work / "repo" / "hello.py").write_text(f'print("{MARK}")\n')
        (work / "home").mkdir()
        (work / "stack").mkdir()
        env = {**os.environ, "HOME": str(work / "home")}
        env["PATH"] = f"{agents_bin}{os.pathsep}{env['PATH']}"
        yield work, env


def run_fake(
    agents_bin: Path, only: tuple[str, ...], broken: bool, say: Callable[[str], None]
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    prompt = "Read the file hello.py and tell me what it prints."
    with (
        agent_home(agents_bin) as (work, env),
        FakeBackend.start(model_id="agent") as fake,
    ):
        entry = registry_entry("agent", fake.port, default_timeout=120)
        router_env = registry_env(work, {"agent": entry}, SLM_OTEL_ENABLED="false")
        with running_router(router_env, work) as (_router, url):
            for agent in only:
                fake.reset()
                tool, arguments = tool_call(agent, work / "repo" / "hello.py")
                written = json.dumps(arguments)
                if broken:  # single quotes and a trailing comma, as a small model writes
                    written = written.replace('"', "'")[:-1] + ",}"
                fake.script(
                    tool_calls=[{"name": tool, "arguments": written}],
                    body_lacks=MARK,
                    body_contains='"tools"',
                    reply="It prints the marker.",
                    chunks=1,
                    chunk_text="It prints the marker.",
                )
                turn = one_turn(agent, url, "agent", prompt, work, env, short=False, window=300)
                asked = [r for r in fake.requests() if r["path"] != "/health"]
                turn.sent_back = any(MARK in json.dumps(r.get("body")) for r in asked)
                say(f"  {agent}: {json.dumps(asdict(turn))}")
                rows.append({"backend": "fake", "broken": broken, **asdict(turn)})
    return rows


def run_real(
    agents_bin: Path,
    only: tuple[str, ...],
    attempts: int,
    window: float,
    say: Callable[[str], None],
    *,
    call_first: bool = False,
) -> list[dict[str, Any]]:
    """Each agent ``attempts`` times on the default Gemma model; ``call_first``: the
    system prompt begins with the call, written as the router renders one (a 270M base
    model tends to say its prompt's first lines again)."""
    rows: list[dict[str, Any]] = []
    registry = example_registry(
        {"standard": free_port(), "gemma": free_port(), "embeddings": 0}, roles=("gemma",)
    )
    with (
        agent_home(agents_bin) as (work, env),
        watched(work / "stack", registry["models"], llama_server=llama_server_bin()) as stack,
    ):
        for agent in only:
            tool, arguments = tool_call(agent, work / "repo" / "hello.py")
            prompt = f"Call the {tool} tool with {json.dumps(arguments)}."
            system = SYSTEM
            if call_first:
                call = json.dumps({"name": tool, "arguments": arguments})
                system = f"<tool_call>{call}</tool_call>\n{SYSTEM}"
            for _ in range(attempts):
                turn = one_turn(
                    agent,
                    stack.url,
                    REAL_MODEL,
                    prompt,
                    work,
                    env,
                    short=True,
                    window=window,
                    system=system,
                )
                turn.calls = turn.calls[:12]
                say(f"  {agent}: {json.dumps(asdict(turn))}")
                rows.append({"backend": "real", "call_first": call_first, **asdict(turn)})
        rows.append({"backend_failures": len(stack.events("backend_failure"))})
    return rows


def say(line: str) -> None:
    print(line, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--agents", type=Path, required=True, help="the agents' bin directory")
    parser.add_argument("--backend", choices=("fake", "real"), default="fake")
    parser.add_argument("--broken", action="store_true", help="fake: calls to be mended")
    parser.add_argument("--only", nargs="*", default=list(AGENTS), choices=AGENTS)
    parser.add_argument("--attempts", type=int, default=3, help="real: runs per agent")
    parser.add_argument("--window", type=float, default=120.0, help="real: seconds per run")
    parser.add_argument("--call-first", action="store_true", help="real: the call opens the prompt")
    parser.add_argument("--write", action="store_true", help="write benchmarks/results")
    args = parser.parse_args(argv)
    only = tuple(args.only)
    if args.backend == "fake":
        rows = run_fake(args.agents, only, args.broken, say)
    else:
        rows = run_real(
            args.agents, only, args.attempts, args.window, say, call_first=args.call_first
        )
    if args.write:
        day = time.strftime("%Y-%m-%d")
        variant = "-broken" if args.broken else "-call-first" if args.call_first else ""
        name = f"agent_tool_turns-{args.backend}{variant}-{day}.json"
        (RESULTS / name).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
