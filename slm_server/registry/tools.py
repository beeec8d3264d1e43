"""The registry's tool-call policy, as written in ``config/models.yaml``. Pure schema.

An entry's ``tools`` (and an alias's, over the entry's) says how the router treats the
tools a chat request offers and the calls the model makes::

    tools: render                 # short for {mode: render}
    tools:
      mode: auto                  # native | render | auto (the default)
      repair: true                # check each call, mend what is lossless, retry once

``native``: the backend's chat template renders the tools (what the engine does with
them is the engine's). ``render``: the router writes the tools into the prompt itself
and reads the model's calls back from its text. ``auto``: native where the backend's
template takes tools (llama-server says so in its ``/props``), else render. What each
does to a request is :mod:`slm_server.router.toolcalls`'.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

ToolMode = Literal["auto", "native", "render"]


class ToolPolicy(BaseModel):
    """How the router treats an entry's (or an alias's) tools and tool calls."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    mode: ToolMode = "auto"
    repair: bool = True

    def over(self, base: ToolPolicy) -> ToolPolicy:
        """This policy over ``base``: the fields this one was written with win."""
        fields = {name: getattr(self, name) for name in self.model_fields_set}
        return base.model_copy(update=fields)


DEFAULT_TOOLS = ToolPolicy()


def tools_items(value: Any) -> Any:
    """``tools`` as written, a plain mode made ``{mode: <mode>}``."""
    if isinstance(value, str):
        return {"mode": value}
    return value


__all__ = ["DEFAULT_TOOLS", "ToolMode", "ToolPolicy", "tools_items"]
