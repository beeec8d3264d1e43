"""Command lines for llama-server, llama_cpp.server and the MLX servers."""

from __future__ import annotations

import json
from typing import Any, get_args

import pytest

from slm_server.launch.llama_argv import (
    GGML_TYPE_IDS,
    ModelFiles,
    kv_cache_types,
    native_argv,
    python_argv,
    python_request_defaults,
)
from slm_server.launch.mlx_argv import mlx_argv, mlx_rerank_argv
from slm_server.registry.schema import CacheType, ModelEntry
from tests.registry_entries import model_entry

MODEL = "/models/m1.gguf"
FILES = ModelFiles(model=MODEL)
PY = "/venv/bin/python"


def entry(**fields: Any) -> ModelEntry:
    return model_entry(model_path=MODEL, **fields)


def mlx_entry(**fields: Any) -> ModelEntry:
    return entry(backend="mlx", port=8511, quantization="8bit", **fields)


def has_run(argv: list[str], run: list[str]) -> bool:
    """Whether ``run`` appears in ``argv`` as consecutive items."""
    return any(argv[i : i + len(run)] == run for i in range(len(argv) - len(run) + 1))


NATIVE_BASE = [
    "llama-server",
    "--model",
    MODEL,
    "--host",
    "127.0.0.1",
    "--port",
    "8501",
    "--alias",
    "m1",
    "--parallel",
    "1",
    "--metrics",
    "--batch-size",
    "512",
]


# --- native_argv ------------------------------------------------------------------------


def test_native_minimal_entry_is_exactly_the_base() -> None:
    assert native_argv("llama-server", entry(), FILES) == NATIVE_BASE


