"""Each agent's command line, environment and files for given values, and the limits each
is told: what ``launch`` hands Claude Code, Codex CLI and opencode (the keys checked
against the pinned releases are listed in ``slm_server/cli/launch/agents.py``)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest

from slm_server.cli.launch.agents import AGENTS, KEY_VARIABLE, Invocation, Target

URL = "http://127.0.0.1:8000"
PRIVATE = Path("/tmp/slm-launch-x")
EXTRA = ("-p", "Say hello.")
FULL = Target(URL, "sk-key", "big-agent", "small-one", context=32768, output=257)
BARE = Target(URL, "sk-key", "big-agent", "big-agent")


def build(agent: str, target: Target = FULL, extra: tuple[str, ...] = EXTRA) -> Invocation:
    return AGENTS[agent].build(target, PRIVATE, extra)


def codex_config(argv: tuple[str, ...]) -> dict[str, Any]:
    """Codex's ``-c key=value`` overrides read back as TOML (as Codex reads them)."""
    overrides = [argv[i + 1] for i, arg in enumerate(argv) if arg == "-c"]
    return tomllib.loads("\n".join(overrides))


def test_claude_gets_every_tier_the_limits_and_a_settings_file_that_outranks_the_users() -> None:
    invocation = build("claude")
    settings = PRIVATE / "claude-settings.json"
    assert invocation.argv == ("claude", "--settings", str(settings), *EXTRA)
    env = invocation.env
    assert env["ANTHROPIC_BASE_URL"] == URL
    assert env["ANTHROPIC_AUTH_TOKEN"] == "sk-key"
    assert env["ANTHROPIC_API_KEY"] == ""  # the user's own Anthropic key stays home
    for tier in ("ANTHROPIC_MODEL", "ANTHROPIC_DEFAULT_OPUS_MODEL"):
        assert env[tier] == "big-agent"
    assert env["ANTHROPIC_DEFAULT_SONNET_MODEL"] == env["CLAUDE_CODE_SUBAGENT_MODEL"] == "big-agent"
    assert env["ANTHROPIC_DEFAULT_HAIKU_MODEL"] == "small-one"
    assert env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] == "257"
    assert env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] == "32768"
    assert env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
    written = json.loads(invocation.files[settings.name])
    assert written == {"env": dict(env), "model": "big-agent"}


def test_claude_without_limits_is_told_none() -> None:
    env = build("claude", BARE).env
    assert "CLAUDE_CODE_MAX_OUTPUT_TOKENS" not in env
    assert "CLAUDE_CODE_MAX_CONTEXT_TOKENS" not in env
    assert env["ANTHROPIC_DEFAULT_HAIKU_MODEL"] == "big-agent"


def test_codex_gets_its_provider_model_and_window_as_overrides_and_the_key_by_name() -> None:
    invocation = build("codex", extra=("exec", "Say hello."))
    assert invocation.argv[0] == "codex"
    assert invocation.argv[-2:] == ("exec", "Say hello.")
    config = codex_config(invocation.argv)
    assert config["model_provider"] == "slm"
    assert config["model_providers"]["slm"] == {
        "name": "slm_server",
        "base_url": f"{URL}/v1",
        "env_key": KEY_VARIABLE,
        "wire_api": "responses",
    }
    assert config["model"] == config["review_model"] == "big-agent"
    assert config["model_context_window"] == 32768
    assert config["check_for_update_on_startup"] is False
    assert config["analytics"] == {"enabled": False}
    # Codex 0.171.0 has no output cap to give (--strict-config refuses the key).
    assert "model_max_output_tokens" not in config
    assert invocation.env == {KEY_VARIABLE: "sk-key"}
    assert invocation.files == {}
    assert "sk-key" not in " ".join(invocation.argv)  # never on a command line


def test_codex_quotes_what_toml_would_misread() -> None:
    target = Target(URL, "k", 'odd "name"\\x', 'odd "name"\\x')
    config = codex_config(build("codex", target).argv)
    assert config["model"] == 'odd "name"\\x'
    assert "model_context_window" not in config


def test_opencode_gets_a_provider_with_the_limit_in_its_config_content() -> None:
    invocation = build("opencode", extra=("run", "Say hello."))
    assert invocation.argv == ("opencode", "run", "Say hello.")
    assert invocation.files == {}
    config = json.loads(invocation.env["OPENCODE_CONFIG_CONTENT"])
    assert config["model"] == "slm/big-agent"
    assert config["small_model"] == "slm/small-one"
    provider = config["provider"]["slm"]
    assert provider["npm"] == "@ai-sdk/openai-compatible"
    assert provider["options"] == {"baseURL": f"{URL}/v1", "apiKey": f"{{env:{KEY_VARIABLE}}}"}
    limit = {"context": 32768, "output": 257}
    assert provider["models"] == {
        "big-agent": {"name": "big-agent", "limit": limit},
        "small-one": {"name": "small-one"},  # the limits told are the model's own
    }
    assert invocation.env[KEY_VARIABLE] == "sk-key"
    assert "sk-key" not in invocation.env["OPENCODE_CONFIG_CONTENT"]
    assert invocation.env["OPENCODE_DISABLE_MODELS_FETCH"] == "1"


def test_opencode_without_limits_gets_no_limit() -> None:
    config = json.loads(build("opencode", BARE).env["OPENCODE_CONFIG_CONTENT"])
    assert config["provider"]["slm"]["models"] == {"big-agent": {"name": "big-agent"}}


@pytest.mark.parametrize(
    ("agent", "context", "cap", "told"),
    [
        # A cap: the agent asks one token more, so the gateway's cap ends the answer and
        # says the turn finished; with it, the window.
        ("claude", 32768, 256, (32768, 257)),
        ("opencode", 32768, 256, (32768, 257)),
        ("codex", 32768, 256, (32768, None)),  # Codex takes no output bound
        # No cap: Claude Code and opencode would keep 32,000 tokens of a window in reserve.
        ("claude", 32768, None, (None, None)),
        ("opencode", 32768, None, (None, None)),
        ("codex", 32768, None, (32768, None)),
        # No context known: Claude Code takes a bound alone, opencode's limit needs both.
        ("claude", None, 256, (None, 257)),
        ("opencode", None, 256, (None, None)),
        ("codex", None, None, (None, None)),
    ],
)
def test_the_limits_each_agent_is_told(
    agent: str, context: int | None, cap: int | None, told: tuple[int | None, int | None]
) -> None:
    assert AGENTS[agent].limits(context, cap) == told


def test_every_file_goes_into_the_private_directory() -> None:
    for name in AGENTS:
        invocation = build(name)
        for file in invocation.files:
            assert Path(file).name == file
        named = [a for a in invocation.argv if a.startswith("/")]
        assert all(Path(a).parent == PRIVATE for a in named), (name, named)


def test_the_prompt_estimates_are_above_what_was_measured() -> None:
    from slm_server.cli.launch.agents import MEASURED_TOKENS

    for name, agent in AGENTS.items():
        assert MEASURED_TOKENS[name] < agent.prompt_tokens <= MEASURED_TOKENS[name] * 1.3
