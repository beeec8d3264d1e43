"""A registry entry's memory footprint before it is started: its files resolved as the
launch resolves them, estimated by :mod:`slm_server.memory.estimate`, and the key under
which a measured footprint is remembered (:class:`~slm_server.memory.store.FootprintKey`:
a different file, context or concurrency is a different footprint), and the size its
prompt cache is given (:mod:`slm_server.memory.prompt_cache`)."""

from __future__ import annotations

from pathlib import Path

from slm_server.launch.llama_argv import kv_cache_types
from slm_server.memory import prompt_cache
from slm_server.memory.estimate import Estimate, EstimateError, estimate_gguf, estimate_mlx
from slm_server.memory.store import FootprintKey
from slm_server.registry.model_path import ModelPathError, resolve_file_field, resolve_model_path
from slm_server.registry.schema import ModelEntry


class NoEstimate(Exception):
    """The entry's footprint cannot be estimated (a hub id not downloaded, a missing
    or unreadable file); the message says why."""


def _model_file(entry: ModelEntry) -> Path:
    try:
        path = Path(resolve_model_path(entry))
    except ModelPathError as exc:
        raise NoEstimate(exc.message) from None
    if not path.exists():
        raise NoEstimate(f"{path} is not a local file or directory")
    return path


def estimate_entry(entry: ModelEntry) -> Estimate:
    """The footprint the entry's backend will need; raises :class:`NoEstimate`."""
    model = _model_file(entry)
    try:
        if entry.backend == "llamacpp":
            cache_k, cache_v = kv_cache_types(entry)
            extra = []
            draft = None
            try:
                if entry.mmproj_path is not None:
                    extra.append(Path(resolve_file_field("mmproj_path", entry.mmproj_path)))
                if entry.spec_model_path is not None:
                    draft = Path(resolve_file_field("spec_model_path", entry.spec_model_path))
            except ModelPathError as exc:
                raise NoEstimate(exc.message) from None
            return estimate_gguf(
                model,
                context_length=entry.context_length,
                parallel=entry.max_concurrency,
                cache_type_k=cache_k,
                cache_type_v=cache_v,
                kv_unified=bool(entry.kv_unified),
                fit=entry.fit is not False,
                ubatch_size=entry.ubatch_size,
                swa_full=bool(entry.swa_full),
                draft_model=draft,
                extra_files=tuple(extra),
            )
        if model.is_dir():
            return estimate_mlx(
                model, context_length=entry.context_length, parallel=entry.max_concurrency
            )
        size_mb = max(1, model.stat().st_size // (1024 * 1024))
        return Estimate(size_mb, 0, 0, f"{model.name}: {size_mb} MiB of weights")
    except (EstimateError, OSError) as exc:
        raise NoEstimate(str(exc)) from None


def caches_prompts(entry: ModelEntry, native: bool) -> bool:
    """Whether the entry's server keeps a prompt cache in memory: a native llama-server
    generating text (see :mod:`slm_server.memory.prompt_cache` for the others)."""
    generates = entry.model_type not in ("embeddings", "rerank")
    return entry.backend == "llamacpp" and native and generates


def prompt_cache_mb(entry: ModelEntry, native: bool, budget_mb: int) -> int | None:
    """The most the entry's prompt cache holds, in MiB (0: it keeps none; ``None``:
    unbounded, ``cache_ram: -1``)."""
    if not caches_prompts(entry, native):
        return 0
    kv_mb = None
    if entry.cache_ram is None:
        try:
            kv_mb = estimate_entry(entry).kv_mb
        except NoEstimate:
            kv_mb = None
    return prompt_cache.size_mb(entry.cache_ram, kv_mb, budget_mb)


def footprint_key(entry: ModelEntry) -> FootprintKey | None:
    """The key a measured footprint of this entry is remembered under; None when its
    model is not a local file."""
    try:
        model = _model_file(entry)
    except NoEstimate:
        return None
    cache_k, cache_v = kv_cache_types(entry) if entry.backend == "llamacpp" else (None, None)
    flags = [f"kv_unified={entry.kv_unified}", f"spec={entry.spec_model_path}"]
    flags += [f"mmproj={entry.mmproj_path}", f"fit={entry.fit}", f"ubatch={entry.ubatch_size}"]
    if entry.swa_full:
        flags.append("swa_full=True")
    try:
        return FootprintKey.of(
            entry.backend,
            model,
            context_length=entry.context_length,
            parallel=entry.max_concurrency,
            cache_type_k=cache_k,
            cache_type_v=cache_v,
            extra=";".join(flags),
        )
    except OSError:
        return None


__all__ = [
    "NoEstimate",
    "caches_prompts",
    "estimate_entry",
    "footprint_key",
    "prompt_cache_mb",
]
