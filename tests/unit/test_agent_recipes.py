"""The coding agents' recipes (README.md and docs/agents.md) work on the shipped registry
without an edit: every model name they give is one ``config/models.yaml.example``
routes to a chat model (the Messages API is served by what serves chat completions)
whose context holds an agent's prompt and whose answers are capped (docs/agents.md says
why each)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from slm_server.registry.schema import load_registry
from slm_server.router.dispatch.lookup import Registry
from slm_server.router.intake.presets import resolve
from tests.shape_rows import shape

ROOT = Path(__file__).resolve().parents[2]
RECIPE_PAGES = ("README.md", "docs/agents.md")
# Where each recipe names its model: Claude Code's environment (every tier), Codex's
# -m or config.toml, opencode's provider/model.
MODEL_NAMES = re.compile(
    r"ANTHROPIC_(?:DEFAULT_[A-Z]+_)?MODEL=([\w.-]+)|codex [^\n]*-m ([\w.-]+)"
    r'|^model = "([\w.-]+)"|"model": "slm/([\w.-]+)"',
    re.MULTILINE,
)
# What an agent sends with every request: a system prompt and tools of 5k-20k tokens.
AGENT_PROMPT_TOKENS = 20_000
# An answer capped at this many tokens ends within the model's deadline on a small CPU.
LONGEST_CAP = 1024


def recipe_models(page: str) -> set[str]:
    text = (ROOT / page).read_text(encoding="utf-8")
    return {next(name for name in match if name) for match in MODEL_NAMES.findall(text)}


@pytest.mark.parametrize("page", RECIPE_PAGES)
def test_the_recipes_name_a_model_the_example_serves_to_agents(page: str) -> None:
    names = recipe_models(page)
    assert names, f"no recipe found in {page}"
    registry = Registry(load_registry(ROOT / "config" / "models.yaml.example").models)
    for name in sorted(names):
        entry = registry.route(name, shape("/v1/chat/completions")).entry
        assert registry.route(name, shape("/v1/responses")).entry is entry
        context = entry.context_length
        assert context is not None and context >= AGENT_PROMPT_TOKENS + LONGEST_CAP, (
            f"{name}: a {context}-token context cannot hold an agent's prompt"
        )
        cap = resolve(entry, registry.alias(name)).cap
        assert cap is not None and cap <= LONGEST_CAP, f"{name}: answers capped at {cap}"


def test_both_pages_give_the_same_model() -> None:
    assert recipe_models("README.md") == recipe_models("docs/agents.md")
