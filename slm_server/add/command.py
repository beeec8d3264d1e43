"""``python -m slm_server add PATH|NAME``: read the file, decide the entry, check the
registry it makes, print it and the memory it needs, and write it (unless a dry run).

:func:`add_entry` does the work and says what came of it (:class:`Added` or
:class:`Refused`, printing nothing: the router's ``POST /v1/models/add`` answers with
it); :func:`add_model` prints that for the command line. The reload that follows is the
caller's (:mod:`slm_server.add.reload`)."""

from __future__ import annotations

import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from slm_server.add import entry as values
from slm_server.add.append import NEW_FILE, Unappendable, appended, entries_of, write_atomically
from slm_server.add.source import NotFound, Source, find_source
from slm_server.add.template import template_for
from slm_server.discover.found import read_found
from slm_server.launch.footprint import NoEstimate, caches_prompts, estimate_entry
from slm_server.memory import prompt_cache
from slm_server.memory.gguf_header import GgufError, read_header
from slm_server.registry.schema import (
    ModelEntry,
    inspect_registry,
    read_registry_text,
)
from slm_server.settings import PROJECT_ROOT, Settings


@dataclass(frozen=True)
class Request:
    """What the command line asked for."""

    given: str  # a path or a listed name
    model_id: str | None = None
    load: str = "on_demand"
    port: int | None = None
    dry_run: bool = False


