"""The registry's request presets and aliases, as written in ``config/models.yaml``.

An entry's ``preset`` and each of its ``aliases`` (a name, or a name with a preset of
its own) say how the router rewrites a text-generation request before it goes to the
backend::

    preset:
      max_output_tokens: 4096               # a cap: min(the client's, 4096); 4096 if none
      set: {temperature: 0.2}               # overrides the client
      default: {top_k: 40}                  # used when the client sends none
      strip: [frequency_penalty]            # removed
    aliases:
      - gpt-4o-mini                         # the entry's preset
      - name: qwen3-nothink                 # the entry's preset, then this one over it
        preset: {set: {chat_template_kwargs: {enable_thinking: false}}}

Parameters are named as chat completions name them; the router renames them for the
other API shapes (:mod:`slm_server.router.intake.presets`). Pure schema: what each
preset does to a request is decided there.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from slm_server.registry.tools import ToolPolicy, tools_items

# What the router itself reads and manages: no preset may set, default or strip them.
PROTECTED_PARAMETERS = frozenset({"model", "stream", "stream_options"})


class Preset(BaseModel):
    """What the owner imposes on every request for an entry or an alias."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    max_output_tokens: int | None = Field(default=None, ge=1)
    set_: dict[str, Any] = Field(default_factory=dict, alias="set")
    default: dict[str, Any] = Field(default_factory=dict)
    strip: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _names(self) -> Preset:
        """Every parameter named once, never one the router manages."""
        seen: dict[str, str] = {}
        for rule, names in (("set", self.set_), ("default", self.default), ("strip", self.strip)):
            for name in names:
                if not name:
                    raise ValueError(f"'{rule}' names an empty parameter")
                if name in PROTECTED_PARAMETERS:
                    raise ValueError(
                        f"'{rule}' names {name!r}, which the router manages "
                        f"(no preset may touch {', '.join(sorted(PROTECTED_PARAMETERS))})"
                    )
                if name in seen:
                    raise ValueError(f"{name!r} is in both '{seen[name]}' and '{rule}'")
                seen[name] = rule
        return self

    @property
    def empty(self) -> bool:
        return (
            self.max_output_tokens is None and not self.set_ and not self.default and not self.strip
        )


class Alias(BaseModel):
    """Another name for an entry, with a preset applied over the entry's."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    name: str = Field(min_length=1)
    preset: Preset | None = None
    # The entry's tool-call policy, with the fields written here over it.
    tools: ToolPolicy | None = None

    @field_validator("tools", mode="before")
    @classmethod
    def _plain_tools(cls, value: Any) -> Any:
        return tools_items(value)


def alias_items(value: Any) -> Any:
    """``aliases`` as written, each plain string made ``{name: <string>}``."""
    if isinstance(value, list):
        return [{"name": item} if isinstance(item, str) else item for item in value]
    return value


__all__ = ["PROTECTED_PARAMETERS", "Alias", "Preset", "alias_items"]