NATIVE_CASES = [
    pytest.param({"temp": 0.7}, FILES, ["--temp", "0.7"], id="temp"),
    pytest.param({"temp": 0.0}, FILES, ["--temp", "0"], id="temp-zero"),
    pytest.param({"top_p": 0.9}, FILES, ["--top-p", "0.9"], id="top_p"),
    pytest.param({"top_k": 40}, FILES, ["--top-k", "40"], id="top_k"),
    pytest.param({"min_p": 0.05}, FILES, ["--min-p", "0.05"], id="min_p"),
    pytest.param(
        {"presence_penalty": -0.5}, FILES, ["--presence-penalty", "-0.5"], id="presence_penalty"
    ),
    pytest.param(
        {"repetition_penalty": 1.1}, FILES, ["--repeat-penalty", "1.1"], id="repetition_penalty"
    ),
    pytest.param({"n_predict": 256}, FILES, ["--n-predict", "256"], id="n_predict"),
    pytest.param({"n_predict": -1}, FILES, ["--n-predict", "-1"], id="n_predict-unlimited"),
    pytest.param({"ubatch_size": 512}, FILES, ["--ubatch-size", "512"], id="ubatch_size"),
    pytest.param({"cache_type_k": "q4_0"}, FILES, ["--cache-type-k", "q4_0"], id="cache_type_k"),
    pytest.param({"cache_type_v": "f16"}, FILES, ["--cache-type-v", "f16"], id="cache_type_v"),
    pytest.param({"cache_ram": 4096}, FILES, ["--cache-ram", "4096"], id="cache_ram"),
    pytest.param({"cache_ram": 0}, FILES, ["--cache-ram", "0"], id="cache_ram-off"),
    pytest.param({"cache_ram": -1}, FILES, ["--cache-ram", "-1"], id="cache_ram-unlimited"),
    pytest.param({"kv_offload": True}, FILES, ["--kv-offload"], id="kv_offload-true"),
    pytest.param({"kv_offload": False}, FILES, ["--no-kv-offload"], id="kv_offload-false"),
    pytest.param({"flash_attn": True}, FILES, ["--flash-attn", "on"], id="flash_attn-true"),
    pytest.param({"flash_attn": False}, FILES, ["--flash-attn", "off"], id="flash_attn-false"),
    pytest.param({"flash_attn": "auto"}, FILES, ["--flash-attn", "auto"], id="flash_attn-auto"),
    pytest.param({"kv_unified": True}, FILES, ["--kv-unified"], id="kv_unified-true"),
    pytest.param({"kv_unified": False}, FILES, ["--no-kv-unified"], id="kv_unified-false"),
    pytest.param({"swa_full": True}, FILES, ["--swa-full"], id="swa_full"),
    pytest.param({"swa_full": False}, FILES, [], id="swa_full-false"),
    pytest.param({"fit": True}, FILES, ["--fit", "on"], id="fit-on"),
    pytest.param({"fit": False}, FILES, ["--fit", "off"], id="fit-off"),
    pytest.param({"cont_batching": True}, FILES, ["--cont-batching"], id="cont_batching-true"),
    pytest.param({"cont_batching": False}, FILES, ["--no-cont-batching"], id="cont_batching-false"),
    pytest.param({"cache_prompt": True}, FILES, ["--cache-prompt"], id="cache_prompt-true"),
    pytest.param({"cache_prompt": False}, FILES, ["--no-cache-prompt"], id="cache_prompt-false"),
    pytest.param({"spec_type": "ngram-map-k"}, FILES, ["--spec-type", "ngram-map-k"], id="spec"),
    pytest.param(
        {"spec_draft_n_max": 16}, FILES, ["--spec-draft-n-max", "16"], id="spec_draft_n_max"
    ),
    pytest.param(
        {"spec_model_path": "draft.gguf"},
        ModelFiles(model=MODEL, draft_model="/models/draft.gguf"),
        ["--spec-draft-model", "/models/draft.gguf"],
        id="spec_model_path",
    ),
    pytest.param({"verbose": True}, FILES, ["--verbose"], id="verbose"),
    pytest.param(
        {"mmproj_path": "mmproj.gguf"},
        ModelFiles(model=MODEL, mmproj="/models/mmproj.gguf"),
        ["--mmproj", "/models/mmproj.gguf"],
        id="mmproj",
    ),
    pytest.param(
        {"chat_template_file": "t.jinja"},
        ModelFiles(model=MODEL, chat_template_file="/cfg/t.jinja"),
        ["--jinja", "--chat-template-file", "/cfg/t.jinja"],
        id="chat_template_file",
    ),
    pytest.param(
        {"chat_template_kwargs": {"enable_thinking": False}},
        FILES,
        ["--jinja", "--chat-template-kwargs", '{"enable_thinking": false}'],
        id="chat_template_kwargs",
    ),
    pytest.param({"context_length": 4096}, FILES, ["--ctx-size", "4096"], id="context_length"),
    pytest.param({"max_concurrency": 4}, FILES, ["--parallel", "4"], id="max_concurrency"),
    pytest.param({"model_type": "embeddings"}, FILES, ["--embedding"], id="embeddings"),
    pytest.param(
        {"model_type": "rerank"},
        FILES,
        ["--embedding", "--pooling", "rank", "--reranking"],
        id="rerank",
    ),
    pytest.param({"pooling": "cls"}, FILES, ["--pooling", "cls"], id="pooling"),
    pytest.param({"host": "0.0.0.0"}, FILES, ["--host", "0.0.0.0"], id="host"),
    pytest.param({"port": 9123}, FILES, ["--port", "9123"], id="port"),
    pytest.param({"id": "org/model:tag"}, FILES, ["--alias", "org/model:tag"], id="alias"),
]


@pytest.mark.parametrize(("fields", "files", "expected"), NATIVE_CASES)
def test_native_field_maps_to_its_flag(
    fields: dict[str, Any], files: ModelFiles, expected: list[str]
) -> None:
    argv = native_argv("llama-server", entry(**fields), files)
    assert has_run(argv, expected), argv
    assert argv[:3] == ["llama-server", "--model", MODEL]


