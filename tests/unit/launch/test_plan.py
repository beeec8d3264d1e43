"""Launch plans: argv choice, log paths, and the problems that stop an entry."""

from __future__ import annotations

import importlib.util
import sys
from importlib.machinery import ModuleSpec
from pathlib import Path
from typing import Any

import pytest

from slm_server.launch.plan import LaunchPlan, PlanError, Toolchain, plan_launch, plan_registry
from slm_server.launch.runtime import LlamaRuntime
from slm_server.registry.schema import NATIVE_ONLY_FIELDS, ModelSpec, RegistryFile
from tests.registry_entries import model_spec

NATIVE = LlamaRuntime("native", "/opt/llama/llama-server", "test")
PYTHON = LlamaRuntime("python", sys.executable, "test")
MLX_SERVER = "/opt/mlx/mlx-openai-server"
SOURCE = "/cfg/models.yaml"
BUDGET_MB = 8000
FALLBACK_MESSAGE = (
    "needs the native llama-server, but only the Python fallback "
    "(llama_cpp.server) is available; run scripts/build_llama.sh"
)


def tools(
    llama: LlamaRuntime | None = NATIVE,
    mlx_server: str | None = MLX_SERVER,
    llama_error: str | None = None,
) -> Toolchain:
    return Toolchain(llama=llama, llama_error=llama_error, mlx_server=mlx_server)


def spec(
    role: str = "chat", index: int = 0, model_path: str = "/nonexistent/model.gguf", **fields: Any
) -> ModelSpec:
    return model_spec(role, index=index, model_path=model_path, **fields)


@pytest.fixture
def model(tmp_path: Path) -> Path:
    path = tmp_path / "models" / "m1.gguf"
    path.parent.mkdir()
    path.write_bytes(b"")
    return path


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    return tmp_path / "logs"


def plan(s: ModelSpec, toolchain: Toolchain, log_dir: Path) -> LaunchPlan:
    return plan_launch(s, toolchain, log_dir, SOURCE, budget_mb=BUDGET_MB)


def plan_problems(s: ModelSpec, toolchain: Toolchain, log_dir: Path) -> list[str]:
    with pytest.raises(PlanError) as caught:
        plan_launch(s, toolchain, log_dir, SOURCE, budget_mb=BUDGET_MB)
    lines = [str(p) for p in caught.value.problems]
    assert str(caught.value) == "\n".join(lines)
    return lines


# --- plans ------------------------------------------------------------------------------


def test_native_plan(model: Path, log_dir: Path) -> None:
    s = spec(role="standard", model_path=str(model), context_length=2048)
    p = plan(s, tools(), log_dir)
    assert p.role == "standard"
    assert p.model_id == "m1"
    assert p.backend == "llamacpp"
    assert p.model_type == "lm"
    assert p.host == "127.0.0.1"
    assert p.port == 8501
    assert p.log_path == log_dir / "llama-m1-8501.log"
    assert p.health_url == "http://127.0.0.1:8501/health"
    assert isinstance(p.argv, tuple)
    assert p.argv[:3] == (NATIVE.program, "--model", str(model))
    assert "--alias" in p.argv
    assert "--ctx-size" in p.argv


def test_python_fallback_plan(model: Path, log_dir: Path) -> None:
    p = plan(spec(model_path=str(model), temp=0.5, flash_attn=True), tools(llama=PYTHON), log_dir)
    assert p.argv[:5] == (sys.executable, "-m", "llama_cpp.server", "--model", str(model))
    assert "--model_alias" in p.argv
    assert "--temp" not in p.argv
    assert "--alias" not in p.argv
    # What it cannot take as a flag the router fills into requests: published for it.
    assert (p.kind, p.request_defaults) == ("llama_cpp.server", {"temperature": 0.5})


def test_a_native_plan_publishes_no_request_defaults(model: Path, log_dir: Path) -> None:
    p = plan(spec(model_path=str(model), temp=0.5), tools(), log_dir)
    assert (p.kind, p.health_path, p.request_defaults) == ("llama-server", "/health", {})


