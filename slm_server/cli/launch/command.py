"""``python -m slm_server launch claude|codex|opencode [--model ID] [-- agent args]``:
the wiring. The gateway's address and key come from the settings (``SLM_ROUTER_HOST``,
``SLM_ROUTER_PORT``, the first of ``SLM_API_KEYS``) unless ``--url`` and ``--api-key``
say otherwise; the preflight's findings go to stderr; with ``--check`` nothing is
started."""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Sequence

from slm_server.cli.launch.agents import AGENTS, NO_KEY, Agent, Target
from slm_server.cli.launch.gateway import router_url, settings_key
from slm_server.cli.launch.preflight import (
    Finding,
    cap_of,
    choose_model,
    model_errors,
    preflight,
)
from slm_server.cli.launch.process import run_agent
from slm_server.cli.launch.survey import Survey, take_survey
from slm_server.settings import Settings


def add_arguments(command: argparse.ArgumentParser) -> None:
    command.add_argument("agent", choices=tuple(AGENTS), help="the agent to start")
    command.add_argument(
        "--model",
        metavar="ID",
        help="the model or alias the agent uses (default: the first chat model whose "
        "context holds the agent's prompt and whose output is capped)",
    )
    command.add_argument(
        "--small-model", metavar="ID", help="its small/fast model (default: the model)"
    )
    command.add_argument(
        "--url", help="the gateway's base URL (default: SLM_ROUTER_HOST and SLM_ROUTER_PORT)"
    )
    command.add_argument(
        "--api-key",
        metavar="KEY",
        help="the key to give the agent (default: the first of SLM_API_KEYS)",
    )
    command.add_argument(
        "--check", action="store_true", help="run the preflight only; start nothing"
    )
    command.usage = (
        "python -m slm_server launch [-h] [--model ID] [--small-model ID] [--url URL] "
        "[--api-key KEY] [--check] {claude,codex,opencode} [-- AGENT ARGS...]"
    )
    command.epilog = "Arguments after -- go to the agent: launch claude -- -p 'Hello'."


def cmd_launch(settings: Settings, args: argparse.Namespace, agent_args: Sequence[str]) -> int:
    """The preflight, then the agent; its exit status, or 1 when the preflight failed."""
    agent = AGENTS[args.agent]
    url = (args.url or router_url(settings)).rstrip("/")
    key = args.api_key or settings_key(settings)
    asked = tuple(n for n in (args.model, args.small_model) if n)
    survey = take_survey(url, key, asked)
    reached = survey.down is None and not survey.key_refused
    name = args.model or (choose_model(agent, survey) if reached else None)
    findings = preflight(agent, survey, name)
    small = args.small_model or name
    if small != name and small is not None and not _errors(findings):
        findings += model_errors(agent, survey, small)
    program = shutil.which(agent.program)
    if program is None:
        findings.append(
            Finding(
                "error",
                f"{agent.program} is not on PATH: install {agent.title} with "
                f"npm install -g {agent.package}",
            )
        )
    for finding in findings:
        print(f"launch: {finding}", file=sys.stderr)
    if _errors(findings) or name is None or small is None or program is None:
        print(f"launch: {agent.title} not started", file=sys.stderr)
        return 1
    target = _target(agent, survey, url, key, name, small)
    print(f"launch: {_summary(agent, target, survey)}", file=sys.stderr, flush=True)
    if args.check:
        return 0
    extra = tuple(agent_args)
    return run_agent(program, lambda private: agent.build(target, private, extra))


def _errors(findings: Sequence[Finding]) -> bool:
    return any(f.severity == "error" for f in findings)


def _target(
    agent: Agent, survey: Survey, url: str, key: str | None, name: str, small: str
) -> Target:
    model = survey.model(name) or {}
    context = model.get("context_length")
    told_context, told_output = agent.limits(
        context if isinstance(context, int) else None, cap_of(survey, name)
    )
    return Target(url, key or NO_KEY, name, small, told_context, told_output)


def _summary(agent: Agent, target: Target, survey: Survey) -> str:
    """What the agent is given, in one line (never the key)."""
    told = []
    if target.context is not None:
        told.append(f"a context window of {target.context:,} tokens")
    if target.output is not None:
        cap = cap_of(survey, target.model)
        told.append(f"an output bound of {target.output:,} (the gateway caps at {cap:,})")
    small = f", small model {target.small_model}" if target.small_model != target.model else ""
    limits = f"; told {' and '.join(told)}" if told else "; told no context window or output bound"
    return f"{agent.title} on {agent.api} at {target.url}: model {target.model}{small}{limits}"


__all__ = ["add_arguments", "cmd_launch"]
