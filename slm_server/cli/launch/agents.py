"""Each coding agent's own configuration for the gateway: its command line, its
environment and the files it reads, built from what it is to be told. Pure: nothing is
written or started here (:mod:`.process` does that).

Every key below was checked against the pinned release (``scripts/install_agents.sh``)
rather than taken on trust:

- **Claude Code** (2.1.332, Messages API): the ``ANTHROPIC_*`` variables of the recipe in
  docs/agents.md; ``CLAUDE_CODE_MAX_OUTPUT_TOKENS`` (the ``max_tokens`` it asks for) and
  ``CLAUDE_CODE_MAX_CONTEXT_TOKENS`` (the window of a model id it does not know: its own
  notice says "set CLAUDE_CODE_MAX_CONTEXT_TOKENS to its real window"), both read in
  ``bin/claude.exe``. The same variables go into a settings file given with
  ``--settings``, which outranks the user's and the project's settings: an ``env`` in
  ``~/.claude/settings.json`` would otherwise win over the process's environment.
- **Codex CLI** (0.171.0, Responses API): ``-c`` overrides only, which outrank
  ``~/.codex/config.toml``: the provider of the recipe, ``model``, ``review_model``,
  ``model_context_window``. It takes no output cap: ``codex --strict-config -c
  model_max_output_tokens=300`` is refused as an unknown field, and it sends no bound
  with its requests, so the gateway's cap alone applies.
- **opencode** (1.18.33, chat completions): ``OPENCODE_CONFIG_CONTENT``, which outranks
  the global and the project's config (and keeps opencode from creating a global one),
  with an ``@ai-sdk/openai-compatible`` provider and the model's ``limit: {context,
  output}`` (its schema needs both; it asks for ``min(output, 32000)`` tokens).

An agent is told an output bound one token above the gateway's cap (``max_output_tokens``
of the entry or the alias): the gateway reports an answer its own cap cut as a finished
turn, and one cut at the client's bound as cut, which Claude Code takes as an error
("response exceeded the N output token maximum"). Claude Code and opencode keep their
default bound (32,000 tokens) in reserve out of any context window they are told, so
without a cap they are told no window either: in a 32k context they would compact at
every turn.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

# The key the agents read the gateway's API key from, where they take it by name.
KEY_VARIABLE: Final = "SLM_API_KEY"
# Sent when the gateway checks no key: the agents want one.
NO_KEY: Final = "slm-server"
PROVIDER: Final = "slm"


@dataclass(frozen=True)
class Target:
    """What an agent is told: the gateway's base URL (no ``/v1``), the key, the model
    and its small/fast model, and the context window and output bound to give it (None:
    not told)."""

    url: str
    key: str
    model: str
    small_model: str
    context: int | None = None
    output: int | None = None


@dataclass(frozen=True)
class Invocation:
    """How to start an agent: its command line (the program first), the variables set
    over the caller's environment, and the files written into the private directory it
    was built for (name: text)."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    files: Mapping[str, str]


@dataclass(frozen=True)
class Agent:
    """One agent: its name on the command line, its program and package, the API it
    speaks, the size of its prompt, and how it takes the gateway's limits.

    ``prompt_tokens`` is the system prompt and tools it sends with every request,
    estimated (see :data:`PROMPT_TOKENS`). ``asks_for`` says what output it asks for
    when no bound is given. ``takes_output``: an output bound can be given;
    ``reserves_output``: a context window given is shrunk by the output bound, so one is
    given only with a bound; ``output_alone``: a bound can be given without a window."""

    name: str
    title: str
    program: str
    package: str
    api: str
    prompt_tokens: int
    asks_for: str
    takes_output: bool
    reserves_output: bool
    output_alone: bool
    build: Callable[[Target, Path, tuple[str, ...]], Invocation]

    def limits(self, context: int | None, cap: int | None) -> tuple[int | None, int | None]:
        """The context window and output bound to tell this agent of a model with
        ``context`` tokens and the gateway's cap ``cap`` (None: unknown, or none)."""
        output = cap + 1 if cap is not None and self.takes_output else None
        if output is not None and context is None and not self.output_alone:
            output = None
        if context is not None and self.reserves_output and output is None:
            context = None
        return context, output


# The first request of a one-shot run (``-p``, ``exec``, ``run``) in an empty directory,
# counted by the gateway (prompt tokens in GET /v1/ui/requests) through
# gemma-3-270m-agent on 7 December 2026: the agents' own system prompts and tools, the
# tools written into the prompt by the gateway (tools: render), Gemma 3's tokenizer.
MEASURED_TOKENS: Final = {"claude": 11_814, "codex": 8_786, "opencode": 7_386}
# The estimate the preflight holds a model's context to: the measure and a quarter more
# (rounded up to 500), for a template that writes the tools out at greater length, a
# project's own instructions (CLAUDE.md, AGENTS.md) and a tokenizer that splits text
# finer (SmolLM2's took 3 % more tokens than Gemma's for the same text).
PROMPT_TOKENS: Final = {"claude": 15_000, "codex": 11_000, "opencode": 9_500}


