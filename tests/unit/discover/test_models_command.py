"""``python -m slm_server models`` end to end: every store laid out under a temporary
home, a registry serving one of the files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.registry_entries import registry_entry, registry_yaml
from tests.unit.discover.stores import hf_file, ollama_model, tiny_gguf

# The variables that would send a store elsewhere than the temporary home.
STORE_VARIABLES = (
    "HF_HUB_CACHE",
    "HUGGINGFACE_HUB_CACHE",
    "HF_HOME",
    "XDG_CACHE_HOME",
    "OLLAMA_MODELS",
    "LLAMA_CACHE",
)


def run(home: Path, config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in STORE_VARIABLES}
    env |= {"HOME": str(home), "SLM_CONFIG": str(config), "SLM_ENV_FILE": str(home / "no.env")}
    return subprocess.run(
        [sys.executable, "-m", "slm_server", "models", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_models_lists_every_store_and_what_the_registry_serves(tmp_path: Path) -> None:
    home = tmp_path / "home"
    link = hf_file(home / ".cache" / "huggingface" / "hub", "o/r", "r-Q4_K_M.gguf")
    hf_file(home / ".cache" / "huggingface" / "hub", "o/r", "mmproj-r-f16.gguf")
    lms = home / ".lmstudio" / "models" / "pub" / "repo"
    tiny_gguf(lms / "big-Q8_0-00001-of-00002.gguf")
    (lms / "big-Q8_0-00002-of-00002.gguf").write_bytes(b"\0" * 4096)
    ollama_model(home / ".ollama" / "models", "qwen3", "0.6b")
    tiny_gguf(home / ".cache" / "llama.cpp" / "embed.gguf", "nomic-bert")
    config = tmp_path / "models.yaml"
    config.write_text(
        "models:\n" + registry_yaml("chat", registry_entry("served", 8501, model_path=str(link)))
    )

    done = run(home, config, "--json")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    mine = {m["name"]: m for m in json.loads(done.stdout) if m["store"] != "project"}
    assert sorted(mine) == [
        "llama.cpp:embed.gguf",
        "lmstudio:pub/repo/big-Q8_0-00001-of-00002.gguf",
        "o/r/r-Q4_K_M.gguf",
        "ollama:qwen3:0.6b",
    ]
    assert mine["o/r/r-Q4_K_M.gguf"]["served_as"] == ["served"]
    assert mine["o/r/r-Q4_K_M.gguf"]["quantization"] == "Q4_K_M"
    assert mine["ollama:qwen3:0.6b"]["context_length"] == 4096
    assert mine["llama.cpp:embed.gguf"]["type"] == "embeddings"
    split = mine["lmstudio:pub/repo/big-Q8_0-00001-of-00002.gguf"]
    assert split["size"] == Path(split["path"]).stat().st_size + 4096

    table = run(home, config)
    assert table.returncode == 0, table.stderr
    assert table.stdout.splitlines()[0].split()[:3] == ["NAME", "SIZE", "QUANT"]
    assert any(line.startswith("o/r/r-Q4_K_M.gguf ") for line in table.stdout.splitlines())


def test_models_without_a_registry_still_lists_and_exits_0(tmp_path: Path) -> None:
    tiny_gguf(tmp_path / ".cache" / "llama.cpp" / "m.gguf")
    done = run(tmp_path, tmp_path / "absent.yaml", "--json")
    assert done.returncode == 0
    assert "registry not read" in done.stderr
    assert "Traceback" not in done.stderr
    assert "llama.cpp:m.gguf" in [m["name"] for m in json.loads(done.stdout)]
