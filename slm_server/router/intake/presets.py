"""Request presets: what the registry imposes on a text-generation request. Pure.

A preset caps output tokens, sets parameters over the client's, gives defaults for what
the client leaves out, and strips parameters. The rules, in the order they act:

* **Layers.** An alias's preset lies over its entry's: a parameter the alias names takes
  the alias's rule (set, default or strip) whatever the entry says of it, and the
  alias's cap replaces the entry's. The entry's ``chat_template_kwargs`` field is a
  default under both (what it always was: added when the request carries none).
* **strip** removes the parameter; **default** adds it when the request does not carry
  it (a ``null`` the client sent is the client's: kept); **set** writes it whatever the
  request says.
* **Cap**, last: every field by which the shape's backends bound the output is made
  ``min(the client's, cap)``; a value that is not a non-negative integer (``null``,
  ``-1``, a string, ``true``) counts as unbounded and becomes the cap; with none the
  shape's own field is added, set to the cap. The cap bounds each choice, as
  ``max_tokens`` does (``n`` choices may generate ``n`` times it).

Parameters are named in a preset as chat completions name them; :data:`SHAPES` says how
each API shape (by its name in the table of shapes) names them (None: the shape has no
such parameter, the rule is skipped) and which of its fields bound the output; another
shape is one more row.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from slm_server.registry.presets import Preset
from slm_server.registry.schema import ModelEntry

Action = Literal["set", "default", "strip"]

# llama-server reads the output bound of chat and completions from any of these (the
# first present of n_predict, max_completion_tokens, max_tokens); the other servers
# read max_tokens or max_completion_tokens. All are capped, so no name slips by.
CHAT_LIMITS = ("max_tokens", "max_completion_tokens", "n_predict")


@dataclass(frozen=True, slots=True)
class ApiShape:
    """How one API shape names things: ``limits`` are the fields that bound its output
    (the first is the one added when the request has none), ``names`` renames
    parameters from their chat completions names (None: not in this shape)."""

    name: str
    limits: tuple[str, ...]
    names: Mapping[str, str | None] = field(default_factory=dict)
    # A default for the parameter is not used when the client sent any of these fields
    # instead (Messages: ``thinking`` says what ``chat_template_kwargs`` would).
    stands_for: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def own_name(self, name: str) -> str | None:
        """``name`` (a chat completions parameter) as this shape calls it."""
        return self.names.get(name, name)


SHAPES: Mapping[str, ApiShape] = MappingProxyType(
    {
        "chat": ApiShape("chat", CHAT_LIMITS),
        "completions": ApiShape("completions", CHAT_LIMITS, {"chat_template_kwargs": None}),
        # Translated to chat completions for most backends, where max_output_tokens
        # becomes max_tokens and fields unknown to the Responses API pass unchanged
        # (so a max_tokens or n_predict sent here is capped too).
        "responses": ApiShape(
            "responses",
            ("max_output_tokens", *CHAT_LIMITS),
            {"max_tokens": "max_output_tokens", "max_completion_tokens": "max_output_tokens"},
        ),
        # Anthropic's Messages API, translated to chat completions: max_tokens bounds
        # the output, stop_sequences are the stops; ``thinking`` stands for
        # chat_template_kwargs.enable_thinking, so a default for chat_template_kwargs
        # gives way to it as to the client's own.
        "messages": ApiShape(
            "messages",
            ("max_tokens", "max_completion_tokens", "n_predict"),
            {"max_completion_tokens": "max_tokens", "stop": "stop_sequences"},
            {"chat_template_kwargs": ("thinking",)},
        ),
    }
)


@dataclass(frozen=True, slots=True)
class Rule:
    action: Action
    value: Any = None


@dataclass(frozen=True, slots=True)
class Rules:
    """A preset resolved for one name a client may send: the cap and one rule per
    parameter."""

    cap: int | None = None
    rules: Mapping[str, Rule] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return self.cap is None and not self.rules

    def over(self, under: Rules) -> Rules:
        """These rules laid over ``under``: ours win parameter by parameter, our cap
        replaces its."""
        return Rules(self.cap if self.cap is not None else under.cap, {**under.rules, **self.rules})


NO_RULES = Rules()


def rules_of(preset: Preset | None) -> Rules:
    """A registry preset as rules."""
    if preset is None:
        return NO_RULES
    rules: dict[str, Rule] = {}
    rules.update((name, Rule("default", value)) for name, value in preset.default.items())
    rules.update((name, Rule("set", value)) for name, value in preset.set_.items())
    rules.update((name, Rule("strip")) for name in preset.strip)
    return Rules(preset.max_output_tokens, rules)


def resolve(entry: ModelEntry, alias: str | None) -> Rules:
    """The rules for a request naming ``entry`` by its id (``alias`` None) or by one of
    its aliases: the alias's preset over the entry's, over its ``chat_template_kwargs``."""
    rules = NO_RULES
    if entry.chat_template_kwargs is not None:
        rules = Rules(rules={"chat_template_kwargs": Rule("default", entry.chat_template_kwargs)})
    rules = rules_of(entry.preset).over(rules)
    if alias is not None:
        rules = rules_of(entry.alias_preset(alias)).over(rules)
    return rules


def apply_preset(body: dict[str, Any], shape: ApiShape, rules: Rules) -> dict[str, Any]:
    """``body`` with ``rules`` applied in ``shape``'s names: ``body`` itself when nothing
    changes, else a new dict (values from the registry are copied, never shared)."""
    out = dict(body)
    for name, rule in rules.rules.items():
        own = shape.own_name(name)
        if own is None:
            continue
        if rule.action == "strip":
            out.pop(own, None)
        elif rule.action == "set" or (
            own not in out and not any(f in out for f in shape.stands_for.get(name, ()))
        ):
            out[own] = copy.deepcopy(rule.value)
    cap = rules.cap
    if cap is not None:
        present = [name for name in shape.limits if name in out]
        for name in present:
            if not _within(out[name], cap):
                out[name] = cap
        if not present:
            out[shape.limits[0]] = cap
    return body if _same(out, body) else out


def cap_binds(body: dict[str, Any], shape: ApiShape, rules: Rules) -> bool:
    """Whether ``rules``' cap, not a bound the client sent, limits the output of
    ``body`` (the request as the client sent it): there is a cap, and no field of the
    shape's that bounds the output is within it. An answer cut there was cut by the
    owner's cap, which the client never asked for."""
    cap = rules.cap
    if cap is None:
        return False
    return not any(name in body and _within(body[name], cap) for name in shape.limits)


def _same(out: dict[str, Any], body: dict[str, Any]) -> bool:
    """Whether ``out`` holds exactly ``body``'s fields, each the very same object."""
    return out.keys() == body.keys() and all(out[k] is body[k] for k in out)


def _within(value: Any, cap: int) -> bool:
    """Whether a client's output bound already keeps within ``cap``."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= cap


__all__ = [
    "SHAPES",
    "ApiShape",
    "Rule",
    "Rules",
    "apply_preset",
    "cap_binds",
    "resolve",
    "rules_of",
]