def _claude(target: Target, private: Path, extra: tuple[str, ...]) -> Invocation:
    env = {
        "ANTHROPIC_BASE_URL": target.url,
        "ANTHROPIC_AUTH_TOKEN": target.key,
        # The user's own Anthropic key is not for the gateway (and would win over the token).
        "ANTHROPIC_API_KEY": "",
        "ANTHROPIC_MODEL": target.model,
        "ANTHROPIC_DEFAULT_OPUS_MODEL": target.model,
        "ANTHROPIC_DEFAULT_SONNET_MODEL": target.model,
        "ANTHROPIC_DEFAULT_FABLE_MODEL": target.model,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": target.small_model,
        "CLAUDE_CODE_SUBAGENT_MODEL": target.model,
        # No traffic to Anthropic's servers for anything else.
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_ERROR_REPORTING": "1",
    }
    if target.output is not None:
        env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] = str(target.output)
    if target.context is not None:
        env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] = str(target.context)
    settings = private / "claude-settings.json"
    text = json.dumps({"env": env, "model": target.model}, indent=2) + "\n"
    return Invocation(("claude", "--settings", str(settings), *extra), env, {settings.name: text})


def _toml(value: str) -> str:
    """``value`` as a TOML basic string (JSON's escapes are TOML's)."""
    return json.dumps(value)


def _codex(target: Target, private: Path, extra: tuple[str, ...]) -> Invocation:
    del private  # everything goes on the command line, the key in the environment
    provider = (
        f"{{name={_toml('slm_server')},base_url={_toml(target.url + '/v1')},"
        f"env_key={_toml(KEY_VARIABLE)},wire_api={_toml('responses')}}}"
    )
    overrides = [
        f"model_provider={_toml(PROVIDER)}",
        f"model_providers.{PROVIDER}={provider}",
        f"model={_toml(target.model)}",
        # Codex has no small model; /review asks this one.
        f"review_model={_toml(target.model)}",
        "check_for_update_on_startup=false",
        "analytics.enabled=false",
    ]
    if target.context is not None:
        overrides.append(f"model_context_window={target.context}")
    argv = ["codex"]
    for override in overrides:
        argv += ["-c", override]
    return Invocation((*argv, *extra), {KEY_VARIABLE: target.key}, {})


def opencode_config(target: Target) -> dict[str, Any]:
    """opencode's config for ``target``: a provider named ``slm`` with the model (its
    limits, when told) and the small model, the key read from the environment."""
    models: dict[str, Any] = {name: {"name": name} for name in (target.small_model, target.model)}
    if target.context is not None and target.output is not None:
        models[target.model]["limit"] = {"context": target.context, "output": target.output}
    return {
        "$schema": "https://opencode.ai/config.json",
        "model": f"{PROVIDER}/{target.model}",
        "small_model": f"{PROVIDER}/{target.small_model}",
        "provider": {
            PROVIDER: {
                "npm": "@ai-sdk/openai-compatible",
                "name": "slm_server",
                "options": {"baseURL": f"{target.url}/v1", "apiKey": f"{{env:{KEY_VARIABLE}}}"},
                "models": models,
            }
        },
    }


def _opencode(target: Target, private: Path, extra: tuple[str, ...]) -> Invocation:
    del private  # the config goes in the environment, which outranks every file
    env = {
        "OPENCODE_CONFIG_CONTENT": json.dumps(opencode_config(target)),
        KEY_VARIABLE: target.key,
        # No catalog fetched from models.dev, no update check: localhost only.
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
    }
    return Invocation(("opencode", *extra), env, {})


AGENTS: Final[Mapping[str, Agent]] = {
    agent.name: agent
    for agent in (
        Agent(
            name="claude",
            title="Claude Code",
            program="claude",
            package="@anthropic-ai/claude-code",
            api="the Messages API",
            prompt_tokens=PROMPT_TOKENS["claude"],
            asks_for="32,000 output tokens a turn (128,000 when it asks again)",
            takes_output=True,
            reserves_output=True,
            output_alone=True,
            build=_claude,
        ),
        Agent(
            name="codex",
            title="Codex CLI",
            program="codex",
            package="@openai/codex",
            api="the Responses API",
            prompt_tokens=PROMPT_TOKENS["codex"],
            asks_for="no output bound: the model writes until it stops",
            takes_output=False,
            reserves_output=False,
            output_alone=False,
            build=_codex,
        ),
        Agent(
            name="opencode",
            title="opencode",
            program="opencode",
            package="opencode-ai",
            api="chat completions",
            prompt_tokens=PROMPT_TOKENS["opencode"],
            asks_for="32,000 output tokens a turn",
            takes_output=True,
            reserves_output=True,
            output_alone=False,
            build=_opencode,
        ),
    )
}


__all__ = [
    "AGENTS",
    "KEY_VARIABLE",
    "MEASURED_TOKENS",
    "NO_KEY",
    "PROMPT_TOKENS",
    "Agent",
    "Invocation",
    "Target",
    "opencode_config",
]
