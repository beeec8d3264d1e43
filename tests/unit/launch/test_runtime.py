"""Which llama.cpp server is used: configured binary, PATH, or the Python fallback."""

from __future__ import annotations

import importlib.util
import sys
from importlib.machinery import ModuleSpec
from pathlib import Path

import pytest

from slm_server.launch.runtime import LlamaRuntime, RuntimeNotFound, find_llama_runtime

REAL_FIND_SPEC = importlib.util.find_spec


def executable(path: Path, mode: int = 0o755) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\nexit 0\n", encoding="utf-8")
    path.chmod(mode)
    return path


@pytest.fixture
def empty_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """PATH reduced to an empty directory: no llama-server anywhere."""
    directory = tmp_path / "empty-bin"
    directory.mkdir()
    monkeypatch.setenv("PATH", str(directory))
    return directory


def fake_llama_cpp(monkeypatch: pytest.MonkeyPatch, installed: bool) -> None:
    def find_spec(name: str, package: str | None = None) -> ModuleSpec | None:
        if name == "llama_cpp":
            return ModuleSpec("llama_cpp", None) if installed else None
        return REAL_FIND_SPEC(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def test_configured_bin_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, empty_path: Path
) -> None:
    executable(empty_path / "llama-server")
    fake_llama_cpp(monkeypatch, installed=True)
    program = executable(tmp_path / "build" / "llama-server")
    runtime = find_llama_runtime(str(program))
    assert runtime == LlamaRuntime("native", str(program), "SLM_LLAMA_SERVER_BIN")
    assert runtime.is_native


def test_configured_bin_with_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    program = executable(tmp_path / "llama.cpp" / "llama-server")
    assert find_llama_runtime("~/llama.cpp/llama-server").program == str(program)


def test_missing_configured_bin_never_falls_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, empty_path: Path
) -> None:
    executable(empty_path / "llama-server")
    fake_llama_cpp(monkeypatch, installed=True)
    configured = str(tmp_path / "nope" / "llama-server")
    with pytest.raises(RuntimeNotFound) as caught:
        find_llama_runtime(configured)
    message = str(caught.value)
    assert message.startswith(f"SLM_LLAMA_SERVER_BIN={configured} is not an executable file")
    assert "scripts/build_llama.sh" in message


def test_non_executable_configured_bin(tmp_path: Path) -> None:
    program = executable(tmp_path / "llama-server", mode=0o644)
    with pytest.raises(RuntimeNotFound, match="is not an executable file"):
        find_llama_runtime(str(program))


def test_directory_as_configured_bin(tmp_path: Path) -> None:
    with pytest.raises(RuntimeNotFound, match="is not an executable file"):
        find_llama_runtime(str(tmp_path))


def test_llama_server_on_path(monkeypatch: pytest.MonkeyPatch, empty_path: Path) -> None:
    program = executable(empty_path / "llama-server")
    fake_llama_cpp(monkeypatch, installed=True)
    assert find_llama_runtime(None) == LlamaRuntime("native", str(program), "PATH")


def test_empty_configured_bin_is_unset(monkeypatch: pytest.MonkeyPatch, empty_path: Path) -> None:
    program = executable(empty_path / "llama-server")
    assert find_llama_runtime("") == LlamaRuntime("native", str(program), "PATH")


def test_non_executable_on_path_is_skipped(
    monkeypatch: pytest.MonkeyPatch, empty_path: Path
) -> None:
    executable(empty_path / "llama-server", mode=0o644)
    fake_llama_cpp(monkeypatch, installed=True)
    assert find_llama_runtime(None).kind == "python"


def test_python_fallback(monkeypatch: pytest.MonkeyPatch, empty_path: Path) -> None:
    fake_llama_cpp(monkeypatch, installed=True)
    runtime = find_llama_runtime(None)
    assert runtime == LlamaRuntime("python", sys.executable, "llama-cpp-python")
    assert not runtime.is_native


def test_nothing_found(monkeypatch: pytest.MonkeyPatch, empty_path: Path) -> None:
    fake_llama_cpp(monkeypatch, installed=False)
    with pytest.raises(RuntimeNotFound) as caught:
        find_llama_runtime(None)
    message = str(caught.value)
    assert message.startswith("no llama.cpp server found")
    for advice in ("scripts/build_llama.sh", "SLM_LLAMA_SERVER_BIN", "uv sync --extra llamacpp"):
        assert advice in message
