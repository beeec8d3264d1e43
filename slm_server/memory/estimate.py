"""What a backend will hold in memory once ready, estimated before it is started.

An estimate is only needed until the first load has been measured (``measure.py``,
``store.py``); it aims to be close and, where it must guess, to guess high.

llama.cpp (GGUF), at the pinned release (llama.cpp 0c1e57098bba)::

    weights  = size of the model file (+ draft model, + mmproj and other extra files)
    kv       = sum over layers with a KV cache of
                 cells(layer) * n_stream * (row(type_k, n_head_kv * key_length)
                                            + row(type_v, n_head_kv * value_length))
             (+ the draft model's kv at the same context)
    overhead = 28 MiB + 192 B * n_vocab + 8 B * n_ubatch * n_ff + 4 B * n_vocab * parallel

The context, from the server's own rules:

- ``n_stream`` is 1 with ``--kv-unified``, else ``--parallel`` (``llama_kv_cache``'s
  constructor, ``src/llama-kv-cache.cpp``); we pass ``--parallel`` explicitly, so the
  server's "auto" (4 slots, unified; ``tools/server/server.cpp``) never applies.
- ``--ctx-size`` N: the total, split among the streams. ``llama_context``'s constructor
  (``src/llama-context.cpp``) pads N to 256, and without a unified cache each stream
  gets ``pad256(N / parallel)`` cells, so the total can grow past N.
- No ``--ctx-size``: the trained context (``<arch>.context_length``); with ``--fit on``
  (the default) ``common_params_fit_impl`` (``common/fit.cpp``) first makes it the
  trained context *per stream*, so ``--parallel 4`` holds four full contexts. Fitting
  may later shrink an unset context to fit free memory: the estimate is the most the
  server would take.
- Layers of a sliding-window architecture (``SWA_PATTERNS``, or an explicit
  ``<arch>.attention.sliding_window_pattern``) hold ``pad256(min(cells, n_swa *
  (parallel if unified else 1) + n_ubatch))`` cells (``llama_kv_cache_iswa``,
  ``src/llama-kv-cache-iswa.cpp``); the others hold all of them.
- ``row(type, n)`` is ggml's row size: bytes per block times ``n`` / block size
  (``CACHE_TYPES``). A layer whose ``head_count_kv`` is 0 has no cache (recurrent
  layers); encoder-only architectures (``NO_KV_ARCHITECTURES``) have none at all
  (``llama_model::create_memory``).

The overhead is fitted to the real server on Linux (CPU build): SmolLM2-135M and
Gemma 3 270M, at contexts from 1536 to 32768 and 1 to 4 slots, held 32 and 71 MiB
beyond file and cache once ready, and 6 to 15 MiB more after a first request; the
vocabulary tables grow with ``n_vocab``, the compute buffer with the micro-batch and
the feed-forward width, the logits buffer with the slots. Over twelve configurations
(contexts, slots, unified and quantized caches) the estimate came 2 to 8 % above the
resident set once ready, and within -1 to +4 % of it after a first request.

It deliberately ignores: GPU offload (the weights and cache are counted once, as
host memory), the prompt cache the server fills with use (``--cache-ram``: sized and
added to the footprint by ``prompt_cache.py``), context checkpoints, the
mmproj's compute buffer, architecture-specific caches (shared-KV layers, MLA,
indexer and recurrent state caches: counted as ordinary caches from the metadata,
which may be off either way), and memory pressure evicting mmap-ed weights.

llama-cpp-python's server (``python -m llama_cpp.server``) runs one sequence and no
fitting: estimate it with ``parallel=1, fit=False``; its Python runtime is not in the
overhead.

MLX (a directory of ``config.json`` and ``*.safetensors``)::

    weights  = sum of the safetensors files' sizes
    kv       = parallel * context * layers * 2 * kv_heads * head_dim * 2 B (f16/bf16)
    overhead = 512 MiB

``context`` is the entry's ``context_length``, else ``min(max_position_embeddings,
DEFAULT_MLX_CONTEXT)``: mlx-lm grows each request's cache with its tokens instead of
allocating it up front, so an unset context is a guess at a long request. Each
concurrent request holds its own cache. The overhead is the Python server with
mlx-lm and transformers imported (470 to 510 MiB measured on Linux, mlx-lm 0.31.3). Ignored:
sliding-window (rotating) caches, quantized caches and prefill activations.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from slm_server.memory.gguf_header import GgufArray, GgufError, GgufValue, read_header

MIB: Final = 1 << 20
CTX_PAD: Final = 256  # llama_context pads the context, and the SWA cache, to this
DEFAULT_UBATCH: Final = 512  # common_params::n_ubatch
LLAMA_MAX_LAYERS: Final = 512  # src/llama-hparams.h
UINT32_MAX: Final = (1 << 32) - 1

# Bytes per block and values per block of each KV cache type (ggml's type traits).
CACHE_TYPES: Final[Mapping[str, tuple[int, int]]] = {
    "f32": (4, 1),
    "f16": (2, 1),
    "bf16": (2, 1),
    "q8_0": (34, 32),
    "q4_0": (18, 32),
    "q4_1": (20, 32),
    "q5_0": (22, 32),
    "q5_1": (24, 32),
    "iq4_nl": (18, 32),
}
DEFAULT_CACHE_TYPE: Final = "f16"

# Architectures whose sliding-window layers follow ``load_swa_pattern(ml, n,
# dense_first)`` when ``<arch>.attention.sliding_window`` is set (src/models/*.cpp).
SWA_PATTERNS: Final[Mapping[str, tuple[int, bool]]] = {
    "gemma2": (2, False),
    "gemma3": (6, False),
    "cohere2": (4, False),
    "olmo2": (4, False),
    "exaone4": (4, False),
    "gpt-oss": (2, False),
    "afmoe": (4, False),
    "plamo3": (8, False),
    "smallthinker": (4, True),
}

# Architectures llama.cpp runs without a KV cache (llama_model::create_memory).
NO_KV_ARCHITECTURES: Final = frozenset(
    {
        "bert",
        "jina-bert-v2",
        "jina-bert-v3",
        "nomic-bert",
        "nomic-bert-moe",
        "neo-bert",
        "eurobert",
        "wavtokenizer-dec",
        "modern-bert",
        "gemma-embedding",
        "dream",
        "llada",
        "llada-moe",
        "rnd1",
    }
)

# The overhead of a llama-server beyond its weights and cache.
LLAMA_BASE_BYTES: Final = 28 * MIB
LLAMA_BYTES_PER_VOCAB: Final = 192
LLAMA_COMPUTE_BYTES_PER_UBATCH_FF: Final = 8
LLAMA_LOGIT_BYTES: Final = 4

MLX_DTYPE_BYTES: Final = 2
MLX_OVERHEAD_MB: Final = 512
DEFAULT_MLX_CONTEXT: Final = 8192


class EstimateError(Exception):
    """The model's files cannot be estimated; the message names the file."""