OPTIONAL_FLAGS = [
    "--ctx-size",
    "--embedding",
    "--pooling",
    "--reranking",
    "--jinja",
    "--chat-template-file",
    "--chat-template-kwargs",
    "--temp",
    "--top-p",
    "--top-k",
    "--min-p",
    "--presence-penalty",
    "--repeat-penalty",
    "--n-predict",
    "--ubatch-size",
    "--cache-ram",
    "--spec-draft-n-max",
    "--cache-type-k",
    "--cache-type-v",
    "--kv-offload",
    "--no-kv-offload",
    "--flash-attn",
    "--kv-unified",
    "--no-kv-unified",
    "--fit",
    "--cont-batching",
    "--no-cont-batching",
    "--cache-prompt",
    "--no-cache-prompt",
    "--spec-type",
    "--spec-draft-model",
    "--mmproj",
    "--verbose",
]


@pytest.mark.parametrize("flag", OPTIONAL_FLAGS)
def test_native_optional_flag_absent_when_unset(flag: str) -> None:
    assert flag not in native_argv("llama-server", entry(), FILES)


def test_native_verbose_false_adds_nothing() -> None:
    assert native_argv("llama-server", entry(verbose=False), FILES) == NATIVE_BASE


def test_native_jinja_once_with_template_and_kwargs() -> None:
    files = ModelFiles(model=MODEL, chat_template_file="/cfg/t.jinja")
    argv = native_argv(
        "llama-server", entry(chat_template_file="t.jinja", chat_template_kwargs={"a": 1}), files
    )
    assert argv.count("--jinja") == 1
    assert has_run(argv, ["--chat-template-file", "/cfg/t.jinja"])
    assert json.loads(argv[argv.index("--chat-template-kwargs") + 1]) == {"a": 1}


@pytest.mark.parametrize(
    ("fields", "batch"),
    [({}, "512"), ({"ubatch_size": 256}, "512"), ({"ubatch_size": 1024}, "1024")],
    ids=["default", "small ubatch", "large ubatch"],
)
def test_a_language_model_reads_in_batches_that_report_progress_often(
    fields: dict[str, Any], batch: str
) -> None:
    """A progress report per 512 tokens (llama-server's 2048 by default), never a
    logical batch below the physical one."""
    argv = native_argv("llama-server", entry(**fields), FILES)
    assert has_run(argv, ["--batch-size", batch])


@pytest.mark.parametrize("model_type", ["embeddings", "rerank", "multimodal"])
def test_other_models_keep_llama_servers_batch(model_type: str) -> None:
    files = (
        ModelFiles(model=MODEL, mmproj="/models/p.gguf") if model_type == "multimodal" else FILES
    )
    argv = native_argv("llama-server", entry(model_type=model_type), files)
    assert "--batch-size" not in argv


def test_native_embeddings_with_pooling() -> None:
    argv = native_argv("llama-server", entry(model_type="embeddings", pooling="mean"), FILES)
    assert argv.count("--embedding") == 1
    assert has_run(argv, ["--pooling", "mean"])
    assert "--reranking" not in argv


def test_native_rerank_ignores_pooling_field() -> None:
    argv = native_argv("llama-server", entry(model_type="rerank", pooling="mean"), FILES)
    assert argv.count("--pooling") == 1
    assert has_run(argv, ["--pooling", "rank"])


def test_native_files_resolved_paths_win_over_raw_fields() -> None:
    files = ModelFiles(model="/abs/model.gguf", mmproj="/abs/mm.gguf", draft_model="/abs/d.gguf")
    argv = native_argv(
        "/bin/llama-server",
        entry(mmproj_path="rel/mm.gguf", spec_model_path="rel/d.gguf"),
        files,
    )
    assert argv[0] == "/bin/llama-server"
    assert has_run(argv, ["--model", "/abs/model.gguf"])
    assert has_run(argv, ["--mmproj", "/abs/mm.gguf"])
    assert has_run(argv, ["--spec-draft-model", "/abs/d.gguf"])
    assert "rel/mm.gguf" not in argv


