"""The key of a saved slot set (slotcache/key.py), attacked through real launch plans:
every field that can change what a KV cache holds must change the key, and nothing
that cannot (where the server listens, its name, its metrics, the sampling defaults,
the prompt cache's and the saved slots' own settings) may, or a set would be refused
for nothing or, worse, restored into a launch it does not fit."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from slm_server.launch.plan import LaunchPlan, Toolchain, plan_launch
from slm_server.launch.runtime import LlamaRuntime
from slm_server.slotcache.key import KEY_LENGTH, cache_key, components
from slm_server.slotcache.store import slot_file
from tests.registry_entries import model_spec

BUDGET_MB = 8000


class Launch:
    """A model file, a draft model, a projector and a server binary in ``tmp_path``,
    and the key a launch of them gets."""

    def __init__(self, tmp_path: Path) -> None:
        self.root = tmp_path
        self.model = self.file("model.gguf", b"weights")
        self.draft = self.file("draft.gguf", b"draft")
        self.mmproj = self.file("mmproj.gguf", b"projector")
        self.server = self.file("llama-server", b"\x7fELF build 1")
        self.slot_dir = tmp_path / "slots"

    def file(self, name: str, data: bytes) -> Path:
        path = self.root / name
        path.write_bytes(data)
        os.utime(path, ns=(1_700_000_000_000_000_000, 1_700_000_000_000_000_000))
        return path

    def plan(self, slot_dir: Path | None = None, **fields: Any) -> LaunchPlan:
        spec = model_spec(model_path=str(self.model), **fields)
        tools = Toolchain(
            llama=LlamaRuntime("native", str(self.server), "test"),
            llama_error=None,
            mlx_server=None,
        )
        return plan_launch(
            spec,
            tools,
            self.root / "logs",
            "/cfg/models.yaml",
            budget_mb=BUDGET_MB,
            slot_dir=slot_dir or self.slot_dir,
        )

    def key(self, **fields: Any) -> str:
        key = self.plan(**fields).slot_cache_key
        assert key is not None, "this launch keeps no slots"
        return key


@pytest.fixture
def launch(tmp_path: Path) -> Launch:
    return Launch(tmp_path)


CACHE_CHANGES: list[tuple[str, Any]] = [
    ("context_length", 8192),
    ("max_concurrency", 2),
    ("cache_type_k", "q8_0"),
    ("cache_type_v", "q8_0"),
    ("flash_attn", True),
    ("flash_attn", "auto"),
    ("kv_unified", True),
    ("kv_unified", False),
    ("ubatch_size", 256),
    ("chat_template_kwargs", {"enable_thinking": False}),
]


@pytest.mark.parametrize(("field", "value"), CACHE_CHANGES)
def test_a_field_that_changes_the_cache_changes_the_key(
    launch: Launch, field: str, value: Any
) -> None:
    base = launch.key(context_length=4096)
    changed = launch.key(**{"context_length": 4096, field: value})
    assert changed != base, f"{field}={value!r} keeps the key"


def test_each_cache_changing_value_gets_its_own_key(launch: Launch) -> None:
    """Not merely 'different from the default': no two of them collide."""
    keys = [launch.key(**{field: value}) for field, value in CACHE_CHANGES]
    assert len(set(keys)) == len(keys)


NO_CACHE_CHANGE: list[dict[str, Any]] = [
    {"port": 8599},
    {"host": "0.0.0.0"},
    {"id": "another-name"},
    {"temp": 0.2},
    {"top_p": 0.5},
    {"top_k": 7},
    {"min_p": 0.1},
    {"presence_penalty": 1.0},
    {"repetition_penalty": 1.2},
    {"n_predict": 64},
    {"cache_ram": 123},
    {"temp": 0.9, "top_k": 3, "port": 8600, "cache_ram": 0, "id": "x"},
]


@pytest.mark.parametrize("fields", NO_CACHE_CHANGE)
def test_what_cannot_change_a_cache_keeps_the_key(launch: Launch, fields: dict[str, Any]) -> None:
    plan = launch.plan(**fields)
    assert plan.slot_cache_key == launch.key()


def test_the_slot_directory_and_metrics_are_not_in_the_key(launch: Launch, tmp_path: Path) -> None:
    plan = launch.plan()
    elsewhere = launch.plan(slot_dir=tmp_path / "elsewhere")
    assert "--slot-save-path" in plan.argv
    assert "--metrics" in plan.argv
    assert elsewhere.slot_cache_key == plan.slot_cache_key
    seen = components(plan.argv)
    flags = seen["flags"]
    assert isinstance(flags, list)
    assert "--metrics" not in flags
    assert "--slot-save-path" not in flags
    assert str(launch.slot_dir) not in flags
    assert "8501" not in flags and "m1" not in flags


def test_verbose_logging_is_not_in_the_key(launch: Launch) -> None:
    assert launch.key(verbose=True) == launch.key()


def test_the_key_follows_the_model_files_size_and_mtime_not_its_content_alone(
    launch: Launch,
) -> None:
    before = launch.key()
    launch.model.write_bytes(b"weights, requantised")
    os.utime(launch.model, ns=(1_700_000_000_000_000_000, 1_700_000_000_000_000_000))
    resized = launch.key()
    assert resized != before
    os.utime(launch.model, ns=(1_700_000_000_000_000_001, 1_700_000_000_000_000_001))
    touched = launch.key()
    assert touched not in (before, resized)


def test_the_key_follows_the_server_binary(launch: Launch) -> None:
    """A new build may save its state in another format: its own key."""
    before = launch.key()
    launch.server.write_bytes(b"\x7fELF build 2, longer")
    os.utime(launch.server, ns=(1_700_000_000_000_000_000, 1_700_000_000_000_000_000))
    rebuilt = launch.key()
    assert rebuilt != before
    os.utime(launch.server, ns=(1_800_000_000_000_000_000, 1_800_000_000_000_000_000))
    assert launch.key() not in (before, rebuilt)


def test_the_key_follows_the_server_binarys_path(launch: Launch, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    launch.file("other/llama-server", b"\x7fELF build 1")
    before = launch.key()
    launch.server = other / "llama-server"
    assert launch.key() != before


def test_the_key_follows_the_draft_model_and_the_projector(launch: Launch) -> None:
    plain = launch.key()
    with_draft = launch.key(spec_model_path=str(launch.draft))
    with_mmproj = launch.key(mmproj_path=str(launch.mmproj))
    assert len({plain, with_draft, with_mmproj}) == 3
    launch.file("draft.gguf", b"another draft")
    assert launch.key(spec_model_path=str(launch.draft)) != with_draft
    os.utime(launch.mmproj, ns=(1_750_000_000_000_000_000, 1_750_000_000_000_000_000))
    assert launch.key(mmproj_path=str(launch.mmproj)) != with_mmproj


def test_the_same_launch_gets_the_same_key(launch: Launch) -> None:
    assert launch.key(context_length=2048) == launch.key(context_length=2048)


def test_the_key_is_a_plain_file_name(launch: Launch) -> None:
    key = launch.key()
    assert len(key) == KEY_LENGTH
    assert set(key) <= set("0123456789abcdef")
    name = slot_file(key, 3)
    assert name == f"{key}.slot3.bin"
    assert Path(name).name == name and ".." not in name


def test_a_missing_server_or_file_still_gives_a_key() -> None:
    """Nothing on disk (a plan made before the build): a key, of the paths alone."""
    argv = ["/nonexistent/llama-server", "--model", "/nonexistent/m.gguf", "--ctx-size", "1"]
    key = cache_key(argv)
    assert len(key) == KEY_LENGTH
    assert cache_key([*argv[:-1], "2"]) != key
    assert components(argv)["files"] == []


def test_an_ignored_flags_value_is_skipped_with_it() -> None:
    """``--alias --ctx-size``: the alias's value is not read as a flag of its own."""
    argv = ["/bin/llama", "--alias", "--ctx-size", "--parallel", "2"]
    assert components(argv)["flags"] == ["--parallel", "2"]
