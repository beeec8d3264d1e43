"""What a reload changes: each backend of the running registry and of the new one,
compared by its *effective launch*. Pure (the file stamps are read by the caller's
``stat``).

A backend's launch key is what makes its process what it is: the command line its
plan runs (which carries every launch field: model, context, slots, cache, template,
sampling flags), where it listens, which server runs it, whether it is loaded at
launch or on demand, and the size and modification time of every file the command
line names (a model file replaced in place is a change). Fields the router alone reads
(timeouts, queue and concurrency limits, presets, aliases, routing, request defaults)
are not in it: changing one keeps the process. A remote is keyed by its url, key name
and remote model; a disabled entry by being disabled.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from slm_server.launch.plan import LaunchPlan
from slm_server.registry.schema import ModelSpec

LaunchKey = tuple[object, ...]
Stat = Callable[[str], os.stat_result]


def _file_stamps(argv: tuple[str, ...], stat: Stat) -> tuple[tuple[str, int, int], ...]:
    stamps: list[tuple[str, int, int]] = []
    for arg in argv[1:]:
        if not os.path.isabs(arg):
            continue
        try:
            info = stat(arg)
        except OSError:
            continue
        if os.path.isfile(arg):
            stamps.append((arg, info.st_size, info.st_mtime_ns))
    return tuple(stamps)


def launch_key(spec: ModelSpec, plan: LaunchPlan | None, stat: Stat = os.stat) -> LaunchKey:
    """The effective launch of ``spec`` (its ``plan``, None for a remote or a disabled
    entry): equal keys, same process."""
    entry = spec.entry
    if not entry.enabled:
        return ("disabled",)
    if entry.remote:
        return ("remote", entry.url, entry.api_key_env, entry.remote_model)
    assert plan is not None
    return (
        "local",
        entry.backend,
        entry.load,
        plan.kind,
        plan.host,
        plan.port,
        plan.argv,
        plan.health_path,
        _file_stamps(plan.argv, stat),
    )


@dataclass(frozen=True)
class RegistryDiff:
    """Roles (one per replica) by what a reload does with them, in registry order
    (``removed`` in the running registry's order)."""

    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    replaced: tuple[str, ...] = ()
    unchanged: tuple[str, ...] = ()

    @property
    def changes(self) -> bool:
        return bool(self.added or self.removed or self.replaced)

    def to_fields(self) -> dict[str, list[str]]:
        return {
            "added": list(self.added),
            "removed": list(self.removed),
            "replaced": list(self.replaced),
            "unchanged": list(self.unchanged),
        }


def diff_registries(old: Mapping[str, LaunchKey], new: Mapping[str, LaunchKey]) -> RegistryDiff:
    """Compare the launch keys of the running registry's roles with the new one's."""
    added = tuple(role for role in new if role not in old)
    removed = tuple(role for role in old if role not in new)
    replaced = tuple(role for role in new if role in old and old[role] != new[role])
    unchanged = tuple(role for role in new if role in old and old[role] == new[role])
    return RegistryDiff(added, removed, replaced, unchanged)


__all__ = ["LaunchKey", "RegistryDiff", "diff_registries", "launch_key"]