def test_directory_model_path_resolved_in_argv(model: Path, log_dir: Path) -> None:
    p = plan(spec(model_path=str(model.parent)), tools(), log_dir)
    assert p.argv[2] == str(model)


@pytest.mark.parametrize(
    ("backend", "model_type", "expected"),
    [
        ("llamacpp", "lm", "llama-m1-8501.log"),
        ("mlx", "lm", "mlx-m1-8501.log"),
        ("mlx-rerank", "rerank", "mlx-rerank-m1-8501.log"),
    ],
)
def test_log_path_naming(
    model: Path, log_dir: Path, backend: str, model_type: str, expected: str
) -> None:
    s = spec(backend=backend, model_type=model_type, model_path=str(model))
    assert plan(s, tools(), log_dir).log_path == log_dir / expected


@pytest.mark.parametrize(
    ("model_id", "expected"),
    [
        ("qwen/qwen3-4b", "llama-qwen_qwen3-4b-8501.log"),
        ("a b:c", "llama-a_b_c-8501.log"),
        ("../../etc/passwd", "llama-.._.._etc_passwd-8501.log"),
        ("Model_v1.2-x", "llama-Model_v1.2-x-8501.log"),
        ("ü~*", "llama-_-8501.log"),
    ],
)
def test_log_path_replaces_unsafe_id_characters(
    model: Path, log_dir: Path, model_id: str, expected: str
) -> None:
    p = plan(spec(id=model_id, model_path=str(model)), tools(), log_dir)
    assert p.log_path == log_dir / expected
    assert p.log_path.parent == log_dir


@pytest.mark.parametrize(
    ("host", "url"),
    [
        ("0.0.0.0", "http://127.0.0.1:8501/health"),
        ("::", "http://127.0.0.1:8501/health"),
        ("127.0.0.1", "http://127.0.0.1:8501/health"),
        ("localhost", "http://localhost:8501/health"),
        ("192.168.1.20", "http://192.168.1.20:8501/health"),
    ],
)
def test_health_url(model: Path, log_dir: Path, host: str, url: str) -> None:
    p = plan(spec(host=host, model_path=str(model)), tools(), log_dir)
    assert p.host == host
    assert p.health_url == url
    assert ("--host", host) == p.argv[p.argv.index("--host") : p.argv.index("--host") + 2]


def test_health_url_brackets_ipv6(model: Path, log_dir: Path) -> None:
    p = plan(spec(host="::1", model_path=str(model)), tools(), log_dir)
    assert p.health_url == "http://[::1]:8501/health"


# --- python fallback limits ---------------------------------------------------------------

NATIVE_ONLY_VALUES: dict[str, Any] = {
    "chat_template_file": "TEMPLATE",
    "cache_ram": 4096,
    "kv_offload": False,
    "kv_unified": True,
    "swa_full": True,
    "fit": False,
    "cont_batching": True,
    "cache_prompt": False,
    "spec_type": "ngram-simple",
    "spec_draft_n_max": 8,
    "spec_model_path": "DRAFT",
    "mmproj_path": "MMPROJ",
    "pooling": "mean",
}


def test_native_only_values_cover_every_native_only_field() -> None:
    assert set(NATIVE_ONLY_VALUES) == NATIVE_ONLY_FIELDS


@pytest.fixture
def native_only_fields(tmp_path: Path) -> dict[str, Any]:
    """Every native-only field with a valid value; path fields name existing files."""
    values = dict(NATIVE_ONLY_VALUES)
    for field, name in (
        ("chat_template_file", "t.jinja"),
        ("spec_model_path", "draft.gguf"),
        ("mmproj_path", "mmproj.gguf"),
    ):
        path = tmp_path / name
        path.write_text("x", encoding="utf-8")
        values[field] = str(path)
    return values


@pytest.mark.parametrize("field", sorted(NATIVE_ONLY_FIELDS))
def test_native_only_field_with_python_fallback(
    model: Path, log_dir: Path, native_only_fields: dict[str, Any], field: str
) -> None:
    s = spec(model_path=str(model), **{field: native_only_fields[field]})
    assert plan_problems(s, tools(llama=PYTHON), log_dir) == [
        f"{SOURCE}: model 'chat' (id 'm1'): field '{field}': {FALLBACK_MESSAGE}"
    ]