@dataclass(frozen=True)
class Estimate:
    """A footprint in MiB, by part, with the arithmetic in words (``detail``)."""

    weights_mb: int
    kv_mb: int
    overhead_mb: int
    detail: str

    @property
    def mb(self) -> int:
        return self.weights_mb + self.kv_mb + self.overhead_mb


@dataclass(frozen=True)
class AttentionShape:
    """What sizes a GGUF model's KV cache and overhead, from its metadata."""

    architecture: str
    context_train: int
    kv_heads: tuple[int, ...]  # per layer; 0: the layer has no cache
    key_length: int
    value_length: int
    sliding_window: int  # 0: none
    swa_layers: tuple[bool, ...]  # per layer
    n_vocab: int
    n_ff: int
    has_kv: bool


def _mb(nbytes: int) -> int:
    return math.ceil(nbytes / MIB)


def _pad(value: int, to: int = CTX_PAD) -> int:
    return (value + to - 1) // to * to


def row_bytes(cache_type: str, values: int) -> int:
    """ggml_row_size: the bytes ``values`` elements of ``cache_type`` take."""
    block_bytes, block = CACHE_TYPES[cache_type]
    return block_bytes * values // block


def _file_bytes(path: Path, what: str) -> int:
    try:
        if not path.is_file():
            raise EstimateError(f"{path}: the {what} does not exist or is not a file")
        return path.stat().st_size
    except OSError as exc:
        raise EstimateError(f"{path}: cannot read the {what}: {exc.strerror or exc}") from exc


