"""The registry schema: every validation rule and the one-line shape of its message."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from slm_server.registry.schema import (
    LLAMACPP_ONLY_FIELDS,
    MLX_ONLY_FIELDS,
    MODEL_TYPES_BY_BACKEND,
    NATIVE_ONLY_FIELDS,
    ConfigError,
    ModelEntry,
    Problem,
    RegistryFile,
    load_registry,
    parse_registry,
)
from slm_server.settings import PROJECT_ROOT
from tests.registry_entries import registry_entry

SOURCE = Path("/registry/models.yaml")
HEAD = f"{SOURCE}: model 'standard' (id 'm1')"

# A valid value for every backend-specific field.
LLAMACPP_VALUES: dict[str, Any] = {
    "chat_template_file": "config/template.jinja",
    "slot_cache": False,
    "temp": 0.7,
    "top_p": 0.9,
    "top_k": 40,
    "min_p": 0.05,
    "presence_penalty": 0.5,
    "repetition_penalty": 1.1,
    "n_predict": 256,
    "ubatch_size": 512,
    "cache_type_k": "q8_0",
    "cache_type_v": "q8_0",
    "cache_ram": 4096,
    "kv_offload": True,
    "flash_attn": "auto",
    "kv_unified": True,
    "swa_full": True,
    "fit": True,
    "cont_batching": True,
    "cache_prompt": True,
    "spec_type": "ngram-simple",
    "spec_draft_n_max": 16,
    "spec_model_path": "models/draft.gguf",
    "verbose": True,
    "mmproj_path": "models/mmproj.gguf",
    "pooling": "mean",
}
MLX_VALUES: dict[str, Any] = {
    "enable_auto_tool_choice": True,
    "tool_call_parser": "qwen3",
    "reasoning_parser": "qwen3",
    "config_name": "flux-dev",
}

# The fields of an entry written in a registry file, that no test here starts.
IN_FILE: dict[str, Any] = {
    "model_path": "models/m1.gguf",
    "default_timeout": 120,
    "quantization": "Q4_1",
}


def llama(**fields: Any) -> dict[str, Any]:
    written = {"id": "m1", "port": 8501, **IN_FILE, **fields}
    return registry_entry(written.pop("id"), written.pop("port"), **written)


def mlx(**fields: Any) -> dict[str, Any]:
    return llama(backend="mlx", model_path="mlx-community/Some-Model-8bit", **fields)


def text_of(models: Any, **top: Any) -> str:
    return yaml.safe_dump({"models": models, **top}, sort_keys=False)


def remote(**fields: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "id": "m1",
        "backend": "remote",
        "url": "http://10.0.0.5:8080/v1",
        "default_timeout": 120,
    }
    raw.update(fields)
    return raw


def parse(models: Any) -> RegistryFile:
    return parse_registry(text_of(models), SOURCE)


def problems_of(text: str, path: Path = SOURCE) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_registry(text, path)
    lines = [str(p) for p in caught.value.problems]
    assert str(caught.value) == "\n".join(lines)
    assert all("\n" not in line for line in lines)
    return lines


def problems(models: Any) -> list[str]:
    return problems_of(text_of(models))


# --- valid entries and defaults -------------------------------------------------------


def test_minimal_entry_gets_every_default() -> None:
    registry = parse({"standard": llama()})
    assert registry.path == SOURCE
    assert registry.warnings == ()
    (spec,) = registry.models
    assert spec.role == "standard"
    assert spec.index == 0
    assert spec.label == "'standard' (id 'm1')"
    entry = spec.entry
    assert entry.id == "m1"
    assert entry.backend == "llamacpp"
    assert entry.port == 8501
    assert entry.model_path == "models/m1.gguf"
    assert entry.default_timeout == 120.0
    assert entry.quantization == "Q4_1"
    assert entry.model_type == "lm"
    assert entry.context_length is None
    assert entry.max_concurrency == 1
    assert entry.host == "127.0.0.1"
    assert entry.enabled is True
    assert entry.supports_function_calling is False
    assert entry.chat_template_kwargs is None
    assert entry.enable_auto_tool_choice is False
    assert entry.tool_call_parser is None
    assert entry.reasoning_parser is None
    assert entry.config_name is None
    assert entry.set_fields() == {
        "id",
        "backend",
        "port",
        "model_path",
        "default_timeout",
        "quantization",
    }


@pytest.mark.parametrize("field", sorted(LLAMACPP_ONLY_FIELDS))
def test_llamacpp_only_fields_default_to_none(field: str) -> None:
    (spec,) = parse({"standard": llama()}).models
    assert getattr(spec.entry, field) is None


def test_field_sets_are_consistent() -> None:
    assert NATIVE_ONLY_FIELDS <= LLAMACPP_ONLY_FIELDS
    assert not MLX_ONLY_FIELDS & LLAMACPP_ONLY_FIELDS
    assert set(LLAMACPP_VALUES) == LLAMACPP_ONLY_FIELDS
    assert set(MLX_VALUES) == MLX_ONLY_FIELDS


def test_every_llamacpp_field_accepted_on_llamacpp() -> None:
    (spec,) = parse({"standard": llama(**LLAMACPP_VALUES)}).models
    for name, value in LLAMACPP_VALUES.items():
        assert getattr(spec.entry, name) == value
    assert spec.entry.set_fields() >= LLAMACPP_ONLY_FIELDS


def test_every_mlx_field_accepted_on_mlx() -> None:
    (spec,) = parse({"chat": mlx(model_type="image-generation", **MLX_VALUES)}).models
    for name, value in MLX_VALUES.items():
        assert getattr(spec.entry, name) == value


def test_entries_are_frozen() -> None:
    (spec,) = parse({"standard": llama()}).models
    with pytest.raises(ValueError, match="frozen"):
        ModelEntry.__setattr__(spec.entry, "port", 1)
    assert spec.entry.port == 8501


def test_int_accepted_for_float_fields() -> None:
    (spec,) = parse({"standard": llama(default_timeout=5, temp=1)}).models
    assert spec.entry.default_timeout == 5.0
    assert spec.entry.temp == 1.0


def test_optional_fields_accept_explicit_null() -> None:
    (spec,) = parse({"standard": llama(context_length=None, temp=None)}).models
    assert spec.entry.context_length is None
    assert "context_length" in spec.entry.set_fields()


def test_chat_template_kwargs_is_a_mapping_on_every_backend() -> None:
    registry = parse(
        {
            "a": llama(chat_template_kwargs={"enable_thinking": False}),
            "b": mlx(port=8502, chat_template_kwargs={"x": [1, 2]}),
        }
    )
    assert [s.entry.chat_template_kwargs for s in registry.models] == [
        {"enable_thinking": False},
        {"x": [1, 2]},
    ]


def test_roles_and_indexes_follow_file_order() -> None:
    registry = parse(
        {
            "zeta": llama(id="z", port=8503),
            "alpha": llama(id="a", port=8501),
            "mid": llama(id="m", port=8502),
        }
    )
    assert [(s.role, s.index, s.entry.id) for s in registry.models] == [
        ("zeta", 0, "z"),
        ("alpha", 1, "a"),
        ("mid", 2, "m"),
    ]


def test_empty_models_mapping_is_an_empty_registry() -> None:
    registry = parse({})
    assert registry.models == ()
    assert registry.enabled == ()


# --- schema problems --------------------------------------------------------------------


def test_unknown_field() -> None:
    assert problems({"standard": llama(bogus=1)}) == [f"{HEAD}: field 'bogus': unknown field"]


@pytest.mark.parametrize(
    "field", ["backend", "port", "model_path", "default_timeout", "quantization"]
)
def test_missing_required_field(field: str) -> None:
    raw = llama()
    del raw[field]
    assert problems({"standard": raw}) == [f"{HEAD}: field '{field}': required field is missing"]


def test_missing_id_names_the_role_only() -> None:
    raw = llama()
    del raw["id"]
    assert problems({"standard": raw}) == [
        f"{SOURCE}: model 'standard': field 'id': required field is missing"
    ]


def test_non_string_id_names_the_role_only() -> None:
    lines = problems({"standard": llama(id=5)})
    assert len(lines) == 1
    assert lines[0].startswith(f"{SOURCE}: model 'standard': field 'id': ")
    assert lines[0].endswith("(got 5)")


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("port", "8501", "Input should be a valid integer (got '8501')"),
        ("port", 8501.5, "Input should be a valid integer (got 8501.5)"),
        ("context_length", "4096", "Input should be a valid integer (got '4096')"),
        ("max_concurrency", "2", "Input should be a valid integer (got '2')"),
        ("default_timeout", "120", "Input should be a valid number (got '120')"),
        ("temp", "0.7", "Input should be a valid number (got '0.7')"),
        ("enabled", "yes please", "Input should be a valid boolean (got 'yes please')"),
        ("enabled", 1, "Input should be a valid boolean (got 1)"),
        ("kv_offload", "true", "Input should be a valid boolean (got 'true')"),
        ("quantization", 8, "Input should be a valid string (got 8)"),
        ("host", 127, "Input should be a valid string (got 127)"),
        ("chat_template_kwargs", [1], "Input should be a valid dictionary (got [1])"),
    ],
)
def test_wrong_type_is_rejected_strictly(field: str, value: Any, expected: str) -> None:
    assert problems({"standard": llama(**{field: value})}) == [
        f"{HEAD}: field '{field}': {expected}"
    ]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("port", 0),
        ("port", 65536),
        ("default_timeout", 0),
        ("default_timeout", -1),
        ("context_length", 0),
        ("max_concurrency", 0),
        ("id", ""),
        ("model_path", ""),
        ("quantization", ""),
        ("host", ""),
        ("temp", -0.1),
        ("top_p", 1.5),
        ("top_p", -0.1),
        ("top_k", -1),
        ("min_p", 1.01),
        ("repetition_penalty", 0),
        ("n_predict", -2),
        ("ubatch_size", 0),
        ("ubatch_size", 4096),
        ("cache_ram", -2),
        ("spec_draft_n_max", 0),
    ],
)
def test_out_of_range_value(field: str, value: Any) -> None:
    lines = problems({"standard": llama(**{field: value})})
    assert len(lines) == 1
    label = "'standard' (id '')" if field == "id" else "'standard' (id 'm1')"
    assert lines[0].startswith(f"{SOURCE}: model {label}: field '{field}': ")
    assert lines[0].endswith(f"(got {value!r})")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("port", 1),
        ("port", 65535),
        ("n_predict", -1),
        ("cache_ram", -1),
        ("cache_ram", 0),
        ("ubatch_size", 2048),
        ("top_p", 0.0),
        ("top_p", 1.0),
        ("min_p", 0.0),
        ("temp", 0.0),
        ("top_k", 0),
        ("presence_penalty", -2.0),
    ],
)
def test_boundary_values_are_accepted(field: str, value: Any) -> None:
    (spec,) = parse({"standard": llama(**{field: value})}).models
    assert getattr(spec.entry, field) == value


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("backend", "vllm"),
        ("model_type", "chat"),
        ("cache_type_k", "q3_k"),
        ("cache_type_v", "int8"),
        ("pooling", "max"),
    ],
)
def test_value_outside_its_choices(field: str, value: str) -> None:
    lines = problems({"standard": llama(**{field: value})})
    assert len(lines) == 1
    assert lines[0].startswith(f"{HEAD}: field '{field}': Input should be ")
    assert lines[0].endswith(f"(got '{value}')")


def test_bad_flash_attn_is_one_problem_naming_the_field() -> None:
    lines = problems({"standard": llama(flash_attn="sometimes")})
    assert len(lines) == 1
    assert lines[0].startswith(f"{HEAD}: field 'flash_attn': ")


def test_entry_that_is_not_a_mapping() -> None:
    assert problems({"standard": "just a string"}) == [
        f"{SOURCE}: model 'standard': an entry must be a mapping of fields"
    ]


# --- backend applicability ----------------------------------------------------------------


@pytest.mark.parametrize("field", sorted(MLX_ONLY_FIELDS - {"config_name"}))
def test_mlx_only_field_on_llamacpp(field: str) -> None:
    assert problems({"standard": llama(**{field: MLX_VALUES[field]})}) == [
        f"{HEAD}: field '{field}': applies to backend mlx only"
    ]


def test_config_name_on_llamacpp_is_wrong_twice() -> None:
    assert problems({"standard": llama(config_name="flux-dev")}) == [
        f"{HEAD}: field 'config_name': applies to backend mlx only",
        f"{HEAD}: field 'config_name': applies to model_type image-generation or image-edit only",
    ]


def test_config_name_on_an_mlx_chat_model_is_rejected() -> None:
    assert problems({"standard": mlx(config_name="flux-dev")}) == [
        f"{HEAD}: field 'config_name': applies to model_type image-generation or image-edit only"
    ]


def test_duplicate_role_keys_are_rejected() -> None:
    text = "models:\n  a:\n    id: x\n  a:\n    id: y\n"
    assert problems_of(text) == [f"{SOURCE}: not valid YAML at line 4: duplicate key 'a'"]


def test_mlx_only_field_set_to_its_default_still_counts() -> None:
    assert problems({"standard": llama(enable_auto_tool_choice=False)}) == [
        f"{HEAD}: field 'enable_auto_tool_choice': applies to backend mlx only"
    ]


@pytest.mark.parametrize("field", sorted(LLAMACPP_ONLY_FIELDS))
def test_llamacpp_only_field_on_mlx(field: str) -> None:
    assert problems({"standard": mlx(**{field: LLAMACPP_VALUES[field]})}) == [
        f"{HEAD}: field '{field}': applies to backend llamacpp only"
    ]


def test_mlx_rerank_takes_neither_mlx_nor_llamacpp_fields() -> None:
    raw = llama(backend="mlx-rerank", model_type="rerank", tool_call_parser="x", temp=0.5)
    assert problems({"standard": raw}) == [
        f"{HEAD}: field 'tool_call_parser': applies to backend mlx only",
        f"{HEAD}: field 'temp': applies to backend llamacpp only",
    ]


def test_several_misplaced_fields_are_reported_sorted() -> None:
    raw = mlx(verbose=True, cache_ram=1, temp=0.1)
    assert problems({"standard": raw}) == [
        f"{HEAD}: field '{name}': applies to backend llamacpp only"
        for name in ("cache_ram", "temp", "verbose")
    ]


@pytest.mark.parametrize(
    ("backend", "model_type", "served"),
    [
        ("llamacpp", "whisper", "embeddings, lm, multimodal, rerank"),
        ("llamacpp", "image-generation", "embeddings, lm, multimodal, rerank"),
        ("mlx", "rerank", "embeddings, image-edit, image-generation, lm, multimodal, whisper"),
        ("mlx-rerank", "lm", "rerank"),
    ],
)
def test_model_type_not_served_by_backend(backend: str, model_type: str, served: str) -> None:
    raw = llama(backend=backend, model_type=model_type)
    assert problems({"standard": raw}) == [
        f"{HEAD}: field 'model_type': backend {backend} does not serve '{model_type}' "
        f"(it serves {served})"
    ]


@pytest.mark.parametrize(
    ("backend", "model_type"),
    [(b, t) for b, types in sorted(MODEL_TYPES_BY_BACKEND.items()) for t in sorted(types)],
)
def test_every_served_model_type_is_accepted(backend: str, model_type: str) -> None:
    extra: dict[str, Any] = {}
    if backend == "llamacpp" and model_type == "multimodal":
        extra["mmproj_path"] = "models/mmproj.gguf"
    raw = llama(backend=backend, model_type=model_type, **extra)
    if backend == "remote":
        raw = remote(model_type=model_type)
    (spec,) = parse({"standard": raw}).models
    assert (spec.entry.backend, spec.entry.model_type) == (backend, model_type)


def test_multimodal_llamacpp_needs_mmproj_path() -> None:
    assert problems({"standard": llama(model_type="multimodal")}) == [
        f"{HEAD}: field 'mmproj_path': required when model_type is multimodal"
    ]


def test_multimodal_mlx_needs_no_mmproj_path() -> None:
    (spec,) = parse({"standard": mlx(model_type="multimodal")}).models
    assert spec.entry.mmproj_path is None


# --- ports and ids --------------------------------------------------------------------------


def test_duplicate_port_reports_both_entries() -> None:
    lines = problems({"a": llama(id="ida"), "b": llama(id="idb")})
    assert lines == [
        f"{SOURCE}: model 'a' (id 'ida'): field 'port': port 8501 is also used by 'b'",
        f"{SOURCE}: model 'b' (id 'idb'): field 'port': port 8501 is also used by 'a'",
    ]


def test_port_shared_by_three_lists_the_others() -> None:
    lines = problems(
        {"a": llama(id="x"), "b": llama(id="y"), "c": llama(id="z"), "d": llama(port=9)}
    )
    assert lines == [
        f"{SOURCE}: model 'a' (id 'x'): field 'port': port 8501 is also used by 'b', 'c'",
        f"{SOURCE}: model 'b' (id 'y'): field 'port': port 8501 is also used by 'a', 'c'",
        f"{SOURCE}: model 'c' (id 'z'): field 'port': port 8501 is also used by 'a', 'b'",
    ]


def test_disabled_entry_may_share_a_port() -> None:
    registry = parse({"a": llama(id="ida"), "spare": llama(id="idb", enabled=False)})
    assert [s.role for s in registry.models] == ["a", "spare"]
    assert [s.role for s in registry.enabled] == ["a"]
    assert registry.warnings == ()


def test_two_disabled_entries_may_share_a_port() -> None:
    registry = parse({"a": llama(id="x", enabled=False), "b": llama(id="y", enabled=False)})
    assert registry.enabled == ()
    assert len(registry.models) == 2


def test_duplicate_enabled_ids_are_a_warning_not_an_error() -> None:
    registry = parse({"a": llama(), "b": llama(port=8502)})
    assert len(registry.enabled) == 2
    assert [str(w) for w in registry.warnings] == [
        f"warning: {SOURCE}: model '{role}' (id 'm1'): field 'id': "
        "id is used by more than one enabled entry; requests for it get 409"
        for role in ("a", "b")
    ]
    assert all(w.severity == "warning" for w in registry.warnings)


def test_duplicate_id_with_a_disabled_entry_is_no_warning() -> None:
    registry = parse({"a": llama(), "b": llama(port=8502, enabled=False)})
    assert registry.warnings == ()


# --- file structure -------------------------------------------------------------------------


def test_invalid_yaml_reports_the_line() -> None:
    text = "models:\n  standard:\n    id: m1\n   port: 1\n"
    [line] = problems_of(text)
    assert line.startswith(f"{SOURCE}: not valid YAML at line 4: ")


def test_invalid_yaml_unclosed_bracket() -> None:
    lines = problems_of("models:\n  standard: [\n")
    assert len(lines) == 1
    assert lines[0].startswith(f"{SOURCE}: not valid YAML at line ")


@pytest.mark.parametrize(
    "text", ["", "# only a comment\n", "other: 1\n", "- a\n- b\n", "just text\n"]
)
def test_missing_top_level_models(text: str) -> None:
    assert problems_of(text) == [
        f"{SOURCE}: field 'models': the file must have a top-level 'models' mapping"
    ]


@pytest.mark.parametrize("text", ["models:\n", "models: 3\n", "models: text\n"])
def test_models_of_the_wrong_shape(text: str) -> None:
    assert problems_of(text) == [f"{SOURCE}: field 'models': must map role names to model entries"]


def test_unknown_top_level_key() -> None:
    text = text_of({"standard": llama()}, extra=1)
    assert problems_of(text) == [f"{SOURCE}: field 'extra': unknown top-level key"]


def test_every_unknown_top_level_key_is_reported() -> None:
    text = text_of({"standard": llama()}, extra=1, other=2)
    assert problems_of(text) == [
        f"{SOURCE}: field 'extra': unknown top-level key",
        f"{SOURCE}: field 'other': unknown top-level key",
    ]


def test_list_form_uses_the_id_as_role() -> None:
    registry = parse([llama(id="first"), llama(id="second", port=8502)])
    assert [(s.role, s.index, s.label) for s in registry.models] == [
        ("first", 0, "'first' (id 'first')"),
        ("second", 1, "'second' (id 'second')"),
    ]


def test_list_form_entry_without_id_is_named_by_position() -> None:
    raw = llama()
    del raw["id"]
    assert problems([llama(port=8502), raw]) == [
        f"{SOURCE}: model '#1': field 'id': required field is missing"
    ]


def test_list_form_duplicate_ports() -> None:
    assert problems([llama(id="a"), llama(id="b")]) == [
        f"{SOURCE}: model 'a' (id 'a'): field 'port': port 8501 is also used by 'b'",
        f"{SOURCE}: model 'b' (id 'b'): field 'port': port 8501 is also used by 'a'",
    ]


def test_several_problems_are_reported_at_once() -> None:
    models = {
        "unknown": llama(id="u", port=8601, bogus=True),
        "typed": llama(id="t", port="8602"),
        "misplaced": llama(id="m", port=8603, tool_call_parser="qwen3"),
        "missing": {"id": "x", "backend": "llamacpp", "port": 8604},
        "dup1": llama(id="d1", port=8605),
        "dup2": llama(id="d2", port=8605),
        "fine": llama(id="f", port=8606),
    }
    lines = problems(models)
    assert lines == [
        f"{SOURCE}: model 'unknown' (id 'u'): field 'bogus': unknown field",
        f"{SOURCE}: model 'typed' (id 't'): field 'port': "
        "Input should be a valid integer (got '8602')",
        f"{SOURCE}: model 'misplaced' (id 'm'): field 'tool_call_parser': "
        "applies to backend mlx only",
        f"{SOURCE}: model 'missing' (id 'x'): field 'model_path': required field is missing",
        f"{SOURCE}: model 'missing' (id 'x'): field 'default_timeout': required field is missing",
        f"{SOURCE}: model 'missing' (id 'x'): field 'quantization': required field is missing",
        f"{SOURCE}: model 'dup1' (id 'd1'): field 'port': port 8605 is also used by 'dup2'",
        f"{SOURCE}: model 'dup2' (id 'd2'): field 'port': port 8605 is also used by 'dup1'",
    ]


def test_an_invalid_entry_still_has_its_port_and_alias_clashes_reported() -> None:
    """Fixing a registry takes one run of ``check``, not one per problem: an entry with a
    bad field still takes part in the cross-entry checks, with the fields that are valid
    on their own (its id, port, replicas and aliases)."""
    models = {
        "unknown": llama(id="u", port=8601, bogus=True),
        "clash": llama(id="c", port=8601),
        "missing": {
            "id": "x",
            "backend": "llamacpp",
            "port": 8610,
            "replicas": 2,
            "aliases": ["c"],
        },
        "after": llama(id="a", port=8611, context_length=-1, aliases=["u"]),
        "badport": llama(id="b", port="8601", bogus=1),
    }
    lines = problems(models)
    assert lines == [
        f"{SOURCE}: model 'unknown' (id 'u'): field 'bogus': unknown field",
        f"{SOURCE}: model 'missing' (id 'x'): field 'model_path': required field is missing",
        f"{SOURCE}: model 'missing' (id 'x'): field 'default_timeout': required field is missing",
        f"{SOURCE}: model 'missing' (id 'x'): field 'quantization': required field is missing",
        f"{SOURCE}: model 'after' (id 'a'): field 'context_length': "
        "Input should be greater than or equal to 1 (got -1)",
        f"{SOURCE}: model 'badport' (id 'b'): field 'bogus': unknown field",
        f"{SOURCE}: model 'badport' (id 'b'): field 'port': "
        "Input should be a valid integer (got '8601')",
        f"{SOURCE}: model 'unknown' (id 'u'): field 'port': port 8601 is also used by 'clash'",
        f"{SOURCE}: model 'clash' (id 'c'): field 'port': port 8601 is also used by 'unknown'",
        f"{SOURCE}: model 'missing' (id 'x'): field 'port': "
        "port 8611 (replica 2 of 2) is also used by 'after'",
        f"{SOURCE}: model 'after' (id 'a'): field 'port': port 8611 is also used by 'missing.2'",
        f"{SOURCE}: model 'missing' (id 'x'): field 'aliases[0]': "
        f"'c' is also the id of model 'clash' (id 'c'); a name may lead to one model only",
        f"{SOURCE}: model 'after' (id 'a'): field 'aliases[0]': "
        f"'u' is also the id of model 'unknown' (id 'u'); a name may lead to one model only",
    ]


def test_problem_rendering() -> None:
    assert str(Problem("f.yaml", None, None, "boom")) == "f.yaml: boom"
    assert str(Problem("f.yaml", "'r'", None, "boom")) == "f.yaml: model 'r': boom"
    assert str(Problem("f.yaml", None, "port", "boom")) == "f.yaml: field 'port': boom"
    assert (
        str(Problem("f.yaml", "'r'", "port", "boom", severity="warning"))
        == "warning: f.yaml: model 'r': field 'port': boom"
    )


# --- load_registry ------------------------------------------------------------------------


def test_load_registry_reads_the_file(tmp_path: Path) -> None:
    path = tmp_path / "models.yaml"
    path.write_text(text_of({"standard": llama()}), encoding="utf-8")
    registry = load_registry(path)
    assert registry.path == path
    assert [s.entry.id for s in registry.models] == ["m1"]


def test_load_registry_problems_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "models.yaml"
    path.write_text(text_of({"standard": llama(bogus=1)}), encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_registry(path)
    assert [str(p) for p in caught.value.problems] == [
        f"{path}: model 'standard' (id 'm1'): field 'bogus': unknown field"
    ]


def test_load_registry_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "models.yaml"
    with pytest.raises(ConfigError) as caught:
        load_registry(path)
    assert [str(p) for p in caught.value.problems] == [f"{path}: file not found"]


def test_load_registry_missing_file_hints_at_the_example(tmp_path: Path) -> None:
    path = tmp_path / "models.yaml"
    (tmp_path / "models.yaml.example").write_text("models: {}\n", encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_registry(path)
    assert [str(p) for p in caught.value.problems] == [
        f"{path}: file not found "
        "(copy models.yaml.example to models.yaml to start from the defaults)"
    ]


def test_load_registry_on_a_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_registry(tmp_path)
    (problem,) = caught.value.problems
    assert str(problem).startswith(f"{tmp_path}: cannot read: ")


def test_shipped_example_registry_is_valid() -> None:
    registry = load_registry(PROJECT_ROOT / "config" / "models.yaml.example")
    assert registry.enabled
    assert registry.warnings == ()
    assert all(isinstance(s.entry, ModelEntry) for s in registry.models)


# --- replicas and routing ---------------------------------------------------------------


def test_replicas_expand_into_one_spec_each_on_consecutive_ports() -> None:
    registry = parse({"chat": llama(replicas=3), "other": llama(id="o", port=8504)})
    assert [(s.role, s.replica, s.entry.port) for s in registry.models] == [
        ("chat", 1, 8501),
        ("chat.2", 2, 8502),
        ("chat.3", 3, 8503),
        ("other", 1, 8504),
    ]
    assert {s.index for s in registry.models[:3]} == {0}
    assert {s.base_role for s in registry.models[:3]} == {"chat"}
    assert registry.warnings == ()  # one entry's replicas share its id without a 409


def test_one_replica_is_the_entry_unchanged() -> None:
    (spec,) = parse({"chat": llama()}).models
    assert (spec.role, spec.replica, spec.entry.replicas) == ("chat", 1, 1)
    assert spec.entry.routing == "least_outstanding"
    assert spec.entry.affinity_threshold == 2


def test_replica_port_overlapping_another_entry_is_refused() -> None:
    lines = problems({"chat": llama(replicas=3), "other": llama(id="o", port=8503)})
    assert lines == [
        f"{SOURCE}: model 'chat' (id 'm1'): field 'port': port 8503 (replica 3 of 3) "
        "is also used by 'other'",
        f"{SOURCE}: model 'other' (id 'o'): field 'port': port 8503 is also used by 'chat.3'",
    ]


def test_replicas_of_two_entries_overlapping_are_refused() -> None:
    lines = problems({"a": llama(replicas=2), "b": llama(id="b", port=8502, replicas=2)})
    assert lines == [
        f"{SOURCE}: model 'a' (id 'm1'): field 'port': port 8502 (replica 2 of 2) "
        "is also used by 'b'",
        f"{SOURCE}: model 'b' (id 'b'): field 'port': port 8502 is also used by 'a.2'",
    ]


def test_disabled_entry_replicas_may_overlap() -> None:
    registry = parse({"a": llama(replicas=2), "b": llama(id="b", port=8502, enabled=False)})
    assert [s.role for s in registry.enabled] == ["a", "a.2"]


@pytest.mark.parametrize("count", [0, 17, -1])
def test_replicas_out_of_bounds(count: int) -> None:
    (line,) = problems({"chat": llama(replicas=count)})
    assert line.startswith(f"{SOURCE}: model 'chat' (id 'm1'): field 'replicas': ")


def test_replicas_past_the_last_port_are_refused() -> None:
    (line,) = problems({"chat": llama(port=65534, replicas=3)})
    assert line == (
        f"{SOURCE}: model 'chat' (id 'm1'): field 'replicas': ports 65534..65536 pass 65535"
    )


def test_replicas_on_demand_are_refused() -> None:
    (line,) = problems({"chat": llama(replicas=2, load="on_demand")})
    assert line == (
        f"{SOURCE}: model 'chat' (id 'm1'): field 'replicas': an on_demand model runs one "
        "process; use load: always for replicas"
    )


def test_replica_role_taken_by_another_entry_is_refused() -> None:
    lines = problems({"chat": llama(replicas=2), "chat.2": llama(id="x", port=8600)})
    assert lines == [
        f"{SOURCE}: model 'chat' (id 'm1'): field 'replicas': replica 2 would be named "
        "'chat.2', which is the role of another entry"
    ]


def test_routing_values() -> None:
    (spec,) = parse({"chat": llama(routing="prefix_affinity", affinity_threshold=0)}).models
    assert (spec.entry.routing, spec.entry.affinity_threshold) == ("prefix_affinity", 0)
    (spec,) = parse({"chat": llama(routing="round_robin")}).models
    assert spec.entry.routing == "round_robin"
    (line,) = problems({"chat": llama(routing="random")})
    assert "field 'routing'" in line
    (line,) = problems({"chat": llama(routing="prefix_affinity", affinity_threshold=-1)})
    assert "field 'affinity_threshold'" in line


def test_affinity_threshold_needs_prefix_affinity() -> None:
    (line,) = problems({"chat": llama(affinity_threshold=3)})
    assert line == (
        f"{SOURCE}: model 'chat' (id 'm1'): field 'affinity_threshold': applies to "
        "routing: prefix_affinity only"
    )


def test_the_example_s_commented_replicas_entry_is_valid() -> None:
    text = (PROJECT_ROOT / "config" / "models.yaml.example").read_text()
    lines = text.splitlines()
    start = lines.index("  # chat-pool:")
    block = []
    for line in lines[start:]:
        if line.strip() == "#":
            break
        block.append(line.replace("  # ", "  ", 1))
    registry = parse_registry("models:\n" + "\n".join(block) + "\n", SOURCE)
    assert [(s.role, s.entry.port) for s in registry.models] == [
        ("chat-pool", 8531),
        ("chat-pool.2", 8532),
        ("chat-pool.3", 8533),
    ]


# --- remote entries and replica_of ------------------------------------------------------


def test_a_remote_needs_no_port_model_path_or_quantization() -> None:
    (spec,) = parse({"standard": remote(api_key_env="GPU_BOX_KEY", remote_model="qwen3")}).models
    entry = spec.entry
    assert (entry.remote, entry.port, entry.origin) == (True, 8080, "http://10.0.0.5:8080")
    assert (entry.path_prefix, entry.upstream_model) == ("", "qwen3")
    assert entry.base_url == "http://10.0.0.5:8080"


def test_a_remote_url_may_have_a_prefix_and_https() -> None:
    (spec,) = parse({"standard": remote(url="https://api.example.com/openai/v1")}).models
    entry = spec.entry
    assert (entry.port, entry.origin) == (443, "https://api.example.com")
    assert (entry.path_prefix, entry.upstream_model) == ("/openai", "m1")


@pytest.mark.parametrize(
    "url", ["10.0.0.5:8080/v1", "ftp://h/v1", "http://h:8080", "http://h/v2", "http://h/v1?x=1"]
)
def test_a_remote_url_must_be_an_openai_base_url(url: str) -> None:
    (line,) = problems({"standard": remote(url=url)})
    assert line.startswith(f"{HEAD}: field 'url': String should match pattern")


def test_a_remote_without_url_is_refused() -> None:
    raw = remote()
    del raw["url"]
    assert problems({"standard": raw}) == [
        f"{HEAD}: field 'url': required for backend remote (e.g. http://host:8080/v1)"
    ]


def test_fields_of_a_started_process_are_refused_on_a_remote() -> None:
    raw = remote(port=8501, model_path="models/m.gguf", temp=0.5, load="on_demand")
    lines = problems({"standard": raw})
    local = (
        "does not apply to backend remote (nothing is started for it; "
        "its host and port are the url's)"
    )
    assert lines == [
        f"{HEAD}: field 'model_path': {local}",
        f"{HEAD}: field 'port': {local}",
        f"{HEAD}: field 'load': a remote is never loaded or unloaded",
        f"{HEAD}: field 'temp': applies to backend llamacpp only",
    ]


def test_remote_fields_are_refused_on_a_local_entry() -> None:
    assert problems({"standard": llama(url="http://h/v1", api_key_env="K")}) == [
        f"{HEAD}: field 'api_key_env': applies to backend remote only",
        f"{HEAD}: field 'url': applies to backend remote only",
    ]


def test_api_key_env_is_a_variable_name_never_a_key() -> None:
    (line,) = problems({"standard": remote(api_key_env="sk-live abc")})
    assert line.startswith(f"{HEAD}: field 'api_key_env': String should match pattern")


def test_a_remote_is_one_server() -> None:
    assert problems({"standard": remote(replicas=2)}) == [
        f"{HEAD}: field 'replicas': a remote is one server; "
        "list each other one as an entry with replica_of"
    ]


def test_remotes_ports_collide_with_nothing_local() -> None:
    registry = parse({"standard": llama(port=8080), "far": remote(id="m2")})
    assert [s.entry.port for s in registry.models] == [8080, 8080]


def test_replica_of_makes_a_remote_one_more_replica_of_a_local_entry() -> None:
    registry = parse(
        {
            "far": remote(replica_of="standard"),
            "standard": llama(replicas=2, routing="prefix_affinity"),
        }
    )
    assert registry.warnings == ()
    standard, second, far = registry.models
    assert [s.role for s in registry.models] == ["standard", "standard.2", "far"]
    assert (far.index, far.replica, far.joins, far.base_role) == (
        standard.index,
        3,
        "standard",
        "far",
    )
    assert second.index == standard.index


def test_two_entries_sharing_an_id_without_replica_of_stay_ambiguous() -> None:
    registry = parse({"standard": llama(), "far": remote()})
    assert [w.field for w in registry.warnings] == ["id", "id"]


def test_replica_of_must_name_an_entry_of_the_same_model() -> None:
    lines = problems(
        {
            "standard": llama(),
            "far": remote(
                id="other",
                model_type="embeddings",
                routing="prefix_affinity",
                replica_of="standard",
            ),
            "lost": remote(id="m3", replica_of="nowhere"),
        }
    )
    far = f"{SOURCE}: model 'far' (id 'other')"
    assert lines == [
        f"{far}: field 'id': must be 'm1', the id of 'standard', whose replicas it joins",
        f"{far}: field 'model_type': must be that of 'standard' ('lm')",
        f"{far}: field 'routing': is set on 'standard', whose replicas it joins",
        f"{SOURCE}: model 'lost' (id 'm3'): field 'replica_of': no entry has the key 'nowhere'",
    ]


def test_replica_of_names_the_entry_itself_not_another_joiner() -> None:
    lines = problems(
        {"standard": llama(), "a": remote(replica_of="standard"), "b": remote(replica_of="a")}
    )
    assert lines == [
        f"{SOURCE}: model 'b' (id 'm1'): field 'replica_of': 'a' itself joins 'standard'; "
        "name 'standard'"
    ]


def test_a_joiner_keyed_like_another_entrys_replica_is_refused() -> None:
    lines = problems({"standard": llama(replicas=2), "standard.2": remote(replica_of="standard")})
    assert lines == [
        f"{HEAD}: field 'replicas': replica 2 would be named 'standard.2', "
        "which is the role of another entry"
    ]


@pytest.mark.parametrize("url", ["http://h:99999/v1", "http://h:0/v1"])
def test_a_remote_url_port_must_be_a_port(url: str) -> None:
    assert problems({"standard": remote(url=url)}) == [
        f"{HEAD}: field 'url': Value error, the port must be 1-65535 (got {url!r})"
    ]
