"""Preparing a reload: the whole new registry read, validated and planned, and checked
against the machine as it runs, before anything changes.

A registry with any problem is refused whole (``invalid``: every problem of the file,
as ``check`` names them, and every entry that cannot be planned). One that is valid
but does not fit is refused too (``conflict``): its ``load: always`` models would need
more than the memory budget together, or an entry it adds or changes would listen on a
port that a process this supervisor did not start holds. Only then is the difference
(:mod:`~slm_server.supervise.core.registry_diff`) applied (:mod:`.apply`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from slm_server.contracts.applied_registry import version_of
from slm_server.launch.plan import LaunchPlan, PlanError, Toolchain, plan_launch
from slm_server.registry.schema import (
    ConfigError,
    ModelSpec,
    RegistryFile,
    inspect_registry,
    read_registry_text,
)
from slm_server.supervise.core.registry_diff import (
    LaunchKey,
    RegistryDiff,
    diff_registries,
    launch_key,
)

RefusalKind = Literal["invalid", "conflict", "stopping"]


@dataclass(frozen=True)
class Refusal:
    kind: RefusalKind
    problems: tuple[str, ...]

    @property
    def message(self) -> str:
        what = {
            "invalid": "the registry has problems; nothing was changed",
            "conflict": "the registry does not fit the running gateway; nothing was changed",
            "stopping": "the supervisor is shutting down",
        }[self.kind]
        return f"{what}: " + "; ".join(self.problems) if self.problems else what


@dataclass(frozen=True)
class Prepared:
    """A new registry ready to apply: its text and version, the validated registry, the
    plan and launch key of each backend (by role) and the difference from the running
    one."""

    text: str
    version: str
    registry: RegistryFile
    plans: Mapping[str, LaunchPlan]
    keys: Mapping[str, LaunchKey]
    diff: RegistryDiff


def plan_all(
    registry: RegistryFile,
    tools: Toolchain,
    log_dir: Path,
    *,
    budget_mb: int,
    slot_dir: Path | None = None,
) -> tuple[dict[str, LaunchPlan], dict[str, LaunchKey], list[str]]:
    """Plans and launch keys for every backend of ``registry``, and the problems of
    the entries that cannot be planned."""
    plans: dict[str, LaunchPlan] = {}
    keys: dict[str, LaunchKey] = {}
    problems: list[str] = []
    for spec in registry.models:
        entry = spec.entry
        if entry.enabled and not entry.remote:
            try:
                plans[spec.role] = plan_launch(
                    spec, tools, log_dir, str(registry.path), budget_mb=budget_mb, slot_dir=slot_dir
                )
            except PlanError as exc:
                problems += [str(p) for p in exc.problems]
                keys[spec.role] = ("unplanned", entry.model_dump_json())
                continue
        keys[spec.role] = launch_key(spec, plans.get(spec.role))
    return plans, keys, problems


def prepare(
    path: Path,
    running: Mapping[str, LaunchKey],
    tools: Toolchain,
    log_dir: Path,
    *,
    budget_mb: int,
    slot_dir: Path | None = None,
) -> Prepared | Refusal:
    """Read and validate the registry at ``path`` and diff it against the ``running``
    launch keys; a :class:`Refusal` naming every problem when it cannot be used."""
    try:
        text = read_registry_text(path)
        registry = inspect_registry(text, path)
    except ConfigError as exc:
        return Refusal("invalid", tuple(str(p) for p in exc.problems))
    problems = [str(p) for p in registry.problems]
    plans, keys, plan_problems = plan_all(
        registry, tools, log_dir, budget_mb=budget_mb, slot_dir=slot_dir
    )
    problems += plan_problems
    if problems:
        return Refusal("invalid", tuple(problems))
    diff = diff_registries(running, keys)
    return Prepared(text, version_of(text), registry, plans, keys, diff)


def conflicts(
    prepared: Prepared,
    budget_mb: int,
    footprint: Callable[[ModelSpec], int | None],
    port_taken: Callable[[ModelSpec, LaunchPlan], str | None],
) -> list[str]:
    """What keeps a valid registry from being applied on this machine now: its
    ``load: always`` models' footprints (``footprint`` of each, None when unknown)
    beyond ``budget_mb`` together, and the ports of added or changed backends held by
    a process not ours (``port_taken``: who holds it, None when free or ours)."""
    found: list[str] = []
    source = str(prepared.registry.path)
    always = [
        (spec, footprint(spec))
        for spec in prepared.registry.enabled
        if not spec.entry.remote and spec.entry.load == "always"
    ]
    total = sum(mb for _spec, mb in always if mb is not None)
    if total > budget_mb:
        shown = ", ".join(f"{s.role} {mb} MiB" for s, mb in always if mb is not None)
        found.append(
            f"{source}: the load: always models would need {total} MiB together ({shown}), "
            f"more than the memory budget of {budget_mb} MiB (SLM_MEMORY_BUDGET_MB)"
        )
    moving = set(prepared.diff.added) | set(prepared.diff.replaced)
    for spec in prepared.registry.enabled:
        plan = prepared.plans.get(spec.role)
        if spec.role not in moving or plan is None:
            continue
        holder = port_taken(spec, plan)
        if holder is not None:
            found.append(
                f"{source}: {spec.label}: port: {plan.port} is in use by {holder}, "
                "a process slm_server did not start"
            )
    return found


__all__ = ["Prepared", "Refusal", "conflicts", "plan_all", "prepare"]