def _int(value: GgufValue | None) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def _per_layer(value: GgufValue | None, n_layer: int) -> tuple[int, ...] | None:
    """A per-layer count given as a scalar or as an array (padded/cut to ``n_layer``)."""
    scalar = _int(value)
    if scalar is not None:
        return (scalar,) * n_layer if scalar >= 0 else None
    if isinstance(value, tuple) and value and all((_int(v) or 0) >= 0 for v in value):
        layers = tuple(int(v) for v in value)[:n_layer]
        return layers + (layers[-1],) * (n_layer - len(layers))
    return None


def _swa_layers(
    metadata: Mapping[str, GgufValue], arch: str, n_layer: int, n_swa: int
) -> tuple[bool, ...]:
    """Which layers use the sliding window (llama_hparams::set_swa_pattern)."""
    none = (False,) * n_layer
    if n_swa <= 0:
        return none
    explicit = metadata.get(f"{arch}.attention.sliding_window_pattern")
    if isinstance(explicit, tuple) and len(explicit) >= n_layer:
        return tuple(bool(v) for v in explicit[:n_layer])
    default = SWA_PATTERNS.get(arch)
    if default is None:
        return none
    n_pattern, dense_first = default
    explicit_pattern = _int(explicit)
    if explicit_pattern is not None:
        n_pattern = explicit_pattern
    if n_pattern == 0:
        return (True,) * n_layer
    if dense_first:
        return tuple(il % n_pattern != 0 for il in range(n_layer))
    return tuple(il % n_pattern < n_pattern - 1 for il in range(n_layer))


def attention_shape(metadata: Mapping[str, GgufValue], path: Path) -> AttentionShape:
    """The attention shape a GGUF header describes; :class:`EstimateError` when the
    keys llama.cpp needs are missing."""
    arch = metadata.get("general.architecture")
    if not isinstance(arch, str):
        raise EstimateError(f"{path}: no general.architecture in the GGUF metadata")

    def need(name: str, most: int) -> int:
        value = _int(metadata.get(f"{arch}.{name}"))
        if value is None or not 1 <= value <= most:
            raise EstimateError(f"{path}: no usable {arch}.{name} in the GGUF metadata")
        return value

    n_layer = need("block_count", LLAMA_MAX_LAYERS)
    context_train = need("context_length", UINT32_MAX)
    heads = _per_layer(metadata.get(f"{arch}.attention.head_count"), n_layer)
    if heads is None:
        raise EstimateError(f"{path}: no usable {arch}.attention.head_count")
    kv_heads = _per_layer(metadata.get(f"{arch}.attention.head_count_kv"), n_layer) or heads
    n_head = max(heads, default=0)
    embd = _int(metadata.get(f"{arch}.embedding_length"))
    fallback = embd // n_head if embd is not None and n_head > 0 else None
    key_length = _int(metadata.get(f"{arch}.attention.key_length")) or fallback
    value_length = _int(metadata.get(f"{arch}.attention.value_length")) or fallback
    if key_length is None or value_length is None:
        raise EstimateError(
            f"{path}: neither {arch}.attention.key_length nor embedding_length/head_count"
        )
    n_swa = _int(metadata.get(f"{arch}.attention.sliding_window")) or 0
    tokens = metadata.get("tokenizer.ggml.tokens")
    n_vocab = _int(metadata.get(f"{arch}.vocab_size"))
    if n_vocab is None:
        n_vocab = tokens.length if isinstance(tokens, GgufArray) else 0
    ff = _per_layer(metadata.get(f"{arch}.feed_forward_length"), n_layer) or (0,)
    return AttentionShape(
        architecture=arch,
        context_train=context_train,
        kv_heads=kv_heads,
        key_length=key_length,
        value_length=value_length,
        sliding_window=n_swa,
        swa_layers=_swa_layers(metadata, arch, n_layer, n_swa),
        n_vocab=n_vocab,
        n_ff=max(ff, default=0),
        has_kv=arch not in NO_KV_ARCHITECTURES,
    )


