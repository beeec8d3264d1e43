"""What the launcher passes to mlx-openai-server, by what the installed release accepts."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest

from slm_server.launch.mlx_argv import mlx_argv, unsupported_choices
from slm_server.launch.mlx_options import MlxOptions, read_mlx_options
from slm_server.registry.schema import ModelEntry
from tests.registry_entries import model_entry

# Abridged from `mlx-openai-server launch --help` 1.8.1 (click wraps the choice lists).
HELP_1_8 = """
Usage: mlx-openai-server launch [OPTIONS]
Options:
  --model-path TEXT               Path to the model
  --model-type [lm|multimodal|image-generation|image-edit|embeddings|whisper]
  --context-length INTEGER        Context length for language models.
  --served-model-name TEXT        Override the model name returned by
                                  /v1/models.
  --port INTEGER                  Port to run the server on
  --host TEXT                     Host to run the server on
  --queue-timeout INTEGER         Request timeout in seconds
  --queue-size INTEGER            Maximum queue size for pending requests
  --config-name CONFIG_NAME       Config name of the model.
  --no-log-file                   Disable file logging entirely.
  --enable-auto-tool-choice       Enable automatic tool choice.
  --tool-call-parser [functiongemma|gemma4|hermes|qwen3|qwen3_coder|qwen3_moe|
                                  step_35]
                                  Specify tool call parser to use.
  --reasoning-parser [gemma4|harmony|qwen3|qwen3_5|qwen3_moe]
                                  Specify reasoning parser to use.
  --decode-concurrency INTEGER    When a request is batchable, decode that
                                  many requests in parallel.
  --prompt-concurrency INTEGER    Prefill that many prompts in parallel.
  --help                          Show this message and exit.
"""

# An older release that had one concurrency flag and no served-model-name.
HELP_1_0 = """
Options:
  --model-path TEXT
  --model-type [lm|multimodal]
  --port INTEGER
  --host TEXT
  --max-concurrency INTEGER  Maximum number of concurrent requests
  --queue-timeout INTEGER
"""


def mlx_entry(**fields: Any) -> ModelEntry:
    return model_entry(
        "qwen-mlx",
        8511,
        backend="mlx",
        model_path="/models/qwen",
        quantization="8bit",
        default_timeout=120,
        **fields,
    )


def test_parse_reads_flags_and_wrapped_choices() -> None:
    options = MlxOptions.parse(HELP_1_8)
    assert options.supports("--decode-concurrency")
    assert options.supports("--served-model-name")
    assert not options.supports("--max-concurrency")
    assert options.choices["--tool-call-parser"][-1] == "step_35"
    assert "qwen3_coder" in options.choices["--tool-call-parser"]
    assert options.choices["--model-type"][0] == "lm"
    # A single upper-case metavar is not a list of choices.
    assert "--config-name" not in options.choices


def test_argv_for_1_8_maps_concurrency_and_names_the_model() -> None:
    argv = mlx_argv("mlx", mlx_entry(max_concurrency=3), "/m", MlxOptions.parse(HELP_1_8))
    assert argv == [
        "mlx",
        "launch",
        "--model-path",
        "/m",
        "--model-type",
        "lm",
        "--host",
        "127.0.0.1",
        "--port",
        "8511",
        "--served-model-name",
        "qwen-mlx",
        "--decode-concurrency",
        "3",
        "--prompt-concurrency",
        "3",
        "--queue-timeout",
        "125",
        "--no-log-file",
    ]


def test_argv_for_an_older_release_uses_its_concurrency_flag() -> None:
    argv = mlx_argv("mlx", mlx_entry(max_concurrency=2), "/m", MlxOptions.parse(HELP_1_0))
    assert "--max-concurrency" in argv
    assert argv[argv.index("--max-concurrency") + 1] == "2"
    for absent in ("--decode-concurrency", "--served-model-name", "--no-log-file"):
        assert absent not in argv


def test_embeddings_get_no_decode_concurrency_or_context_length() -> None:
    entry = mlx_entry(model_type="embeddings", context_length=4096, max_concurrency=4)
    argv = mlx_argv("mlx", entry, "/m", MlxOptions.parse(HELP_1_8))
    assert "--decode-concurrency" not in argv
    assert "--context-length" not in argv


def test_without_options_only_universal_flags_and_set_fields() -> None:
    argv = mlx_argv("mlx", mlx_entry(reasoning_parser="qwen3"), "/m", None)
    assert argv[-2:] == ["--reasoning-parser", "qwen3"]
    assert "--served-model-name" not in argv


def test_unsupported_parser_names_every_accepted_value() -> None:
    options = MlxOptions.parse(HELP_1_8)
    entry = mlx_entry(tool_call_parser="qwen9", reasoning_parser="qwen3")
    problems = unsupported_choices(entry, options)
    assert [field for field, _ in problems] == ["tool_call_parser"]
    assert "'qwen9'" in problems[0][1]
    assert "qwen3_coder" in problems[0][1]
    assert unsupported_choices(mlx_entry(tool_call_parser="qwen3"), options) == []


def _fake_program(tmp_path: Path, help_text: str) -> tuple[Path, Path]:
    runs = tmp_path / "runs"
    program = tmp_path / "mlx-openai-server"
    program.write_text(f"#!/bin/sh\necho run >> '{runs}'\ncat <<'HELP'\n{help_text}\nHELP\n")
    program.chmod(program.stat().st_mode | stat.S_IXUSR)
    return program, runs


def test_read_runs_the_help_once_and_caches_it(tmp_path: Path) -> None:
    program, runs = _fake_program(tmp_path, HELP_1_8)
    cache = tmp_path / "cache"
    first = read_mlx_options(str(program), cache)
    second = read_mlx_options(str(program), cache)
    assert first is not None
    assert first == second
    assert runs.read_text().count("run") == 1
    # A new install (different size/mtime) is asked again.
    program.write_text(program.read_text().replace("--no-log-file", "--no-log-files"))
    os.utime(program, ns=(0, 1))
    third = read_mlx_options(str(program), cache)
    assert third is not None
    assert not third.supports("--no-log-file")
    assert runs.read_text().count("run") == 2


@pytest.mark.parametrize("script", ["exit 3", "echo 'Usage: something else'"])
def test_unreadable_help_is_none(tmp_path: Path, script: str) -> None:
    program = tmp_path / "mlx-openai-server"
    program.write_text(f"#!/bin/sh\n{script}\n")
    program.chmod(program.stat().st_mode | stat.S_IXUSR)
    assert read_mlx_options(str(program), tmp_path / "cache") is None
    assert read_mlx_options(str(tmp_path / "missing"), tmp_path / "cache") is None
