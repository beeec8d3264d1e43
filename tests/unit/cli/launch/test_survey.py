"""What ``launch`` reads from the gateway's registry file: each name's output cap (the
alias's over the entry's) and the entry's weights, only when the file is the text the
gateway says it routes by."""

from __future__ import annotations

from pathlib import Path

from slm_server.cli.launch.survey import Local, local_facts, read_local, weights_bytes
from slm_server.contracts.applied_registry import version_of
from slm_server.registry.schema import ModelEntry, inspect_registry
from tests.registry_entries import model_entry, registry_entry, registry_yaml


def registry_text(tmp_path: Path) -> str:
    weights = tmp_path / "tiny.gguf"
    weights.write_bytes(b"x" * 1000)
    capped = registry_entry(
        "capped", 9001, model_path=str(weights), preset={"max_output_tokens": 64}
    )
    plain = registry_entry("plain", 9002, model_path=str(weights))
    return "models:\n" + "".join(
        [
            registry_yaml(
                "capped",
                capped,
                "aliases: [same, {name: tighter, preset: {max_output_tokens: 16}}]",
            ),
            registry_yaml(
                "plain",
                plain,
                "aliases: [{name: plain-agent, preset: {max_output_tokens: 256}}]",
            ),
            registry_yaml("off", registry_entry("off", 9003, enabled=False)),
        ]
    )


def test_each_name_gets_the_cap_the_router_would_give_it(tmp_path: Path) -> None:
    registry = inspect_registry(registry_text(tmp_path), tmp_path / "models.yaml")
    assert local_facts(registry) == {
        "capped": Local("capped", 64, 1000),
        "same": Local("capped", 64, 1000),  # an alias without a preset: the entry's cap
        "tighter": Local("capped", 16, 1000),
        "plain": Local("plain", None, 1000),
        "plain-agent": Local("plain", 256, 1000),
    }


def health(path: Path, text: str) -> dict[str, object]:
    return {"status": "ok", "registry": {"version": version_of(text), "path": str(path)}}


def test_the_registry_is_read_when_it_is_the_one_in_force(tmp_path: Path) -> None:
    text = registry_text(tmp_path)
    path = tmp_path / "models.yaml"
    path.write_text(text)
    facts, note = read_local(health(path, text))
    assert note is None and facts is not None and facts["tighter"].cap == 16


def test_a_registry_changed_since_it_was_loaded_is_not_believed(tmp_path: Path) -> None:
    text = registry_text(tmp_path)
    path = tmp_path / "models.yaml"
    path.write_text(text + "\n# edited\n")
    assert read_local(health(path, text)) == (
        None,
        f"its registry {path} has changed since the gateway loaded it",
    )


def test_a_registry_that_cannot_be_read_here_says_so(tmp_path: Path) -> None:
    missing = tmp_path / "elsewhere.yaml"
    facts, note = read_local(health(missing, "models: {}\n"))
    assert facts is None and note is not None
    assert note.startswith(f"its registry {missing} cannot be read here")
    assert read_local({"status": "ok"}) == (
        None,
        "the gateway does not say which registry it routes by",
    )


def test_weights_are_a_file_or_a_directory_and_never_a_remote(tmp_path: Path) -> None:
    (tmp_path / "one.gguf").write_bytes(b"x" * 10)
    assert weights_bytes(model_entry(model_path=str(tmp_path / "one.gguf"))) == 10
    folder = tmp_path / "mlx"
    folder.mkdir()
    (folder / "a.safetensors").write_bytes(b"x" * 7)
    (folder / "config.json").write_bytes(b"x" * 3)
    entry = model_entry(backend="mlx", model_path=str(folder), quantization="4bit")
    assert weights_bytes(entry) == 10
    assert weights_bytes(model_entry(model_path=str(tmp_path / "missing.gguf"))) is None
    remote = ModelEntry.model_validate(
        {"id": "far", "backend": "remote", "url": "http://10.0.0.5:8000/v1", "default_timeout": 60}
    )
    assert weights_bytes(remote) is None
