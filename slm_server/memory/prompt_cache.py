"""How much memory a backend's prompt cache may take, counted in its footprint.

llama-server keeps the prompt state of a slot it switches away from in a host-memory
cache (``--cache-ram``, ``server_prompt_cache`` in ``tools/server/server-task.cpp`` at
the pinned release), so that a conversation coming back finds its prefix. The cache
starts empty and fills with use: it is not in the estimate (``estimate.py``) nor in
the resident memory measured at ready. Left to its default (8 GiB) it lets three
models admitted within a budget later hold 24 GiB more than it. So every native
llama-server gets a size, and admission counts it on top of the rest.

The size, when the registry's ``cache_ram`` leaves it unset::

    size = min(SERVER_DEFAULT_MB, CONTEXTS * kv, budget // BUDGET_SHARE)

``kv`` is the model's KV cache at its configured context and slots (every slot's
whole context, from the estimate): the cache then holds two full copies of what the
slots can hold, room enough to switch between two long conversations per slot. It
never takes more than an eighth of the memory budget, nor more than the server's own
default. When the KV cache cannot be estimated (a file that is not GGUF), the budget's
share alone, capped at the server's default.

The server keeps to its limit by dropping the oldest entries before it allocates a new
one, and skips a prompt whose state alone is larger than the limit (it then simply is
not cached). What it does not count: a slot's own context checkpoints (sliding-window
models), which live in the slot.

Other servers: llama-cpp-python's server has no prompt cache unless asked (we never
ask: 0). ``mlx-openai-server`` (1.8.1, the pinned release) writes its prompt caches to
disk and keeps only their index in memory (``app/utils/prompt_cache.py``): 0 MiB of
memory. Embedding and rerank models never fill the cache (the server caches completion
tasks only): 0, and llama-server is told so (``--cache-ram 0``).
"""

from __future__ import annotations

from typing import Final

SERVER_DEFAULT_MB: Final = 8192  # common_params::cache_ram_mib at the pinned release
CONTEXTS: Final = 2
BUDGET_SHARE: Final = 8
UNBOUNDED: Final = -1  # ``cache_ram: -1``: no limit (the server's own meaning)


def default_size_mb(kv_mb: int | None, budget_mb: int) -> int:
    """The prompt cache's size for a model whose KV cache takes ``kv_mb`` (``None``:
    unknown) under a memory budget of ``budget_mb``."""
    if budget_mb < 1:
        raise ValueError(f"the memory budget must be positive, not {budget_mb} MiB")
    ceiling = min(SERVER_DEFAULT_MB, budget_mb // BUDGET_SHARE)
    if kv_mb is None:
        return ceiling
    return min(ceiling, CONTEXTS * max(0, kv_mb))


def size_mb(cache_ram: int | None, kv_mb: int | None, budget_mb: int) -> int | None:
    """The size a native llama-server's prompt cache is given: the registry's
    ``cache_ram`` when set (``None`` for -1: unbounded), else :func:`default_size_mb`."""
    if cache_ram is None:
        return default_size_mb(kv_mb, budget_mb)
    if cache_ram == UNBOUNDED:
        return None
    if cache_ram < 0:
        raise ValueError(f"cache_ram must be -1 or more, not {cache_ram}")
    return cache_ram


__all__ = ["BUDGET_SHARE", "CONTEXTS", "SERVER_DEFAULT_MB", "default_size_mb", "size_mb"]