@pytest.mark.parametrize("field", sorted(NATIVE_ONLY_FIELDS))
def test_native_only_field_with_native_server(
    model: Path, log_dir: Path, native_only_fields: dict[str, Any], field: str
) -> None:
    s = spec(model_path=str(model), **{field: native_only_fields[field]})
    assert plan(s, tools(), log_dir).argv[0] == NATIVE.program


def test_every_native_only_field_is_one_problem(
    model: Path, log_dir: Path, native_only_fields: dict[str, Any]
) -> None:
    s = spec(model_path=str(model), **native_only_fields)
    lines = plan_problems(s, tools(llama=PYTHON), log_dir)
    assert lines == [
        f"{SOURCE}: model 'chat' (id 'm1'): field '{f}': {FALLBACK_MESSAGE}"
        for f in sorted(NATIVE_ONLY_FIELDS)
    ]


def test_native_only_field_reported_even_when_its_file_is_missing(
    model: Path, log_dir: Path
) -> None:
    s = spec(model_path=str(model), chat_template_file="/nonexistent/t.jinja")
    assert plan_problems(s, tools(llama=PYTHON), log_dir) == [
        f"{SOURCE}: model 'chat' (id 'm1'): field 'chat_template_file': {FALLBACK_MESSAGE}"
    ]


@pytest.mark.parametrize(
    "fields",
    [
        {"temp": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.1, "n_predict": 64},
        {"presence_penalty": 0.3, "repetition_penalty": 1.2},
        {"ubatch_size": 256, "cache_type_k": "q8_0", "cache_type_v": "q8_0"},
        {"flash_attn": "auto", "verbose": True},
        {"chat_template_kwargs": {"enable_thinking": False}},
        {"model_type": "embeddings"},
    ],
)
def test_fields_the_python_fallback_can_take(
    model: Path, log_dir: Path, fields: dict[str, Any]
) -> None:
    p = plan(spec(model_path=str(model), **fields), tools(llama=PYTHON), log_dir)
    assert p.argv[1:3] == ("-m", "llama_cpp.server")


def test_rerank_with_python_fallback(model: Path, log_dir: Path) -> None:
    s = spec(model_path=str(model), model_type="rerank")
    assert plan_problems(s, tools(llama=PYTHON), log_dir) == [
        f"{SOURCE}: model 'chat' (id 'm1'): field 'model_type': {FALLBACK_MESSAGE}"
    ]


def test_rerank_and_pooling_with_python_fallback(model: Path, log_dir: Path) -> None:
    s = spec(model_path=str(model), model_type="rerank", pooling="rank")
    lines = plan_problems(s, tools(llama=PYTHON), log_dir)
    assert [line.split("field ")[1].split(":")[0] for line in lines] == [
        "'model_type'",
        "'pooling'",
    ]


def test_rerank_with_native_server(model: Path, log_dir: Path) -> None:
    p = plan(spec(model_path=str(model), model_type="rerank"), tools(), log_dir)
    assert "--reranking" in p.argv


# --- missing programs and files -----------------------------------------------------------


def test_no_llama_runtime(model: Path, log_dir: Path) -> None:
    advice = "no llama.cpp server found: build one with scripts/build_llama.sh"
    toolchain = tools(llama=None, llama_error=advice)
    assert plan_problems(spec(model_path=str(model)), toolchain, log_dir) == [
        f"{SOURCE}: model 'chat' (id 'm1'): field 'backend': {advice}"
    ]


