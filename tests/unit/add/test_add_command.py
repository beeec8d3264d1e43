"""``python -m slm_server add`` end to end, as a real process against temporary
registries and tiny GGUF files: what it writes passes ``check``, what was there stays
byte for byte, and every refusal is one line with nothing written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from slm_server.add.command import footprint_mb
from tests.registry_entries import registry_entry, registry_yaml
from tests.unit.discover.stores import hf_file, tiny_gguf
from tests.unit.discover.test_models_command import STORE_VARIABLES

ROOT = Path(__file__).resolve().parents[3]


def sandbox(tmp: Path, **overrides: str) -> dict[str, str]:
    """The environment of a command run in ``tmp``: its home, registry and log folder,
    a llama-server that only exists, no setting of this machine's."""
    llama = tmp / "bin" / "llama-server"
    llama.parent.mkdir(parents=True, exist_ok=True)
    llama.write_text("#!/bin/sh\necho fake llama-server\nexit 0\n", encoding="utf-8")
    llama.chmod(0o755)
    env = {
        k: v for k, v in os.environ.items() if k not in STORE_VARIABLES and not k.startswith("SLM_")
    }
    return env | {
        "HOME": str(tmp / "home"),
        "SLM_CONFIG": str(tmp / "models.yaml"),
        "SLM_ENV_FILE": str(tmp / "no.env"),
        "SLM_BACKEND_LOG_DIR": str(tmp / "logs"),
        "SLM_LLAMA_SERVER_BIN": str(llama),
        **overrides,
    }


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "slm_server", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def entries(env: dict[str, str]) -> dict[str, Any]:
    data = yaml.safe_load(Path(env["SLM_CONFIG"]).read_text())
    models = data["models"]
    assert isinstance(models, dict)
    return models


def test_a_chat_and_an_embeddings_file_are_added_and_pass_check(tmp_path: Path) -> None:
    env = sandbox(tmp_path)
    chat = tiny_gguf(tmp_path / "Chat-Model-Q4_K_M.gguf", "qwen3", context=8192, file_type=15)
    embed = tiny_gguf(tmp_path / "nomic-embed.gguf", "nomic-bert")

    first = run(env, "add", str(chat))
    assert first.returncode == 0, first.stderr
    assert "chat-model-q4_k_m (chat-model-q4_k_m) added to" in first.stdout
    assert "memory: ~" in first.stdout
    assert "at context 8192 (the file's trained context)" in first.stdout
    assert "no gateway is running: the entry takes effect at its next start" in first.stdout
    second = run(env, "add", str(embed), "--no-reload")
    assert second.returncode == 0, second.stderr
    assert "gateway" not in second.stdout

    written = entries(env)
    assert written["chat-model-q4_k_m"] == {
        "id": "chat-model-q4_k_m",
        "backend": "llamacpp",
        "port": written["chat-model-q4_k_m"]["port"],
        "model_path": str(chat),
        "default_timeout": 120,
        "quantization": "Q4_K_M",
        "context_length": 8192,
        "load": "on_demand",
    }
    embedding = written["nomic-embed"]
    assert (embedding["model_type"], embedding["pooling"]) == ("embeddings", "mean")
    assert embedding["port"] > written["chat-model-q4_k_m"]["port"]
    checked = run(env, "check")
    assert checked.returncode == 0, checked.stderr
    assert "2 model(s) ready to launch" in checked.stdout


def test_an_existing_registry_is_kept_byte_for_byte(tmp_path: Path) -> None:
    env = sandbox(tmp_path)
    served = tiny_gguf(tmp_path / "served.gguf")
    old = (
        "# My models, my comments.\n"
        "models:\n"
        "  # The one I use every day.\n"
        + registry_yaml("daily", registry_entry("daily", 8600, model_path=str(served)))
        + "  # spare:\n  #   id: not-yet   # keep me\n"
    )
    Path(env["SLM_CONFIG"]).write_text(old)
    model = tiny_gguf(tmp_path / "other.gguf", context=4096)

    done = run(env, "add", str(model), "--id", "Mine", "--load", "always", "--port", "8700")
    assert done.returncode == 0, done.stderr
    text = Path(env["SLM_CONFIG"]).read_text()
    assert text.startswith(old)
    assert list(entries(env)) == ["daily", "mine"]
    assert entries(env)["mine"]["id"] == "Mine"
    assert (entries(env)["mine"]["load"], entries(env)["mine"]["port"]) == ("always", 8700)
    assert run(env, "check").returncode == 0


