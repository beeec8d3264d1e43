"""The prompt cache's size (:mod:`slm_server.memory.prompt_cache`) and where it is given:
the launch plan's ``--cache-ram``, and the footprint a backend is admitted by."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from slm_server.launch.footprint import prompt_cache_mb
from slm_server.launch.plan import Toolchain, plan_launch
from slm_server.launch.runtime import LlamaRuntime
from slm_server.memory import measure
from slm_server.memory.estimate import estimate_gguf
from slm_server.memory.prompt_cache import SERVER_DEFAULT_MB, default_size_mb, size_mb
from slm_server.registry.schema import ModelEntry, ModelSpec
from slm_server.supervise.shell.backend import admitted_mb
from tests.registry_entries import model_entry
from tests.unit.memory.gguf_files import llama_like, write_gguf

NATIVE = Toolchain(LlamaRuntime("native", "/opt/llama-server", "test"), None, "/opt/mlx")
PYTHON = Toolchain(LlamaRuntime("python", sys.executable, "test"), None, None)


@pytest.mark.parametrize(
    ("kv_mb", "budget_mb", "size"),
    [
        (90, 18000, 180),  # two copies of every slot's whole context
        (90, 800, 100),  # but at most an eighth of the budget
        (10_000, 200_000, SERVER_DEFAULT_MB),  # and never above the server's default
        (None, 8000, 1000),  # no estimate: the budget's share
        (None, 200_000, SERVER_DEFAULT_MB),
        (0, 8000, 0),  # no KV cache (an encoder): nothing to keep
        (90, 7, 0),
    ],
)
def test_the_default_size(kv_mb: int | None, budget_mb: int, size: int) -> None:
    assert default_size_mb(kv_mb, budget_mb) == size


def test_the_registry_s_cache_ram_wins_and_minus_one_is_unbounded() -> None:
    assert size_mb(4096, 90, 18000) == 4096
    assert size_mb(0, 90, 18000) == 0
    assert size_mb(-1, 90, 18000) is None
    assert size_mb(None, 90, 18000) == 180
    with pytest.raises(ValueError, match="budget"):
        default_size_mb(90, 0)
    with pytest.raises(ValueError, match="cache_ram"):
        size_mb(-2, 90, 18000)


def entry(model: Path, context_length: int = 2048, **fields: Any) -> ModelEntry:
    return model_entry(model_path=str(model), context_length=context_length, **fields)


@pytest.fixture
def gguf_model(tmp_path: Path) -> Path:
    return write_gguf(tmp_path / "m.gguf", "llama", llama_like(layers=8, embd=512, heads=8))


def test_a_gguf_model_s_cache_is_twice_its_kv_cache(gguf_model: Path) -> None:
    kv = estimate_gguf(gguf_model, context_length=2048, parallel=2).kv_mb
    assert kv > 0
    cache = prompt_cache_mb(entry(gguf_model, max_concurrency=2), True, 18000)
    assert cache == 2 * kv


@pytest.mark.parametrize(
    ("fields", "native", "cache"),
    [
        ({}, True, 1000),  # the empty file cannot be estimated: the budget's share
        ({"cache_ram": 300}, True, 300),
        ({"cache_ram": -1}, True, None),
        ({"model_type": "embeddings"}, True, 0),  # the server caches completions only
        ({"model_type": "rerank"}, True, 0),
        ({}, False, 0),  # llama-cpp-python's server keeps none unless asked
    ],
)
def test_which_servers_keep_a_prompt_cache(
    tmp_path: Path, fields: dict[str, Any], native: bool, cache: int | None
) -> None:
    model = tmp_path / "empty.gguf"
    model.write_bytes(b"")
    assert prompt_cache_mb(entry(model, **fields), native, 8000) == cache


def plan_argv(model: Path, tools: Toolchain, **fields: Any) -> tuple[tuple[str, ...], Any]:
    spec = ModelSpec(role="chat", index=0, entry=entry(model, **fields))
    plan = plan_launch(spec, tools, model.parent / "logs", "models.yaml", budget_mb=8000)
    return plan.argv, plan.prompt_cache_mb


def flag(argv: tuple[str, ...], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def test_the_plan_passes_the_size_it_counts(gguf_model: Path) -> None:
    argv, cache = plan_argv(gguf_model, NATIVE)
    assert cache is not None and cache > 0
    assert flag(argv, "--cache-ram") == str(cache)
    argv, cache = plan_argv(gguf_model, NATIVE, cache_ram=64)
    assert (flag(argv, "--cache-ram"), cache) == ("64", 64)
    argv, cache = plan_argv(gguf_model, NATIVE, cache_ram=-1)
    assert (flag(argv, "--cache-ram"), cache) == ("-1", None)
    argv, cache = plan_argv(gguf_model, NATIVE, model_type="embeddings")
    assert (flag(argv, "--cache-ram"), cache) == ("0", 0)
    argv, cache = plan_argv(gguf_model, PYTHON)
    assert ("--cache-ram" in argv, cache) == (False, 0)


def test_the_admitted_footprint_adds_the_prompt_cache(tmp_path: Path) -> None:
    plain = entry(tmp_path / "m.gguf")
    assert (
        admitted_mb(plain, 200, 230, 1000) == (200 if measure.RSS_COUNTS_GPU_MEMORY else 230) + 1000
    )
    assert admitted_mb(plain, None, 230, 1000) == 1230
    assert admitted_mb(plain, None, None, 1000) is None  # nothing known but the cache
    assert admitted_mb(plain, 200, None, None) == 200  # unbounded: not in the budget
    fixed = entry(tmp_path / "m.gguf", memory_mb=900)
    assert admitted_mb(fixed, 200, 230, 1000) == 900  # memory_mb is the whole footprint