def port_is_free(port: int) -> bool:
    """Whether nothing listens on 127.0.0.1:``port`` (a bind succeeds)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def footprint_mb(fields: Mapping[str, Any], budget_mb: int) -> int:
    """What ``check`` admits the entry by: the estimate and its prompt cache's size
    (a native llama-server's); raises :class:`NoEstimate`."""
    entry = ModelEntry.model_validate(dict(fields))
    estimate = estimate_entry(entry)
    cache = 0
    if caches_prompts(entry, native=True):
        cache = prompt_cache.size_mb(entry.cache_ram, estimate.kv_mb, budget_mb) or 0
    return estimate.mb + cache


# Why an entry was not added: the API's error code for each is its own.
Reason = Literal[
    "not_found",  # neither a file nor a listed name
    "not_gguf",  # the file is no GGUF model
    "unappendable",  # the registry's layout takes no appended entry
    "taken",  # the id or its role is in use
    "no_port",  # no free port left
    "not_checked",  # the registry with the entry would not pass ``check``
    "not_written",  # the registry file could not be written
    "unreadable",  # the registry cannot be read (a caller's, from ``ConfigError``)
]


@dataclass(frozen=True)
class Refused:
    """An entry not added (nothing written): why, and the problems ``check`` found."""

    reason: Reason
    message: str
    problems: tuple[str, ...] = ()

    def lines(self) -> list[str]:
        """What the command line prints on stderr."""
        if self.problems:
            return [self.message, *(f"  {problem}" for problem in self.problems)]
        hint = "; choose another with --id" if self.reason == "taken" else ""
        return [f"error: {self.message}{hint}"]


@dataclass(frozen=True)
class Added:
    """An entry written (or, in a dry run, shown): its role and id, its fields as
    written, the registry file, and what the command line prints."""

    role: str
    model_id: str
    fields: dict[str, Any]
    registry: Path
    text: str  # the entry's lines as appended, its comment first
    notes: tuple[str, ...]  # the memory it needs, the chat template it was given
    dry_run: bool = False

    def lines(self) -> list[str]:
        """What the command line prints on stdout, one line each."""
        written = "would be added (dry run: nothing written)" if self.dry_run else "added"
        head = f"{self.role} ({self.model_id}) {written} to {self.registry}:"
        return [head, *self.text.splitlines(), *self.notes]


def _memory_lines(
    fields: dict[str, Any], trained: int | None, budget_mb: int
) -> tuple[list[str], dict[str, Any]]:
    """The context that fits, set in ``fields``, and the lines that say so."""
    budget = f"the memory budget of {budget_mb} MiB (SLM_MEMORY_BUDGET_MB)"
    if trained is None:
        try:
            needed = footprint_mb(fields, budget_mb)
        except NoEstimate as exc:
            return [f"memory: no estimate ({exc}); {budget}"], fields
        over = "more than" if needed > budget_mb else "within"
        return [f"memory: ~{needed} MiB, {over} {budget}"], fields
    try:
        fit = values.fit_context(
            trained, lambda n: footprint_mb({**fields, "context_length": n}, budget_mb), budget_mb
        )
    except NoEstimate as exc:
        return [f"memory: no estimate ({exc}); {budget}"], {**fields, "context_length": trained}
    fitted = {**fields, "context_length": fit.context}
    if not fit.fits:
        return [
            f"warning: ~{fit.needed_mb} MiB even at context {fit.context}, more than {budget}: "
            "written anyway, but `check` refuses it until the budget is raised"
        ], fitted
    why = (
        "the file's trained context"
        if fit.context == trained
        else f"capped from the trained {trained} to fit"
    )
    return [f"memory: ~{fit.needed_mb} MiB at context {fit.context} ({why}); {budget}"], fitted


def _existing_text(path: Path) -> str:
    """The registry's text; empty when there is no file yet."""
    return read_registry_text(path) if path.exists() else ""


def add_entry(
    settings: Settings, request: Request, env: Mapping[str, str], source: Source | None = None
) -> Added | Refused:
    """Decide, check and (unless a dry run) write the entry for ``request`` (the file
    ``source`` when given, else the one ``request.given`` names); prints nothing. A
    registry that cannot be read raises ``ConfigError``."""
    try:
        if source is None:
            source = find_source(request.given, env, settings.pull.models_dir)
        metadata = read_header(source.path).metadata
    except NotFound as exc:
        return Refused("not_found", str(exc))
    except (GgufError, OSError) as exc:
        return Refused("not_gguf", f"{request.given} is not a GGUF model file: {exc}")
    facts = read_found(source.candidate())
    path = settings.config_path
    text = _existing_text(path)
    base = text if text.strip() else NEW_FILE
    try:
        entries = entries_of(base)
    except yaml.YAMLError:
        inspect_registry(base, path)  # raises ConfigError, naming the line
        raise
    except Unappendable as exc:
        return Refused("unappendable", f"{path}: {exc}")
    model_id = request.model_id or values.model_id(source.name)
    role = values.role_for(model_id)
    refused = values.taken(model_id, role, entries)
    if refused is not None:
        return Refused("taken", f"{refused} ({path})")
    try:
        port = request.port or values.next_port(values.used_ports(entries), port_is_free)
    except values.NoPort as exc:
        return Refused("no_port", str(exc))
    arch = facts.architecture
    pooling = metadata.get(f"{arch}.pooling_type") if arch else None
    template = template_for(metadata, arch, facts.type or "chat")
    fields = values.entry_fields(
        model_id=model_id,
        port=port,
        model_path=values.model_path_text(source.path, PROJECT_ROOT),
        quantization=facts.quantization,
        kind=facts.type or "chat",
        pooling=pooling if isinstance(pooling, int) and not isinstance(pooling, bool) else None,
        context=facts.context_length,  # then fitted to the budget, in its place
        load=request.load,
        chat_template_file=template.file,
    )
    memory, fields = _memory_lines(fields, facts.context_length, settings.memory.budget_mb)
    comment = f"{source.name}: added by python -m slm_server add"
    try:
        new_text = appended(text, role, fields, comment)
    except Unappendable as exc:
        return Refused("unappendable", f"{path}: {exc}")
    checked = inspect_registry(new_text, path)
    if checked.problems:
        return Refused(
            "not_checked",
            f"the entry was not written: {path} would not pass `check`",
            tuple(str(problem) for problem in checked.problems),
        )
    if not request.dry_run:
        try:
            write_atomically(path, new_text)
        except OSError as exc:
            return Refused("not_written", f"{path} not written: {exc}")
    notes = tuple(line for line in [*memory, template.line] if line)
    snippet = new_text[len(base) :].strip("\n")
    return Added(role, model_id, dict(fields), path, snippet, notes, request.dry_run)


def add_model(settings: Settings, request: Request, env: Mapping[str, str]) -> int:
    """Decide, check, print and (unless a dry run) write the entry; 0 when written or
    shown. A registry that cannot be read raises ``ConfigError``."""
    result = add_entry(settings, request, env)
    if isinstance(result, Refused):
        for line in result.lines():
            print(line, file=sys.stderr)
        return 1
    for line in result.lines():
        print(line)
    return 0


__all__ = [
    "Added",
    "Reason",
    "Refused",
    "Request",
    "add_entry",
    "add_model",
    "footprint_mb",
    "port_is_free",
]
