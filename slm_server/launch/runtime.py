"""Which llama.cpp server this machine can run.

The native ``llama-server`` wins: ``SLM_LLAMA_SERVER_BIN`` first, then ``llama-server``
on ``PATH``. Without one, llama-cpp-python's ``python -m llama_cpp.server`` is the
fallback, when the ``llamacpp`` extra is installed.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class LlamaRuntime:
    """A llama.cpp server program: ``native`` (llama-server) or ``python`` (fallback)."""

    kind: Literal["native", "python"]
    program: str
    origin: str

    @property
    def is_native(self) -> bool:
        return self.kind == "native"


class RuntimeNotFound(Exception):
    """No llama.cpp server is available, or ``SLM_LLAMA_SERVER_BIN`` is wrong."""


def find_llama_runtime(configured_bin: str | None) -> LlamaRuntime:
    """Pick the llama.cpp server; raises :class:`RuntimeNotFound` with advice."""
    if configured_bin:
        path = os.path.expanduser(configured_bin)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return LlamaRuntime("native", path, "SLM_LLAMA_SERVER_BIN")
        raise RuntimeNotFound(
            f"SLM_LLAMA_SERVER_BIN={configured_bin} is not an executable file "
            "(run scripts/build_llama.sh and copy the line it prints into .env)"
        )
    on_path = shutil.which("llama-server")
    if on_path:
        return LlamaRuntime("native", on_path, "PATH")
    if importlib.util.find_spec("llama_cpp") is not None:
        return LlamaRuntime("python", sys.executable, "llama-cpp-python")
    raise RuntimeNotFound(
        "no llama.cpp server found: build one with scripts/build_llama.sh and set "
        "SLM_LLAMA_SERVER_BIN, put llama-server on PATH, or `uv sync --extra llamacpp`"
    )