def test_native_all_fields_together_are_all_strings() -> None:
    fields: dict[str, Any] = {
        "temp": 0.6,
        "top_p": 0.95,
        "top_k": 20,
        "min_p": 0.0,
        "presence_penalty": 1.5,
        "repetition_penalty": 1.05,
        "n_predict": 1024,
        "ubatch_size": 256,
        "cache_ram": 2048,
        "spec_draft_n_max": 8,
        "context_length": 8192,
        "max_concurrency": 3,
        "kv_offload": False,
        "flash_attn": True,
        "fit": False,
    }
    argv = native_argv("llama-server", entry(**fields), FILES)
    assert all(isinstance(a, str) for a in argv)
    for flag, value in [
        ("--temp", "0.6"),
        ("--top-p", "0.95"),
        ("--top-k", "20"),
        ("--min-p", "0"),
        ("--presence-penalty", "1.5"),
        ("--repeat-penalty", "1.05"),
        ("--n-predict", "1024"),
        ("--ubatch-size", "256"),
        ("--cache-ram", "2048"),
        ("--spec-draft-n-max", "8"),
        ("--ctx-size", "8192"),
        ("--parallel", "3"),
        ("--flash-attn", "on"),
        ("--fit", "off"),
    ]:
        assert has_run(argv, [flag, value]), flag
    assert "--no-kv-offload" in argv


def test_native_large_integers_are_not_in_scientific_notation() -> None:
    argv = native_argv("llama-server", entry(cache_ram=1_000_000, n_predict=2_000_000), FILES)
    assert has_run(argv, ["--cache-ram", "1000000"])
    assert has_run(argv, ["--n-predict", "2000000"])


# --- kv_cache_types ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("quantization", "expected"),
    [
        ("Q8_0", "q8_0"),
        ("q8_0", "q8_0"),
        ("Q8-0", "q8_0"),
        ("Q8_K_XL", "q8_0"),
        ("8bit", "q8_0"),
        ("8BIT", "q8_0"),
        ("Q4_1", None),
        ("Q4_K_M", None),
        ("4bit", None),
        ("F16", None),
        ("mxfp8", None),
    ],
)
def test_kv_cache_types_from_quantization(quantization: str, expected: str | None) -> None:
    assert kv_cache_types(entry(quantization=quantization)) == (expected, expected)


def test_kv_cache_explicit_fields_win() -> None:
    assert kv_cache_types(entry(quantization="Q8_0", cache_type_k="f16")) == ("f16", "q8_0")
    assert kv_cache_types(entry(quantization="Q8_0", cache_type_v="q4_0")) == ("q8_0", "q4_0")
    assert kv_cache_types(entry(quantization="Q4_1", cache_type_v="q4_0")) == (None, "q4_0")


def test_native_q8_model_gets_q8_cache() -> None:
    argv = native_argv("llama-server", entry(quantization="Q8_0"), FILES)
    assert has_run(argv, ["--cache-type-k", "q8_0", "--cache-type-v", "q8_0"])


# --- python_argv ------------------------------------------------------------------------

PYTHON_BASE = [
    PY,
    "-m",
    "llama_cpp.server",
    "--model",
    MODEL,
    "--host",
    "127.0.0.1",
    "--port",
    "8501",
    "--model_alias",
    "m1",
    # A request that comes while a stream runs waits, instead of cutting that stream
    # short as if it had ended (llama-cpp-python's default).
    "--interrupt_requests",
    "false",
    "--n_ctx",
    "0",
]


def test_python_minimal_entry_is_exactly_the_base() -> None:
    assert python_argv(PY, entry(), FILES) == PYTHON_BASE


