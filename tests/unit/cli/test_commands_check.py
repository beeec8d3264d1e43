"""``python -m slm_server check`` against temporary registries.

The scenarios the check command exists for run as real processes, all started at once
(module fixture) so the suite stays fast; the rest call ``cli.main`` in-process.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib.machinery import ModuleSpec
from pathlib import Path
from typing import Any

import pytest
import yaml

from slm_server.cli.commands import main
from tests.registry_entries import registry_entry

# Its module-scoped stack starts once: one worker runs the whole module.
pytestmark = pytest.mark.xdist_group("test_cli_check")

ROOT = Path(__file__).resolve().parents[3]


@dataclass(frozen=True)
class Run:
    code: int
    stdout: str
    stderr: str

    @property
    def err_lines(self) -> list[str]:
        return self.stderr.splitlines()


@dataclass(frozen=True)
class Launch:
    """How to start ``check``: which llama-server to configure, what to put on PYTHONPATH."""

    llama_bin: Path | None = None
    pythonpath: Path | None = None


@dataclass(frozen=True)
class Sandbox:
    root: Path
    config: Path
    bin_dir: Path
    fake_llama: Path
    models: Path
    log_dir: Path

    def write_registry(self, models: dict[str, dict[str, Any]]) -> Path:
        self.config.write_text(yaml.safe_dump({"models": models}, sort_keys=False), "utf-8")
        return self.config

    def model(self, name: str = "model.gguf") -> Path:
        path = self.models / name
        path.write_bytes(b"")
        return path

    def fake_llama_cpp(self) -> Path:
        """A directory holding an empty ``llama_cpp`` package, for PYTHONPATH."""
        site = self.root / "site"
        (site / "llama_cpp").mkdir(parents=True, exist_ok=True)
        (site / "llama_cpp" / "__init__.py").write_text("", encoding="utf-8")
        return site

    def env(self, launch: Launch) -> dict[str, str]:
        env = {
            "PATH": str(self.bin_dir),
            "HOME": str(self.root),
            "SLM_CONFIG": str(self.config),
            "SLM_ENV_FILE": str(self.root / "absent.env"),
            "SLM_BACKEND_LOG_DIR": str(self.log_dir),
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        if launch.llama_bin is not None:
            env["SLM_LLAMA_SERVER_BIN"] = str(launch.llama_bin)
        if launch.pythonpath is not None:
            env["PYTHONPATH"] = str(launch.pythonpath)
        return env


def make_sandbox(root: Path) -> Sandbox:
    bin_dir = root / "bin"
    bin_dir.mkdir()
    fake = root / "llama" / "llama-server"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho fake llama-server\nexit 0\n", encoding="utf-8")
    fake.chmod(0o755)
    models = root / "models"
    models.mkdir()
    return Sandbox(
        root=root,
        config=root / "models.yaml",
        bin_dir=bin_dir,
        fake_llama=fake,
        models=models,
        log_dir=root / "logs",
    )


def entry(model_id: str, port: int, model_path: Path | str, **fields: Any) -> dict[str, Any]:
    written = {"default_timeout": 60, "quantization": "Q4_1", **fields}
    return registry_entry(model_id, port, model_path=str(model_path), **written)


def assert_clean_failure(run: Run) -> None:
    assert run.code == 1, run
    assert "Traceback" not in run.stderr
    assert "Traceback" not in run.stdout


# --- scenarios run as real processes ------------------------------------------------------


def path_problems(sb: Sandbox) -> Launch:
    sb.write_registry(
        {
            "missing": entry("a", 8601, sb.models / "absent.gguf"),
            "hub": entry("b", 8602, "someorg/some-model"),
            "fine": entry("c", 8603, sb.model()),
        }
    )
    return Launch(llama_bin=sb.fake_llama)


def broken_registry(sb: Sandbox) -> Launch:
    sb.write_registry(
        {
            "dup1": entry("a", 8601, sb.model()),
            "dup2": entry("b", 8601, sb.model("other.gguf")),
            # An unknown field does not hide the entry's port clash.
            "unknown": entry("c", 8601, sb.model("third.gguf"), bogus_field=1),
            "missing": entry("d", 8603, sb.models / "absent.gguf"),
            "hub": entry("e", 8604, "someorg/some-model"),
        }
    )
    return Launch(llama_bin=sb.fake_llama)


def native_only_on_fallback(sb: Sandbox) -> Launch:
    sb.write_registry({"chat": entry("m1", 8601, sb.model(), cache_ram=4096)})
    return Launch(pythonpath=sb.fake_llama_cpp())


def valid_registry(sb: Sandbox) -> Launch:
    model = sb.model("SmolLM2-135M.Q8_0.gguf")
    sb.write_registry(
        {
            "standard": entry(
                "smollm2",
                8601,
                model,
                quantization="Q8_0",
                context_length=4096,
                max_concurrency=2,
                temp=0.7,
                flash_attn="auto",
                chat_template_kwargs={"enable_thinking": False},
            ),
            "embed": entry("embedder", 8602, sb.models, model_type="embeddings"),
            "spare": entry("spare-model", 8601, sb.models / "absent.gguf", enabled=False),
        }
    )
    # Its share sizes the prompt cache of a model it cannot estimate: 8000 // 8.
    (sb.root / "absent.env").write_text("SLM_MEMORY_BUDGET_MB=8000\n", encoding="utf-8")
    return Launch(llama_bin=sb.fake_llama)


def missing_config(sb: Sandbox) -> Launch:
    return Launch(llama_bin=sb.fake_llama)


SCENARIOS: dict[str, Callable[[Sandbox], Launch]] = {
    "paths": path_problems,
    "broken": broken_registry,
    "fallback": native_only_on_fallback,
    "valid": valid_registry,
    "missing_config": missing_config,
}


@pytest.fixture(scope="module")
def checks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Sandbox, Run]]:
    """Every scenario's sandbox and the result of ``python -m slm_server check`` in it."""
    started: dict[str, tuple[Sandbox, subprocess.Popen[str]]] = {}
    try:
        for name, setup in SCENARIOS.items():
            sandbox = make_sandbox(tmp_path_factory.mktemp(name))
            proc = subprocess.Popen(
                [sys.executable, "-m", "slm_server", "check"],
                cwd=ROOT,
                env=sandbox.env(setup(sandbox)),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            started[name] = (sandbox, proc)
        results: dict[str, tuple[Sandbox, Run]] = {}
        for name, (sandbox, proc) in started.items():
            out, err = proc.communicate(timeout=60)
            results[name] = (sandbox, Run(proc.returncode, out, err))
        return results
    finally:
        for _sandbox, proc in started.values():
            if proc.poll() is None:
                proc.kill()
                proc.communicate()


def test_path_problems_one_line_each(checks: dict[str, tuple[Sandbox, Run]]) -> None:
    sandbox, run = checks["paths"]
    config, missing = sandbox.config, sandbox.models / "absent.gguf"
    assert_clean_failure(run)
    assert run.err_lines == [
        f"{config}: model 'missing' (id 'a'): field 'model_path': {missing} does not exist",
        f"{config}: model 'hub' (id 'b'): field 'model_path': 'someorg/some-model' is "
        "neither a local file nor a directory; Hugging Face model ids work for backend mlx "
        "only, llamacpp needs a local .gguf file or a directory holding one",
    ]
    assert "fine (c) -> 127.0.0.1:8603" in run.stdout
    assert "ready to launch" not in run.stdout


def test_broken_registry_reports_every_problem_at_once(
    checks: dict[str, tuple[Sandbox, Run]],
) -> None:
    sandbox, run = checks["broken"]
    assert_clean_failure(run)
    lines = run.err_lines
    assert sum("field 'bogus_field': unknown field" in line for line in lines) == 1
    assert sum("port 8601 is also used by" in line for line in lines) == 3
    assert sum(f"{sandbox.models / 'absent.gguf'} does not exist" in line for line in lines) == 1
    assert sum("Hugging Face model ids work for backend mlx only" in line for line in lines) == 1
    assert len(lines) == 6
    assert all(line.startswith(f"{sandbox.config}: model ") for line in lines)


def test_broken_registry_fails_cleanly(checks: dict[str, tuple[Sandbox, Run]]) -> None:
    """What the broken registry reports today: every schema problem, one line each."""
    sandbox, run = checks["broken"]
    config = sandbox.config
    assert_clean_failure(run)
    also = "field 'port': port 8601 is also used by"
    assert run.err_lines[:4] == [
        f"{config}: model 'unknown' (id 'c'): field 'bogus_field': unknown field",
        f"{config}: model 'dup1' (id 'a'): {also} 'dup2', 'unknown'",
        f"{config}: model 'dup2' (id 'b'): {also} 'dup1', 'unknown'",
        f"{config}: model 'unknown' (id 'c'): {also} 'dup1', 'dup2'",
    ]
    assert all(line.startswith(f"{config}: model ") for line in run.err_lines)


def test_native_only_field_with_python_fallback(checks: dict[str, tuple[Sandbox, Run]]) -> None:
    sandbox, run = checks["fallback"]
    assert_clean_failure(run)
    assert run.err_lines == [
        f"{sandbox.config}: model 'chat' (id 'm1'): field 'cache_ram': needs the native "
        "llama-server, but only the Python fallback (llama_cpp.server) is available; "
        "run scripts/build_llama.sh"
    ]


def test_valid_registry_prints_the_argv(checks: dict[str, tuple[Sandbox, Run]]) -> None:
    sandbox, run = checks["valid"]
    model = sandbox.models / "SmolLM2-135M.Q8_0.gguf"
    assert run.code == 0, run
    assert run.stderr == ""
    lines = run.stdout.splitlines()
    assert "spare (spare-model): disabled, skipped" in lines
    log = sandbox.log_dir / "llama-smollm2-8601.log"
    assert f"standard (smollm2) -> 127.0.0.1:8601, log {log}" in lines
    argv_lines = [
        shlex.split(line)
        for line in lines
        if line.startswith("  ")
        and not line.startswith(("  memory: ", "  prompt cache ", "  tools: ", "  infill "))
    ]
    # Whether the chat model fills in the middle, and why (its stand-in file is no GGUF).
    infill = [line for line in lines if line.startswith("  infill ")]
    assert len(infill) == 1 and infill[0].startswith(
        "  infill (/infill, suffix): unknown (refused): its GGUF header cannot be read"
    ), infill
    # The chat model's tool policy is said (the default: auto, repaired); not the embedder's.
    tools = [line for line in lines if line.startswith("  tools")]
    assert tools == [
        "  tools: auto, the template's where llama-server says it takes tools "
        "(GET /props), else written into the prompt by the router; calls checked and mended"
    ]
    # The chat model's slots are kept (its empty stand-in file cannot be read for a
    # sliding window); the embedder has no conversation to keep.
    assert (
        sum(line.startswith("  prompt cache kept across unloads (key ") for line in lines) == 1
    ), lines
    memory = [line for line in lines if line.startswith("  memory: ")]
    # Empty stand-in model files: no GGUF to estimate from, and check says so.
    assert len(memory) == 2 and all("no estimate" in line for line in memory)
    assert all(line.endswith("; load: always") for line in memory)
    # The chat model's prompt cache is sized and counted; the embedder keeps none.
    assert "+ prompt cache 1000 MiB (--cache-ram)" in memory[0]
    assert "prompt cache" not in memory[1]
    assert argv_lines[0] == [
        str(sandbox.fake_llama),
        "--model",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        "8601",
        "--alias",
        "smollm2",
        "--parallel",
        "2",
        "--metrics",
        "--batch-size",
        "512",
        "--ctx-size",
        "4096",
        "--jinja",
        "--chat-template-kwargs",
        '{"enable_thinking": false}',
        "--temp",
        "0.7",
        "--cache-ram",
        "1000",
        "--cache-type-k",
        "q8_0",
        "--cache-type-v",
        "q8_0",
        "--flash-attn",
        "auto",
        "--slot-save-path",  # the cache directory's, under the home
        str(sandbox.root / ".cache" / "slm_server" / "slots"),
    ]
    assert argv_lines[1][:3] == [str(sandbox.fake_llama), "--model", str(model)]
    assert "--embedding" in argv_lines[1]
    assert argv_lines[1][argv_lines[1].index("--cache-ram") + 1] == "0"
    assert len(argv_lines) == 2
    assert f"llama.cpp server: {sandbox.fake_llama} (native, from SLM_LLAMA_SERVER_BIN)" in lines
    assert lines[-1] == f"{sandbox.config}: 2 model(s) ready to launch"
    assert not sandbox.log_dir.exists()


def test_missing_config_file(checks: dict[str, tuple[Sandbox, Run]]) -> None:
    sandbox, run = checks["missing_config"]
    assert_clean_failure(run)
    assert run.err_lines == [f"{sandbox.config}: file not found"]
    assert run.stdout == ""


# --- the same command in-process -----------------------------------------------------------


@pytest.fixture
def sandbox(tmp_path: Path) -> Sandbox:
    return make_sandbox(tmp_path)


def check_in_process(
    sandbox: Sandbox,
    launch: Launch,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    *,
    llama_cpp: bool = False,
) -> Run:
    for key in list(os.environ):
        if key.startswith("SLM_"):
            monkeypatch.delenv(key)
    for key, value in sandbox.env(launch).items():
        monkeypatch.setenv(key, value)
    real = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> ModuleSpec | None:
        if name == "llama_cpp":
            return ModuleSpec("llama_cpp", None) if llama_cpp else None
        return real(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    code = main(["check"])
    out, err = capsys.readouterr()
    return Run(code, out, err)


def test_python_fallback_plans_a_plain_entry(
    sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    model = sandbox.model()
    sandbox.write_registry({"chat": entry("m1", 8601, model, temp=0.5)})
    run = check_in_process(sandbox, Launch(), monkeypatch, capsys, llama_cpp=True)
    assert run.code == 0, run
    argv_line = next(line for line in run.stdout.splitlines() if line.startswith("  "))
    assert shlex.split(argv_line) == [
        sys.executable,
        "-m",
        "llama_cpp.server",
        "--model",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        "8601",
        "--model_alias",
        "m1",
        "--interrupt_requests",
        "false",
        "--n_ctx",
        "0",
    ]
    assert f"llama.cpp server: {sys.executable} (python, from llama-cpp-python)" in run.stdout


def test_no_llama_runtime_at_all(
    sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = sandbox.write_registry({"chat": entry("m1", 8601, sandbox.model())})
    run = check_in_process(sandbox, Launch(), monkeypatch, capsys)
    assert run.code == 1
    (line,) = run.err_lines
    assert line.startswith(f"{config}: model 'chat' (id 'm1'): field 'backend': ")
    assert "scripts/build_llama.sh" in line


def test_duplicate_ids_warn_but_pass(
    sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    model = sandbox.model()
    config = sandbox.write_registry(
        {"a": entry("same", 8601, model), "b": entry("same", 8602, model)}
    )
    run = check_in_process(sandbox, Launch(llama_bin=sandbox.fake_llama), monkeypatch, capsys)
    assert run.code == 0, run
    warnings = [line for line in run.stdout.splitlines() if line.startswith("warning: ")]
    assert warnings == [
        f"warning: {config}: model '{role}' (id 'same'): field 'id': id is used by more "
        "than one enabled entry; requests for it get 409"
        for role in ("a", "b")
    ]
    assert run.stdout.splitlines()[-1] == f"{config}: 2 model(s) ready to launch"


def test_wrong_llama_server_bin(
    sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    executable = sandbox.fake_llama
    sandbox.bin_dir.joinpath("llama-server").write_bytes(executable.read_bytes())
    sandbox.bin_dir.joinpath("llama-server").chmod(0o755)
    sandbox.write_registry({"chat": entry("m1", 8601, sandbox.model())})
    wrong = sandbox.root / "nowhere" / "llama-server"
    run = check_in_process(sandbox, Launch(llama_bin=wrong), monkeypatch, capsys, llama_cpp=True)
    assert run.code == 1
    (line,) = run.err_lines
    assert f"field 'backend': SLM_LLAMA_SERVER_BIN={wrong} is not an executable file" in line


def test_invalid_settings_are_one_line(
    sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    sandbox.write_registry({"chat": entry("m1", 8601, sandbox.model())})
    (sandbox.root / "absent.env").write_text("SLM_ROUTER_PORT=eighty\n", encoding="utf-8")
    run = check_in_process(sandbox, Launch(llama_bin=sandbox.fake_llama), monkeypatch, capsys)
    assert run.code == 1
    assert run.err_lines == ["error: SLM_ROUTER_PORT='eighty' is not an integer"]
    assert run.stdout == ""


def test_a_model_larger_than_the_memory_budget_fails_check(
    sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    model = sandbox.model()
    sandbox.write_registry(
        {
            "big": entry("big", 8601, model, load="on_demand", memory_mb=5000),
            "small": entry("small", 8602, model, memory_mb=100),
        }
    )
    (sandbox.root / "absent.env").write_text("SLM_MEMORY_BUDGET_MB=4000\n", encoding="utf-8")
    run = check_in_process(sandbox, Launch(llama_bin=sandbox.fake_llama), monkeypatch, capsys)
    assert_clean_failure(run)
    (line,) = run.err_lines
    assert "model 'big' (id 'big'): field 'memory_mb': needs 5000 MiB" in line
    assert "memory budget of 4000 MiB (SLM_MEMORY_BUDGET_MB)" in line
    assert "  memory: 100 MiB (memory_mb); load: always" in run.stdout.splitlines()


def test_always_models_over_the_budget_together_are_a_warning(
    sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    model = sandbox.model()
    sandbox.write_registry(
        {
            "a": entry("a", 8601, model, memory_mb=3000),
            "b": entry("b", 8602, model, memory_mb=3000),
        }
    )
    (sandbox.root / "absent.env").write_text("SLM_MEMORY_BUDGET_MB=4000\n", encoding="utf-8")
    run = check_in_process(sandbox, Launch(llama_bin=sandbox.fake_llama), monkeypatch, capsys)
    assert run.code == 0, run
    assert (
        "warning: the load: always models need 6000 MiB together, more than the memory "
        "budget of 4000 MiB: no on-demand model will fit beside them"
    ) in run.stdout.splitlines()


def test_missing_config_hints_at_the_example(
    sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (sandbox.root / "models.yaml.example").write_text("models: {}\n", encoding="utf-8")
    run = check_in_process(sandbox, Launch(llama_bin=sandbox.fake_llama), monkeypatch, capsys)
    assert run.code == 1
    assert run.err_lines == [
        f"{sandbox.config}: file not found "
        "(copy models.yaml.example to models.yaml to start from the defaults)"
    ]


def test_a_remote_is_checked_but_never_planned(
    sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    far = {
        "id": "m1",
        "backend": "remote",
        "url": "http://user:secret@10.0.0.5:8080/v1",
        "api_key_env": "SLM_TEST_UNSET_KEY",
        "replica_of": "chat",
        "default_timeout": 60,
    }
    config = sandbox.write_registry({"chat": entry("m1", 8601, sandbox.model()), "far": far})
    monkeypatch.delenv("SLM_TEST_UNSET_KEY", raising=False)
    run = check_in_process(sandbox, Launch(llama_bin=sandbox.fake_llama), monkeypatch, capsys)
    assert run.code == 0, run
    assert (
        "far (m1) -> remote http://10.0.0.5:8080/v1; SLM_TEST_UNSET_KEY is not set, "
        "no key will be sent"
    ) in run.stdout.splitlines()
    assert "secret" not in run.stdout
    assert run.stdout.splitlines()[-1] == f"{config}: 1 model(s) ready to launch"


def test_an_alias_clashing_with_another_entry_fails_check(
    sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    model = sandbox.model()
    config = sandbox.write_registry(
        {
            "a": entry("m1", 8601, model, aliases=["fast", "m2"]),
            "b": entry("m2", 8602, model, aliases=["fast"]),
        }
    )
    run = check_in_process(sandbox, Launch(llama_bin=sandbox.fake_llama), monkeypatch, capsys)
    assert run.code == 1
    assert run.err_lines == [
        f"{config}: model 'a' (id 'm1'): field 'aliases[1]': 'm2' is also the id of model "
        "'b' (id 'm2'); a name may lead to one model only",
        f"{config}: model 'b' (id 'm2'): field 'aliases[0]': 'fast' is also an alias of model "
        "'a' (id 'm1'); a name may lead to one model only",
    ]