def test_a_taken_id_or_role_is_refused_and_nothing_written(tmp_path: Path) -> None:
    env = sandbox(tmp_path)
    old = "models:\n" + registry_yaml("chat", registry_entry("served", 8501))
    Path(env["SLM_CONFIG"]).write_text(old)
    model = tiny_gguf(tmp_path / "m.gguf")

    for taken, said in (("served", "the id 'served' is already taken by 'chat'"), ("chat", "role")):
        done = run(env, "add", str(model), "--id", taken)
        assert done.returncode == 1
        assert done.stderr.splitlines() == [done.stderr.strip()]
        assert said in done.stderr and "--id" in done.stderr
    assert Path(env["SLM_CONFIG"]).read_text() == old


def test_a_dry_run_prints_the_entry_and_writes_nothing(tmp_path: Path) -> None:
    env = sandbox(tmp_path)
    model = tiny_gguf(tmp_path / "m.gguf")
    done = run(env, "add", str(model), "--dry-run")
    assert done.returncode == 0, done.stderr
    assert "m (m) would be added (dry run: nothing written)" in done.stdout
    assert "    id: m\n" in done.stdout and "memory: ~" in done.stdout
    assert not Path(env["SLM_CONFIG"]).exists()
    assert not any(p.name.startswith(".models.yaml") for p in tmp_path.iterdir())


def test_a_file_that_is_not_gguf_or_a_name_not_found_is_one_line(tmp_path: Path) -> None:
    env = sandbox(tmp_path)
    text = tmp_path / "notes.gguf"
    text.write_text("not a model\n")
    for given, said in ((str(text), "is not a GGUF model file"), ("nowhere/x.gguf", "no file")):
        done = run(env, "add", given)
        assert done.returncode == 1
        assert done.stderr.startswith("error: ") and said in done.stderr
        assert len(done.stderr.splitlines()) == 1 and "Traceback" not in done.stderr
    assert not Path(env["SLM_CONFIG"]).exists()


def test_a_name_models_lists_is_served_where_it_lies(tmp_path: Path) -> None:
    env = sandbox(tmp_path)
    link = hf_file(tmp_path / "home" / ".cache" / "huggingface" / "hub", "o/r", "r-Q4_K_M.gguf")
    done = run(env, "add", "o/r/r-Q4_K_M.gguf")
    assert done.returncode == 0, done.stderr
    entry = entries(env)["r-q4_k_m"]
    assert entry["model_path"] == str(link)  # the snapshot's link, not a copy
    assert entry["quantization"] == "Q4_K_M"
    listed = json.loads(run(env, "models", "--json").stdout)
    assert [m["served_as"] for m in listed if m["name"] == "o/r/r-Q4_K_M.gguf"] == [["r-q4_k_m"]]
    assert run(env, "check").returncode == 0


def test_the_context_is_capped_to_fit_the_budget_or_said_not_to(tmp_path: Path) -> None:
    trained = 1 << 20  # a KV cache of 1 GiB at the tiny model's shape
    model = tiny_gguf(tmp_path / "long.gguf", context=trained)
    env = sandbox(tmp_path, SLM_MEMORY_BUDGET_MB="256")
    done = run(env, "add", str(model), "--no-reload")
    assert done.returncode == 0, done.stderr
    fields = entries(env)["long"]
    context = fields["context_length"]
    assert context < trained and f"capped from the trained {trained}" in done.stdout
    assert (
        footprint_mb(fields, 256)
        <= 256
        < footprint_mb({**fields, "context_length": 2 * context}, 256)
    )

    tight = sandbox(tmp_path / "tight", SLM_MEMORY_BUDGET_MB="8")
    done = run(tight, "add", str(model), "--no-reload")
    assert done.returncode == 0, done.stderr
    assert entries(tight)["long"]["context_length"] == 2048
    assert "warning:" in done.stdout and "even at context 2048" in done.stdout