def test_no_llama_runtime_discovered(
    model: Path, log_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    real = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> ModuleSpec | None:
        return None if name == "llama_cpp" else real(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    toolchain = Toolchain.discover(None)
    assert toolchain.llama is None
    assert toolchain.llama_error is not None
    (line,) = plan_problems(spec(model_path=str(model)), toolchain, log_dir)
    assert line.startswith(f"{SOURCE}: model 'chat' (id 'm1'): field 'backend': ")
    assert "scripts/build_llama.sh" in line
    assert "SLM_LLAMA_SERVER_BIN" in line
    assert "uv sync --extra llamacpp" in line


def test_discover_with_a_wrong_configured_bin(tmp_path: Path) -> None:
    toolchain = Toolchain.discover(str(tmp_path / "missing-llama-server"))
    assert toolchain.llama is None
    assert toolchain.llama_error is not None
    assert "SLM_LLAMA_SERVER_BIN=" in toolchain.llama_error


def test_discover_with_a_configured_bin(tmp_path: Path) -> None:
    program = tmp_path / "llama-server"
    program.write_text("#!/bin/sh\nexit 0\n", encoding="utf-8")
    program.chmod(0o755)
    toolchain = Toolchain.discover(str(program))
    assert toolchain.llama == LlamaRuntime("native", str(program), "SLM_LLAMA_SERVER_BIN")
    assert toolchain.llama_error is None


def test_discover_finds_mlx_server_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    server = bindir / "mlx-openai-server"
    server.write_text("#!/bin/sh\nexit 0\n", encoding="utf-8")
    server.chmod(0o755)
    monkeypatch.setenv("PATH", str(bindir))
    monkeypatch.setattr(sys, "executable", str(tmp_path / "venv" / "bin" / "python"))
    assert Toolchain.discover(None).mlx_server == str(server)


def test_discover_prefers_the_venv_mlx_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    venv_bin = tmp_path / "venv" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "mlx-openai-server").write_text("", encoding="utf-8")
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setattr(sys, "executable", str(venv_bin / "python"))
    assert Toolchain.discover(None).mlx_server == str(venv_bin / "mlx-openai-server")


def test_missing_model_path(log_dir: Path, tmp_path: Path) -> None:
    missing = tmp_path / "absent.gguf"
    with pytest.raises(PlanError) as caught:
        plan(spec(model_path=str(missing)), tools(), log_dir)
    assert caught.value.missing is True
    assert [str(p) for p in caught.value.problems] == [
        f"{SOURCE}: model 'chat' (id 'm1'): field 'model_path': {missing} does not exist"
    ]


def test_missing_model_path_is_checked_before_the_runtime(log_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(PlanError) as caught:
        plan(spec(model_path=str(tmp_path / "absent.gguf")), tools(llama=None), log_dir)
    assert caught.value.missing is True
    assert caught.value.problems[0].field == "model_path"


def test_unusable_model_path_is_not_missing(log_dir: Path, tmp_path: Path) -> None:
    bad = tmp_path / "model.bin"
    bad.write_bytes(b"")
    with pytest.raises(PlanError) as caught:
        plan(spec(model_path=str(bad)), tools(), log_dir)
    assert caught.value.missing is False
    assert [str(p) for p in caught.value.problems] == [
        f"{SOURCE}: model 'chat' (id 'm1'): field 'model_path': {bad} is not a .gguf file"
    ]


def test_hub_id_for_llamacpp(log_dir: Path) -> None:
    with pytest.raises(PlanError) as caught:
        plan(spec(model_path="someorg/some-model"), tools(), log_dir)
    assert caught.value.missing is False
    (line,) = [str(p) for p in caught.value.problems]
    assert line.startswith(f"{SOURCE}: model 'chat' (id 'm1'): field 'model_path': ")
    assert "Hugging Face model ids work for backend mlx only" in line


def test_missing_chat_template_file(model: Path, log_dir: Path, tmp_path: Path) -> None:
    template = tmp_path / "absent.jinja"
    with pytest.raises(PlanError) as caught:
        plan(spec(model_path=str(model), chat_template_file=str(template)), tools(), log_dir)
    assert caught.value.missing is True, "a missing file is retried like a missing model"
    assert [str(p) for p in caught.value.problems] == [
        f"{SOURCE}: model 'chat' (id 'm1'): field 'chat_template_file': {template} does not exist"
    ]


def test_every_missing_file_field_is_reported(model: Path, log_dir: Path, tmp_path: Path) -> None:
    s = spec(
        model_path=str(model),
        chat_template_file=str(tmp_path / "t.jinja"),
        mmproj_path=str(tmp_path / "mm.gguf"),
        spec_model_path=str(tmp_path / "draft.gguf"),
    )
    lines = plan_problems(s, tools(), log_dir)
    assert [line.split("field ")[1].split(":")[0] for line in lines] == [
        "'chat_template_file'",
        "'mmproj_path'",
        "'spec_model_path'",
    ]


def test_existing_file_fields_reach_the_argv(
    model: Path, log_dir: Path, native_only_fields: dict[str, Any]
) -> None:
    s = spec(
        model_path=str(model),
        model_type="multimodal",
        chat_template_file=native_only_fields["chat_template_file"],
        mmproj_path=native_only_fields["mmproj_path"],
        spec_model_path=native_only_fields["spec_model_path"],
    )
    argv = list(plan(s, tools(), log_dir).argv)
    for flag, field in (
        ("--chat-template-file", "chat_template_file"),
        ("--mmproj", "mmproj_path"),
        ("--spec-draft-model", "spec_model_path"),
    ):
        assert argv[argv.index(flag) + 1] == native_only_fields[field]


# --- MLX --------------------------------------------------------------------------------


def test_mlx_without_server(log_dir: Path, tmp_path: Path) -> None:
    s = spec(backend="mlx", model_path=str(tmp_path))
    assert plan_problems(s, tools(mlx_server=None), log_dir) == [
        f"{SOURCE}: model 'chat' (id 'm1'): field 'backend': "
        "mlx-openai-server is not installed (uv sync --extra mlx)"
    ]


def test_mlx_plan_needs_no_llama_runtime(log_dir: Path) -> None:
    s = spec(backend="mlx", model_path="mlx-community/Qwen3-4B-8bit", port=8511)
    p = plan(s, tools(llama=None, llama_error="none"), log_dir)
    assert p.argv[:4] == (MLX_SERVER, "launch", "--model-path", "mlx-community/Qwen3-4B-8bit")
    assert p.backend == "mlx"
    assert p.log_path == log_dir / "mlx-m1-8511.log"


def test_mlx_rerank_plan_uses_this_python(log_dir: Path, tmp_path: Path) -> None:
    s = spec(backend="mlx-rerank", model_type="rerank", model_path=str(tmp_path))
    p = plan(s, tools(llama=None, mlx_server=None), log_dir)
    assert p.argv[:6] == (
        sys.executable,
        "-m",
        "slm_server",
        "mlx-rerank",
        "--model-path",
        str(tmp_path),
    )


# --- plan_registry ------------------------------------------------------------------------


def test_plan_registry(model: Path, log_dir: Path, tmp_path: Path) -> None:
    ok = spec(role="ok", index=0, id="a", port=8501, model_path=str(model))
    broken = spec(role="broken", index=1, id="b", port=8502, model_path=str(tmp_path / "x.gguf"))
    off = spec(role="off", index=2, id="c", port=8503, enabled=False, model_path="/gone.gguf")
    ok2 = spec(role="ok2", index=3, id="d", port=8504, model_path=str(model))
    registry = RegistryFile(path=Path("/etc/reg.yaml"), models=(ok, broken, off, ok2))
    plans, failures = plan_registry(registry, tools(), log_dir, budget_mb=BUDGET_MB)
    assert [p.role for p in plans] == ["ok", "ok2"]
    assert [(s.role, e.missing) for s, e in failures] == [("broken", True)]
    assert str(failures[0][1].problems[0]).startswith("/etc/reg.yaml: model 'broken' (id 'b')")


def test_plan_registry_empty(log_dir: Path) -> None:
    assert plan_registry(
        RegistryFile(path=Path("r.yaml"), models=()), tools(), log_dir, budget_mb=BUDGET_MB
    ) == (
        [],
        [],
    )


def test_readiness_path_follows_the_runtime(model: Path, log_dir: Path) -> None:
    native = plan(spec(model_path=str(model)), tools(), log_dir)
    assert native.health_url.endswith(":8501/health")
    fallback = plan(spec(model_path=str(model)), tools(llama=PYTHON), log_dir)
    # llama_cpp.server has no /health, and its /v1/models waits for any generation.
    assert fallback.health_url.endswith(":8501/docs")
