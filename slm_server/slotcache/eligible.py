"""Which backends keep their slots' prompt caches across an unload and a load.

Only a native llama-server that generates text can: it saves a slot with
``POST /slots/{id}?action=save`` (given ``--slot-save-path``) and restores it with
``?action=restore``. Not kept, and said so:

- sliding-window attention (Gemma 2 and 3, and the others of ``SWA_PATTERNS``) unless
  the entry sets ``swa_full: true``: at the pinned release a restored sliding-window
  cache saves and restores without an error, yet the next request evaluates the whole
  prompt again (Gemma 3 270M, a 941-token prompt: 941 evaluated after the restore).
  With ``--swa-full`` (those layers hold the whole context, as the others do: more
  memory, counted by the estimate) the restored cache is reused (1 evaluated);
- embedding and rerank models (nothing to continue), llama-cpp-python's server (no
  slot API), MLX servers (no equivalent at mlx-openai-server 1.8.1);
- a model whose registry entry says ``slot_cache: false``, or every model with
  ``SLM_SLOT_CACHE=false``.
"""

from __future__ import annotations

from pathlib import Path

from slm_server.memory.estimate import EstimateError, attention_shape
from slm_server.memory.gguf_header import GgufError, read_header
from slm_server.registry.model_path import ModelPathError, resolve_model_path
from slm_server.registry.schema import ModelEntry

SLIDING_WINDOW = (
    "sliding-window attention: at the pinned llama.cpp a restored cache is reused only "
    "with swa_full: true"
)


def _sliding_window(entry: ModelEntry) -> bool:
    """Whether the entry's GGUF model has sliding-window layers (False when unreadable:
    a restore that is not reused costs time, never correctness)."""
    try:
        path = Path(resolve_model_path(entry))
        header = read_header(path)
        shape = attention_shape(header.metadata, path)
    except (ModelPathError, GgufError, EstimateError, OSError):
        return False
    return shape.sliding_window > 0 and any(shape.swa_layers)


def why_not(entry: ModelEntry, native: bool, enabled: bool) -> str | None:
    """Why the entry's slots are not kept across an unload (None: they are)."""
    if not enabled:
        return "turned off (SLM_SLOT_CACHE=false)"
    if entry.slot_cache is False:
        return "turned off (slot_cache: false)"
    if entry.backend != "llamacpp":
        return "not a llama.cpp model: its server has no slot save and restore"
    if not native:
        return "llama-cpp-python's server has no slot save and restore"
    if entry.model_type in ("embeddings", "rerank"):
        return f"{entry.model_type} model: no conversation to continue"
    if entry.cache_prompt is False:
        return "cache_prompt: false: the server reuses no prompt"
    if not entry.swa_full and _sliding_window(entry):
        return SLIDING_WINDOW
    return None


__all__ = ["SLIDING_WINDOW", "why_not"]