@dataclass(frozen=True)
class LlamaContext:
    """The cache llama-server allocates: ``cells`` per stream, ``streams`` of them, for
    ``sequences`` slots."""

    cells: int
    streams: int
    sequences: int

    @property
    def total(self) -> int:
        return self.cells * self.streams


def llama_context(
    context_train: int,
    context_length: int | None,
    parallel: int,
    *,
    kv_unified: bool = False,
    fit: bool = True,
) -> LlamaContext:
    """The context llama-server sizes for ``--ctx-size context_length --parallel
    parallel`` (see the module docstring)."""
    if parallel < 1:
        raise ValueError(f"parallel must be at least 1, not {parallel}")
    streams = 1 if kv_unified else parallel
    # Unset: the trained context, per stream once --fit has resolved it.
    n_ctx = _pad(context_length or (context_train * streams if fit else context_train))
    if kv_unified:
        return LlamaContext(cells=n_ctx, streams=1, sequences=parallel)
    cells = _pad(n_ctx // parallel)
    if cells == 0:
        raise ValueError(f"a context of {n_ctx} cannot be split into {parallel} slots")
    return LlamaContext(cells=cells, streams=parallel, sequences=parallel)


def kv_cache_bytes(
    shape: AttentionShape,
    context: LlamaContext,
    *,
    cache_type_k: str = DEFAULT_CACHE_TYPE,
    cache_type_v: str = DEFAULT_CACHE_TYPE,
    ubatch_size: int = DEFAULT_UBATCH,
    swa_full: bool = False,
) -> int:
    """The bytes of the KV cache ``shape`` takes in ``context`` (``swa_full``: the
    sliding-window layers hold the whole context too, ``--swa-full``)."""
    if not shape.has_kv:
        return 0
    swa_cells = context.cells
    if shape.sliding_window > 0 and not swa_full:
        # A unified stream holds the windows of every sequence.
        windows = context.sequences if context.streams == 1 else 1
        swa_cells = _pad(min(context.cells, shape.sliding_window * windows + ubatch_size))
    total = 0
    for heads, is_swa in zip(shape.kv_heads, shape.swa_layers, strict=True):
        if heads == 0:
            continue
        per_cell = row_bytes(cache_type_k, heads * shape.key_length) + row_bytes(
            cache_type_v, heads * shape.value_length
        )
        total += per_cell * (swa_cells if is_swa else context.cells) * context.streams
    return total


def _cache_type(value: str | None, which: str) -> str:
    cache_type = value or DEFAULT_CACHE_TYPE
    if cache_type not in CACHE_TYPES:
        raise ValueError(f"unknown cache type {cache_type!r} for {which}")
    return cache_type


def _gguf_shape(path: Path, what: str) -> tuple[int, AttentionShape]:
    size = _file_bytes(path, what)
    try:
        header = read_header(path)
    except GgufError as exc:
        raise EstimateError(str(exc)) from exc
    return size, attention_shape(header.metadata, path)


def estimate_gguf(
    model: Path,
    *,
    context_length: int | None,
    parallel: int,
    cache_type_k: str | None = None,
    cache_type_v: str | None = None,
    kv_unified: bool = False,
    fit: bool = True,
    ubatch_size: int | None = None,
    swa_full: bool = False,
    draft_model: Path | None = None,
    extra_files: Sequence[Path] = (),
) -> Estimate:
    """The footprint of ``llama-server --model model`` with these flags (``None``: the
    flag is not passed). ``extra_files`` (an mmproj) count by size alone; a draft model
    counts its file and its own cache at the same context."""
    type_k = _cache_type(cache_type_k, "cache_type_k")
    type_v = _cache_type(cache_type_v, "cache_type_v")
    ubatch = ubatch_size or DEFAULT_UBATCH
    size, shape = _gguf_shape(model, "model file")
    if parallel < 1:
        raise ValueError(f"parallel must be at least 1, not {parallel}")
    try:
        context = llama_context(
            shape.context_train, context_length, parallel, kv_unified=kv_unified, fit=fit
        )
    except ValueError as exc:
        raise EstimateError(f"{model}: {exc}") from None

    def cache(of: AttentionShape) -> int:
        return kv_cache_bytes(
            of,
            context,
            cache_type_k=type_k,
            cache_type_v=type_v,
            ubatch_size=ubatch,
            swa_full=swa_full,
        )

    weights, kv = size, cache(shape)
    parts = [f"model {_mb(size)} MiB"]
    if draft_model is not None:
        draft_size, draft_shape = _gguf_shape(draft_model, "draft model")
        weights += draft_size
        kv += cache(draft_shape)
        parts.append(f"draft {_mb(draft_size)} MiB")
    for extra in extra_files:
        extra_size = _file_bytes(extra, "file")
        weights += extra_size
        parts.append(f"{extra.name} {_mb(extra_size)} MiB")
    overhead = (
        LLAMA_BASE_BYTES
        + LLAMA_BYTES_PER_VOCAB * shape.n_vocab
        + LLAMA_COMPUTE_BYTES_PER_UBATCH_FF * ubatch * shape.n_ff
        + LLAMA_LOGIT_BYTES * shape.n_vocab * parallel
    )
    swa = (
        f", window {shape.sliding_window} on {sum(shape.swa_layers)} layers"
        + (" held whole (swa_full)" if swa_full else "")
        if shape.sliding_window and any(shape.swa_layers)
        else ""
    )
    detail = (
        f"weights {_mb(weights)} MiB ({', '.join(parts)}); "
        f"kv {_mb(kv)} MiB ({shape.architecture}, {context.streams} x {context.cells} "
        f"cells, {len(shape.kv_heads)} layers{swa}, k {type_k}, v {type_v}); "
        f"overhead {_mb(overhead)} MiB (vocab {shape.n_vocab}, ubatch {ubatch})"
    )
    return Estimate(_mb(weights), _mb(kv), _mb(overhead), detail)


def _text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The language model's part of a (possibly multimodal) ``config.json``."""
    nested = config.get("text_config")
    if "num_hidden_layers" not in config and isinstance(nested, Mapping):
        return nested
    return config


def estimate_mlx(model_dir: Path, *, context_length: int | None, parallel: int) -> Estimate:
    """The footprint of an MLX model directory served to ``parallel`` requests at once."""
    if parallel < 1:
        raise ValueError(f"parallel must be at least 1, not {parallel}")
    config_path = model_dir / "config.json"
    try:
        raw = json.loads(config_path.read_text(encoding="utf-8"))
        weights = sum(p.stat().st_size for p in model_dir.glob("*.safetensors") if p.is_file())
        count = sum(1 for p in model_dir.glob("*.safetensors") if p.is_file())
    except OSError as exc:
        raise EstimateError(f"{config_path}: cannot read: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise EstimateError(f"{config_path}: not valid JSON: {exc}") from exc
    if not isinstance(raw, Mapping):
        raise EstimateError(f"{config_path}: not a JSON object")
    if count == 0:
        raise EstimateError(f"{model_dir}: no *.safetensors weight files")
    config = _text_config(raw)

    def number(*names: str) -> int | None:
        for name in names:
            value = config.get(name)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
        return None

    layers = number("num_hidden_layers", "n_layers", "num_layers")
    heads = number("num_attention_heads", "n_heads")
    if layers is None or heads is None:
        raise EstimateError(f"{config_path}: no num_hidden_layers/num_attention_heads")
    kv_heads = number("num_key_value_heads", "n_kv_heads") or heads
    hidden = number("hidden_size", "d_model")
    head_dim = number("head_dim") or (hidden // heads if hidden else None)
    if head_dim is None:
        raise EstimateError(f"{config_path}: neither head_dim nor hidden_size")
    trained = number("max_position_embeddings")
    context = context_length or min(trained or DEFAULT_MLX_CONTEXT, DEFAULT_MLX_CONTEXT)
    kv = parallel * context * layers * 2 * kv_heads * head_dim * MLX_DTYPE_BYTES
    detail = (
        f"weights {_mb(weights)} MiB ({count} safetensors files); "
        f"kv {_mb(kv)} MiB ({parallel} x {context} tokens, {layers} layers, "
        f"{kv_heads} kv heads x {head_dim}); overhead {MLX_OVERHEAD_MB} MiB (python, mlx-lm)"
    )
    return Estimate(_mb(weights), _mb(kv), MLX_OVERHEAD_MB, detail)
