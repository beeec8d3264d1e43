"""The chat template an added chat model is served with. llama-server applies the one
the GGUF carries (``tokenizer.chat_template``); a file without one would be served in
ChatML, which is wrong for most models, so a template this project ships for the
file's architecture is named instead, and otherwise ``add`` warns."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

# Architecture (``general.architecture``) -> a template shipped in the project.
SHIPPED: Final[Mapping[str, str]] = {"gemma3": "config/gemma3-chat-template.jinja"}


@dataclass(frozen=True)
class Template:
    file: str | None  # the entry's chat_template_file, when one is needed
    line: str  # what add prints about it


def template_for(metadata: Mapping[str, Any], architecture: str | None, kind: str) -> Template:
    if kind != "chat":
        return Template(None, "")
    own = metadata.get("tokenizer.chat_template")
    if isinstance(own, str) and own.strip():
        return Template(None, "template: the file's own (tokenizer.chat_template)")
    shipped = SHIPPED.get(architecture or "")
    if shipped is not None:
        return Template(
            shipped, f"template: the file carries none; {shipped} (the {architecture} turns)"
        )
    return Template(
        None,
        f"warning: the file carries no chat template and none ships for {architecture!r}: "
        "llama-server falls back to ChatML; set chat_template_file if the model expects "
        "another format",
    )


__all__ = ["SHIPPED", "Template", "template_for"]