PYTHON_CASES = [
    pytest.param({"context_length": 2048}, ["--n_ctx", "2048"], id="context_length"),
    pytest.param({"model_type": "embeddings"}, ["--embedding", "true"], id="embeddings"),
    pytest.param(
        {"chat_template_kwargs": {"enable_thinking": True}},
        ["--chat_template_kwargs", '{"enable_thinking": true}'],
        id="chat_template_kwargs",
    ),
    pytest.param({"ubatch_size": 128}, ["--n_ubatch", "128"], id="ubatch_size"),
    pytest.param({"quantization": "Q8_0"}, ["--type_k", "8", "--type_v", "8"], id="q8-cache"),
    pytest.param({"cache_type_k": "f16"}, ["--type_k", "1"], id="cache_type_k"),
    pytest.param({"cache_type_v": "bf16"}, ["--type_v", "30"], id="cache_type_v"),
    pytest.param({"flash_attn": True}, ["--flash_attn", "true"], id="flash_attn-true"),
    pytest.param({"flash_attn": False}, ["--flash_attn", "false"], id="flash_attn-false"),
    pytest.param({"verbose": True}, ["--verbose", "true"], id="verbose-true"),
    pytest.param({"verbose": False}, ["--verbose", "false"], id="verbose-false"),
    pytest.param({"host": "0.0.0.0", "port": 9000}, ["--host", "0.0.0.0", "--port", "9000"]),
]


@pytest.mark.parametrize(("fields", "expected"), PYTHON_CASES)
def test_python_field_maps_to_its_flag(fields: dict[str, Any], expected: list[str]) -> None:
    argv = python_argv(PY, entry(**fields), FILES)
    assert has_run(argv, expected), argv
    assert argv[:5] == [PY, "-m", "llama_cpp.server", "--model", MODEL]


def test_python_flash_attn_auto_is_left_to_the_server() -> None:
    assert "--flash_attn" not in python_argv(PY, entry(flash_attn="auto"), FILES)


def test_python_sampling_fields_are_not_flags() -> None:
    fields: dict[str, Any] = {
        "temp": 0.7,
        "top_p": 0.9,
        "top_k": 40,
        "min_p": 0.1,
        "presence_penalty": 0.2,
        "repetition_penalty": 1.1,
        "n_predict": 100,
        "max_concurrency": 4,
    }
    argv = python_argv(PY, entry(**fields), FILES)
    assert argv == PYTHON_BASE


@pytest.mark.parametrize("cache_type", get_args(CacheType))
def test_every_cache_type_has_a_ggml_id(cache_type: str) -> None:
    argv = python_argv(PY, entry(cache_type_k=cache_type, cache_type_v=cache_type), FILES)
    ggml = str(GGML_TYPE_IDS[cache_type])
    assert has_run(argv, ["--type_k", ggml, "--type_v", ggml])


def test_ggml_type_ids_match_ggml() -> None:
    assert GGML_TYPE_IDS == {
        "f32": 0,
        "f16": 1,
        "q4_0": 2,
        "q4_1": 3,
        "q5_0": 6,
        "q5_1": 7,
        "q8_0": 8,
        "iq4_nl": 20,
        "bf16": 30,
    }


# --- python_request_defaults --------------------------------------------------------------


def test_request_defaults_empty_without_sampling_fields() -> None:
    assert python_request_defaults(entry()) == {}


def test_request_defaults_map_every_sampling_field() -> None:
    fields: dict[str, Any] = {
        "temp": 0.7,
        "top_p": 0.9,
        "top_k": 40,
        "min_p": 0.05,
        "presence_penalty": -0.5,
        "repetition_penalty": 1.1,
        "n_predict": 256,
    }
    assert python_request_defaults(entry(**fields)) == {
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 40,
        "min_p": 0.05,
        "presence_penalty": -0.5,
        "repeat_penalty": 1.1,
        "max_tokens": 256,
    }


def test_request_defaults_keep_zero_values() -> None:
    assert python_request_defaults(entry(temp=0.0, top_k=0, min_p=0.0)) == {
        "temperature": 0.0,
        "top_k": 0,
        "min_p": 0.0,
    }


@pytest.mark.parametrize("n_predict", [-1, 0])
def test_request_defaults_no_max_tokens_for_unlimited(n_predict: int) -> None:
    assert python_request_defaults(entry(n_predict=n_predict)) == {}


# --- MLX --------------------------------------------------------------------------------

