"""What will not work, said before an agent starts, and the model chosen when none is
named. Pure: it judges a :class:`~.survey.Survey` (the gateway's ``/v1/models`` objects
and its registry's caps) for one :class:`~.agents.Agent`.

=========  ==============================================================================
error      the gateway does not answer, or refuses the key; the model is unknown, not a
           chat model, or its backend is gone (abandoned, failed, stopped): the agent is
           not started
warning    the model's context is shorter than the agent's prompt; its template takes no
           tools (the gateway writes them into the prompt itself), or ``tools: native``
           on a template that may take none; no output cap on a small model (weights
           under 1 GiB), which rarely stops by itself
note       what cannot be told: a context the gateway does not know, whether a template
           not yet loaded takes tools, a cap the registry here does not show, no cap on a
           larger model
=========  ==============================================================================

Warnings and notes do not stop the launch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from slm_server.cli.launch.agents import Agent
from slm_server.cli.launch.survey import Local, Survey

Severity = Literal["error", "warning", "note"]
CHAT_TYPES: Final = frozenset({"lm", "multimodal"})
# A backend in one of these serves nothing until it is started again.
GONE_STATES: Final = frozenset({"abandoned", "failed", "stopped", "disabled"})
# Weights under this are a model of about 1B parameters at 8 bits (2B at 4 bits): the
# size of SmolLM2 135M and Gemma 3 270M, which wrote on until the deadline cut them
# (docs/agents.md). Larger instruction-tuned models end their turns.
SMALL_WEIGHTS_BYTES: Final = 1 << 30


@dataclass(frozen=True)
class Finding:
    """One thing the preflight says, on a line of its own."""

    severity: Severity
    text: str

    def __str__(self) -> str:
        return f"{self.severity}: {self.text}"


def is_chat(model: Mapping[str, Any]) -> bool:
    return model.get("model_type") in CHAT_TYPES


def _state(model: Mapping[str, Any]) -> str | None:
    status = model.get("status")
    state = status.get("state") if isinstance(status, dict) else None
    return state if isinstance(state, str) else None


def _fits(agent: Agent, model: Mapping[str, Any]) -> bool:
    context = model.get("context_length")
    return isinstance(context, int) and context >= agent.prompt_tokens


def cap_of(survey: Survey, name: str) -> int | None:
    """The output cap requests naming ``name`` get, as far as the registry here says."""
    fact = survey.local.get(name) if survey.local is not None else None
    return fact.cap if fact is not None else None


def choose_model(agent: Agent, survey: Survey) -> str | None:
    """The model ``launch`` names when none is given: of the gateway's chat models (its
    list: the registry's order, each model followed by its aliases) whose backend is not
    gone, the first whose context holds the agent's prompt and whose output is capped;
    else the first whose context holds it; else the first. None when there is none."""
    candidates = [m for m in survey.models if is_chat(m) and _state(m) not in GONE_STATES]
    ranked = sorted(
        range(len(candidates)),
        key=lambda i: (
            not _fits(agent, candidates[i]),
            cap_of(survey, str(candidates[i].get("id"))) is None,
            i,
        ),
    )
    return str(candidates[ranked[0]].get("id")) if ranked else None


def model_errors(agent: Agent, survey: Survey, name: str) -> list[Finding]:
    """Why ``name`` cannot serve ``agent`` at all (empty when it can)."""
    if name in survey.refused:
        return [Finding("error", survey.refused[name])]
    model = survey.model(name)
    chat = [str(m.get("id")) for m in survey.models if is_chat(m)]
    if model is None:
        listed = f"; its chat models: {', '.join(chat)}" if chat else ""
        return [Finding("error", f"the gateway serves no model named {name!r}{listed}")]
    if not is_chat(model):
        return [
            Finding(
                "error",
                f"{name} is not a chat model (model_type {model.get('model_type')}): "
                f"{agent.title} needs one of: {', '.join(chat) or 'none is served'}",
            )
        ]
    state = _state(model)
    if state in GONE_STATES:
        return [
            Finding(
                "error",
                f"{name}'s backend is {state}: the gateway refuses its requests until it "
                "runs again (python -m slm_server reload, or restart the gateway)",
            )
        ]
    return []


def preflight(agent: Agent, survey: Survey, name: str | None) -> list[Finding]:
    """Everything the preflight says of launching ``agent`` on ``name`` (None: no
    model could be chosen) at the surveyed gateway, errors first."""
    if survey.down is not None:
        return [
            Finding(
                "error",
                f"the gateway at {survey.url} does not answer ({survey.down}): start it "
                "with ./start.sh, or give its address with --url",
            )
        ]
    if survey.key_refused:
        return [
            Finding(
                "error",
                f"the gateway at {survey.url} refused the API key (401): give one of its "
                "keys with --api-key, or set SLM_API_KEYS here as the gateway has it",
            )
        ]
    if name is None:
        return [
            Finding(
                "error",
                f"the gateway at {survey.url} serves no chat model for {agent.title} "
                "(model_type lm or multimodal)",
            )
        ]
    errors = model_errors(agent, survey, name)
    model = survey.model(name)
    if errors or model is None:
        return errors
    return [
        *_context(agent, name, model),
        *_tools(agent, name, model),
        *_output(agent, survey, name),
    ]


def _context(agent: Agent, name: str, model: Mapping[str, Any]) -> list[Finding]:
    context = model.get("context_length")
    prompt = (
        f"{agent.title}'s prompt (about {agent.prompt_tokens:,} tokens of system prompt and tools)"
    )
    if not isinstance(context, int):
        return [
            Finding(
                "note",
                f"{name} has no context_length: the model's own applies, which the "
                f"gateway does not report; {prompt} needs that much",
            )
        ]
    if context < agent.prompt_tokens:
        return [
            Finding(
                "warning",
                f"{name}'s context of {context:,} tokens is shorter than {prompt}: its "
                "requests will be refused (400) unless the prompt is cut down; give the "
                "entry a longer context_length (docs/agents.md)",
            )
        ]
    return []


def _tools(agent: Agent, name: str, model: Mapping[str, Any]) -> list[Finding]:
    tools = model.get("tools")
    if not isinstance(tools, dict):
        return []
    mode, applies = tools.get("mode"), tools.get("applies")
    checked = (
        "every call is checked and mended"
        if tools.get("repair", True)
        else "calls are passed as the model wrote them (repair: false)"
    )
    if applies == "render":
        return [
            Finding(
                "warning",
                f"{name}'s chat template takes no tools: the gateway writes {agent.title}'s "
                f"tools into the prompt itself and reads the calls back from the model's "
                f"text (tools: {mode}); {checked}",
            )
        ]
    if mode == "native" and not model.get("supports_function_calling"):
        return [
            Finding(
                "warning",
                f"{name} has tools: native and its entry does not say its template takes "
                "tools (supports_function_calling: false): a template that takes none "
                f"leaves {agent.title}'s tools out of the prompt; tools: auto or render "
                "has the gateway write them in",
            )
        ]
    if applies is None and mode == "auto":
        return [
            Finding(
                "note",
                f"whether {name}'s template takes tools is known once its backend runs: "
                f"if it takes none, the gateway writes {agent.title}'s tools into the prompt",
            )
        ]
    return []


def _output(agent: Agent, survey: Survey, name: str) -> list[Finding]:
    local = survey.local
    fact = local.get(name) if local is not None else None
    if local is None or fact is None:
        why = survey.local_note or "its registry here does not list it"
        return [Finding("note", f"{name}'s output cap is not known: {why}")]
    if fact.cap is not None:
        return []
    asks = f"{agent.title} asks for {agent.asks_for}"
    if fact.weights_bytes is None or fact.weights_bytes >= SMALL_WEIGHTS_BYTES:
        return [Finding("note", f"{name} has no output cap: {asks}")]
    return [
        Finding(
            "warning",
            f"{name} has no output cap (max_output_tokens in its entry's or alias's preset) "
            f"and a model this small ({_size(fact.weights_bytes)} of weights) "
            f"rarely stops by itself: {asks}, so each answer runs until the gateway's "
            f"deadline (the entry's default_timeout) cuts it; {_capped_instead(local, fact)}",
        )
    ]


def _size(count: int) -> str:
    if count >= 1 << 20:
        return f"{count / (1 << 20):,.0f} MiB"
    return f"{count / 1024:,.0f} KiB"


def _capped_instead(local: Mapping[str, Local], fact: Local) -> str:
    """What to name instead of an uncapped model: its capped aliases, or how to cap it."""
    capped = [(n, f.cap) for n, f in local.items() if f.entry == fact.entry and f.cap is not None]
    if capped:
        return "name " + " or ".join(f"{n} (capped at {c} tokens)" for n, c in capped)
    return "give its entry or an alias preset: {max_output_tokens: 256} (docs/agents.md)"


__all__ = [
    "CHAT_TYPES",
    "GONE_STATES",
    "SMALL_WEIGHTS_BYTES",
    "Finding",
    "cap_of",
    "choose_model",
    "is_chat",
    "model_errors",
    "preflight",
]
