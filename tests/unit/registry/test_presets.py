"""The registry's ``aliases`` and ``preset`` fields: what is accepted, and every refusal
as one line naming the entry, the field's path and, for a clash, the other entry."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from slm_server.registry.presets import Alias, Preset
from slm_server.registry.schema import ConfigError, RegistryFile, parse_registry
from tests.registry_entries import registry_entry
from tests.unit.registry.test_schema import IN_FILE

SOURCE = Path("/registry/models.yaml")


def llama(model_id: str = "m1", port: int = 8501, **fields: Any) -> dict[str, Any]:
    return registry_entry(model_id, port, **(IN_FILE | fields))


def parse(models: dict[str, Any]) -> RegistryFile:
    return parse_registry(yaml.safe_dump({"models": models}, sort_keys=False), SOURCE)


def problems(models: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse(models)
    return [str(p) for p in caught.value.problems]


def head(role: str = "a", model_id: str = "m1") -> str:
    return f"{SOURCE}: model '{role}' (id '{model_id}')"


# --- accepted ---------------------------------------------------------------------------


def test_no_aliases_and_no_preset_by_default() -> None:
    (spec,) = parse({"a": llama()}).models
    assert spec.entry.aliases == []
    assert spec.entry.alias_names == ()
    assert spec.entry.preset is None


def test_aliases_are_names_or_names_with_a_preset() -> None:
    (spec,) = parse(
        {
            "a": llama(
                aliases=[
                    "gpt-4o-mini",
                    {"name": "m1-nothink", "preset": {"set": {"chat_template_kwargs": {}}}},
                    {"name": "org/m1"},
                ],
                preset={
                    "max_output_tokens": 512,
                    "set": {"temperature": 0.2},
                    "default": {"top_k": 40},
                    "strip": ["logit_bias"],
                },
            )
        }
    ).models
    entry = spec.entry
    assert entry.alias_names == ("gpt-4o-mini", "m1-nothink", "org/m1")
    assert entry.alias_preset("gpt-4o-mini") is None
    assert entry.alias_preset("m1-nothink") == Preset.model_validate(
        {"set": {"chat_template_kwargs": {}}}
    )
    assert entry.alias_preset("nope") is None
    assert entry.aliases[2] == Alias(name="org/m1")
    assert entry.preset is not None
    assert entry.preset.max_output_tokens == 512
    assert entry.preset.set_ == {"temperature": 0.2}
    assert entry.preset.default == {"top_k": 40}
    assert entry.preset.strip == ["logit_bias"]


def test_aliases_of_any_model_type_and_disabled_entries_may_repeat_names() -> None:
    registry = parse(
        {
            "a": llama(aliases=["x"]),
            "e": llama("e1", 8502, model_type="embeddings", aliases=["embed"]),
            "off": llama("off", 8503, enabled=False, aliases=["x", "m1"]),
        }
    )
    assert [s.entry.alias_names for s in registry.models] == [("x",), ("embed",), ("x", "m1")]


# --- refused ----------------------------------------------------------------------------


def test_an_alias_that_is_another_entrys_id_names_both_entries() -> None:
    assert problems({"a": llama(aliases=["m2"]), "b": llama("m2", 8502)}) == [
        f"{head()}: field 'aliases[0]': 'm2' is also the id of model 'b' (id 'm2'); "
        "a name may lead to one model only"
    ]


def test_an_alias_of_a_later_entry_that_is_an_earlier_id_is_found_too() -> None:
    assert problems({"a": llama(), "b": llama("m2", 8502, aliases=["ok", "m1"])}) == [
        f"{head('b', 'm2')}: field 'aliases[1]': 'm1' is also the id of model 'a' (id 'm1'); "
        "a name may lead to one model only"
    ]


def test_two_entries_with_one_alias_the_later_names_the_earlier() -> None:
    assert problems({"a": llama(aliases=["fast"]), "b": llama("m2", 8502, aliases=["fast"])}) == [
        f"{head('b', 'm2')}: field 'aliases[0]': 'fast' is also an alias of model "
        "'a' (id 'm1'); a name may lead to one model only"
    ]


def test_an_alias_that_is_the_entrys_own_id_or_repeated() -> None:
    assert problems({"a": llama(aliases=["m1", "x", "x"])}) == [
        f"{head()}: field 'aliases[0]': 'm1' is the entry's id",
        f"{head()}: field 'aliases[2]': 'x' is listed twice",
    ]


@pytest.mark.parametrize(
    ("aliases", "field", "message"),
    [
        ("fast", "aliases", "Input should be a valid list (got 'fast')"),
        ([5], "aliases[0]", "must be a name, or a mapping of name and preset (got 5)"),
        ([""], "aliases[0].name", "String should have at least 1 character (got '')"),
        ([{"preset": {}}], "aliases[0].name", "required field is missing"),
        ([{"name": "x", "sets": {}}], "aliases[0].sets", "unknown field"),
        ([{"name": "x", "preset": []}], "aliases[0].preset", "must be a mapping (got [])"),
    ],
)
def test_malformed_aliases(aliases: Any, field: str, message: str) -> None:
    assert problems({"a": llama(aliases=aliases)}) == [f"{head()}: field '{field}': {message}"]


@pytest.mark.parametrize(
    ("preset", "field", "message"),
    [
        ({"max_output_tokens": 0}, "preset.max_output_tokens", "greater than or equal to 1"),
        ({"max_output_tokens": "64"}, "preset.max_output_tokens", "valid integer"),
        ({"set": [1]}, "preset.set", "valid dictionary"),
        ({"strip": "seed"}, "preset.strip", "valid list"),
        ({"cap": 5}, "preset.cap", "unknown field"),
        (
            {"set": {"model": "x"}},
            "preset",
            "'set' names 'model', which the router manages "
            "(no preset may touch model, stream, stream_options)",
        ),
        ({"strip": ["stream"]}, "preset", "'strip' names 'stream', which the router manages"),
        ({"default": {"": 1}}, "preset", "'default' names an empty parameter"),
        (
            {"set": {"temperature": 0}, "strip": ["temperature"]},
            "preset",
            "'temperature' is in both 'set' and 'strip'",
        ),
    ],
)
def test_malformed_presets(preset: Any, field: str, message: str) -> None:
    (line,) = problems({"a": llama(preset=preset)})
    assert line.startswith(f"{head()}: field '{field}': ")
    assert message in line


def test_a_preset_needs_a_model_that_generates_text() -> None:
    embed = llama(
        model_type="embeddings",
        preset={"strip": ["x"]},
        aliases=[{"name": "e", "preset": {"max_output_tokens": 4}}],
    )
    message = "applies to model_type lm or multimodal only (chat, completions, Responses)"
    assert problems({"a": embed}) == [
        f"{head()}: field 'aliases[0].preset': {message}",
        f"{head()}: field 'preset': {message}",
    ]


def test_a_joining_replica_leaves_aliases_and_presets_to_the_entry_it_joins() -> None:
    found = problems(
        {
            "a": llama(),
            "b": llama(port=8502, replica_of="a", aliases=["x"], preset={"strip": ["seed"]}),
        }
    )
    assert found == [
        f"{head('b')}: field 'aliases': is set on 'a', whose replicas it joins",
        f"{head('b')}: field 'preset': is set on 'a', whose replicas it joins",
    ]