MLX_BASE = [
    "mlx-openai-server",
    "launch",
    "--model-path",
    "/models/qwen",
    "--model-type",
    "lm",
    "--host",
    "127.0.0.1",
    "--port",
    "8511",
]


def test_mlx_minimal_entry_is_exactly_the_base() -> None:
    assert mlx_argv("mlx-openai-server", mlx_entry(), "/models/qwen") == MLX_BASE


MLX_CASES = [
    pytest.param({"context_length": 32768}, ["--context-length", "32768"], id="context_length"),
    pytest.param(
        {"enable_auto_tool_choice": True}, ["--enable-auto-tool-choice"], id="auto_tool_choice"
    ),
    pytest.param({"tool_call_parser": "qwen3"}, ["--tool-call-parser", "qwen3"], id="tool_parser"),
    pytest.param(
        {"reasoning_parser": "qwen3"}, ["--reasoning-parser", "qwen3"], id="reasoning_parser"
    ),
    pytest.param(
        {"model_type": "image-generation"},
        ["--model-type", "image-generation", "--host"],
        id="model_type",
    ),
    pytest.param(
        {"model_type": "image-generation"}, ["--config-name", "flux-schnell"], id="img-gen-default"
    ),
    pytest.param(
        {"model_type": "image-edit"}, ["--config-name", "flux-kontext-dev"], id="img-edit-default"
    ),
    pytest.param(
        {"model_type": "image-generation", "config_name": "flux-dev"},
        ["--config-name", "flux-dev"],
        id="config_name",
    ),
    pytest.param({"model_type": "whisper"}, ["--model-type", "whisper"], id="whisper"),
    pytest.param({"model_type": "embeddings"}, ["--model-type", "embeddings"], id="embeddings"),
    pytest.param({"host": "0.0.0.0"}, ["--host", "0.0.0.0", "--port", "8511"], id="host"),
]


@pytest.mark.parametrize(("fields", "expected"), MLX_CASES)
def test_mlx_field_maps_to_its_flag(fields: dict[str, Any], expected: list[str]) -> None:
    argv = mlx_argv("mlx-openai-server", mlx_entry(**fields), "/models/qwen")
    assert has_run(argv, expected), argv
    assert argv[:4] == ["mlx-openai-server", "launch", "--model-path", "/models/qwen"]


@pytest.mark.parametrize("model_type", ["lm", "multimodal", "embeddings", "whisper"])
def test_mlx_no_config_name_for_non_image_types(model_type: str) -> None:
    argv = mlx_argv("mlx-openai-server", mlx_entry(model_type=model_type), "/m")
    assert "--config-name" not in argv


def test_mlx_optional_flags_absent_by_default() -> None:
    argv = mlx_argv("mlx-openai-server", mlx_entry(enable_auto_tool_choice=False), "/m")
    for flag in ("--context-length", "--enable-auto-tool-choice", "--tool-call-parser"):
        assert flag not in argv
    assert "--reasoning-parser" not in argv


def test_mlx_hub_id_passed_through() -> None:
    argv = mlx_argv("mlx", mlx_entry(), "mlx-community/Qwen3-8B-MLX-8bit")
    assert has_run(argv, ["--model-path", "mlx-community/Qwen3-8B-MLX-8bit"])


def test_mlx_rerank_argv_exact() -> None:
    spec = entry(backend="mlx-rerank", model_type="rerank", port=8522, id="qwen3-reranker")
    assert mlx_rerank_argv(PY, spec, "/models/rr") == [
        PY,
        "-m",
        "slm_server",
        "mlx-rerank",
        "--model-path",
        "/models/rr",
        "--host",
        "127.0.0.1",
        "--port",
        "8522",
        "--model-id",
        "qwen3-reranker",
    ]


def test_mlx_rerank_context_length_is_its_max_length() -> None:
    spec = entry(backend="mlx-rerank", model_type="rerank", port=8522, context_length=4096)
    argv = mlx_rerank_argv(PY, spec, "/models/rr")
    assert argv[-2:] == ["--max-length", "4096"]
