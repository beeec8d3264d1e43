"""The pure parts of a reload: the launch key and the difference."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from slm_server.launch.plan import LaunchPlan
from slm_server.registry.schema import ModelEntry, ModelSpec
from slm_server.supervise.core.registry_diff import diff_registries, launch_key
from tests.registry_entries import model_spec


def spec(role: str = "a", **fields: Any) -> ModelSpec:
    values: dict[str, Any] = {"default_timeout": 10, "quantization": "Q4_0", **fields}
    return model_spec(role, role, 8501, **values)


def plan(argv: tuple[str, ...] = ("llama-server", "-m", "/m.gguf"), port: int = 8501) -> LaunchPlan:
    return LaunchPlan(
        role="a",
        model_id="a",
        backend="llamacpp",
        model_type="lm",
        host="127.0.0.1",
        port=port,
        argv=argv,
        log_path=Path("/logs/a.log"),
        base_url=f"http://127.0.0.1:{port}",
        kind="llama-server",
    )


def test_router_only_fields_leave_the_launch_key_alone(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"x")
    argv = ("llama-server", "-m", str(model))
    base = launch_key(spec(), plan(argv))
    routed = spec(default_timeout=99, max_queue=2, aliases=["b"], routing="round_robin")
    assert launch_key(routed, plan(argv)) == base
    assert launch_key(spec(), plan((*argv, "-c", "2048"))) != base  # a launch flag
    assert launch_key(spec(), plan(argv, port=8600)) != base  # another port
    assert launch_key(spec(load="on_demand"), plan(argv)) != base


def test_a_model_file_replaced_in_place_is_a_change(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"x")
    argv = ("llama-server", "-m", str(model))
    before = launch_key(spec(), plan(argv))
    model.write_bytes(b"longer")
    os.utime(model, ns=(1, 2))
    assert launch_key(spec(), plan(argv)) != before


def test_disabled_and_remote_entries_have_keys_of_their_own() -> None:
    assert launch_key(spec(enabled=False), None) == ("disabled",)
    far = ModelSpec(
        role="r",
        index=0,
        entry=ModelEntry.model_validate(
            {"id": "r", "backend": "remote", "url": "http://h:1/v1", "default_timeout": 5}
        ),
    )
    assert launch_key(far, None)[0] == "remote"


def test_the_difference_sorts_every_role_once() -> None:
    old = {"keep": ("k",), "drop": ("d",), "change": ("c",)}
    new = {"add": ("a",), "change": ("c2",), "keep": ("k",)}
    diff = diff_registries(old, new)
    assert diff.added == ("add",)
    assert diff.removed == ("drop",)
    assert diff.replaced == ("change",)
    assert diff.unchanged == ("keep",)
    assert diff.changes
    assert not diff_registries(old, old).changes
