"""Routing by model id and endpoint."""

from __future__ import annotations

from typing import Any, get_args

import pytest

from slm_server.errors import AmbiguousModel, InvalidRequest, ModelNotFound, UnsupportedEndpoint
from slm_server.registry.schema import ModelSpec, ModelType, replica_specs
from slm_server.router.dispatch.lookup import Registry
from tests.registry_entries import model_spec
from tests.shape_rows import MODEL_TYPES, shape


def spec(role: str, model_id: str, port: int, **fields: Any) -> ModelSpec:
    return model_spec(role, model_id, port, index=port, **fields)


CHAT = spec("chat", "chat-model", 8501)
EMBED = spec("embed", "embed-model", 8502, model_type="embeddings")
RERANK = spec("rerank", "rerank-model", 8503, model_type="rerank")
VISION = spec("vision", "vision-model", 8504, model_type="multimodal", mmproj_path="/p")
OFF = spec("off", "off-model", 8505, enabled=False)
WHISPER = spec("asr", "whisper-model", 8506, backend="mlx", model_type="whisper")


@pytest.fixture
def registry() -> Registry:
    return Registry([CHAT, EMBED, RERANK, VISION, OFF, WHISPER])


def test_models_and_enabled(registry: Registry) -> None:
    assert registry.models == (CHAT, EMBED, RERANK, VISION, OFF, WHISPER)
    assert registry.enabled == (CHAT, EMBED, RERANK, VISION, WHISPER)


def test_lookup(registry: Registry) -> None:
    assert registry.lookup("chat-model") is CHAT
    assert registry.lookup("embed-model") is EMBED


def test_lookup_unknown_is_404_listing_known_ids(registry: Registry) -> None:
    with pytest.raises(ModelNotFound) as caught:
        registry.lookup("gpt-4")
    error = caught.value
    assert error.status == 404
    assert error.code == "model_not_found"
    assert error.param == "model"
    assert error.message == (
        "The model 'gpt-4' does not exist or is not enabled (known: chat-model, "
        "embed-model, rerank-model, vision-model, whisper-model)"
    )


def test_lookup_is_case_sensitive(registry: Registry) -> None:
    with pytest.raises(ModelNotFound):
        registry.lookup("CHAT-MODEL")


def test_disabled_entry_is_not_routable(registry: Registry) -> None:
    with pytest.raises(ModelNotFound) as caught:
        registry.lookup("off-model")
    assert "off-model, " not in caught.value.message
    assert caught.value.message.startswith("The model 'off-model' does not exist or is not enabled")


def test_empty_registry_knows_none() -> None:
    with pytest.raises(ModelNotFound) as caught:
        Registry([OFF]).lookup("x")
    assert caught.value.message.endswith("(known: none)")


def test_duplicate_enabled_ids_are_409() -> None:
    first = spec("first", "same", 8601)
    second = spec("second", "same", 8602)
    with pytest.raises(AmbiguousModel) as caught:
        Registry([first, second, CHAT]).lookup("same")
    error = caught.value
    assert error.status == 409
    assert error.code == "ambiguous_model"
    assert error.param == "model"
    assert error.message == (
        "The model id 'same' is used by several enabled entries ('first', 'second'); "
        "give each a unique id in the registry"
    )


def test_duplicate_id_with_disabled_entry_routes_to_the_enabled_one() -> None:
    on = spec("on", "same", 8601)
    off = spec("off", "same", 8602, enabled=False)
    assert Registry([off, on]).lookup("same") is on


def test_other_ids_still_route_next_to_a_duplicate() -> None:
    registry = Registry([spec("a", "same", 8601), spec("b", "same", 8602), CHAT])
    assert registry.lookup("chat-model") is CHAT


@pytest.mark.parametrize(
    ("model_id", "endpoint"),
    [
        ("chat-model", "/v1/chat/completions"),
        ("chat-model", "/v1/completions"),
        ("chat-model", "/v1/responses"),
        ("vision-model", "/v1/chat/completions"),
        ("vision-model", "/v1/responses"),
        ("embed-model", "/v1/embeddings"),
        ("rerank-model", "/v1/rerank"),
        ("whisper-model", "/v1/audio/transcriptions"),
    ],
)
def test_route_allowed(registry: Registry, model_id: str, endpoint: str) -> None:
    assert registry.route(model_id, shape(endpoint)).entry.id == model_id


@pytest.mark.parametrize(
    ("model_id", "model_type", "endpoint", "needs"),
    [
        ("chat-model", "lm", "/v1/rerank", "rerank"),
        ("chat-model", "lm", "/v1/embeddings", "embeddings"),
        ("embed-model", "embeddings", "/v1/chat/completions", "lm or multimodal"),
        ("embed-model", "embeddings", "/v1/rerank", "rerank"),
        ("rerank-model", "rerank", "/v1/embeddings", "embeddings"),
        ("rerank-model", "rerank", "/v1/completions", "lm or multimodal"),
        ("whisper-model", "whisper", "/v1/responses", "lm or multimodal"),
        ("whisper-model", "whisper", "/v1/chat/completions", "lm or multimodal"),
        ("chat-model", "lm", "/v1/audio/transcriptions", "whisper"),
        ("vision-model", "multimodal", "/v1/images/generations", "image-generation"),
        ("embed-model", "embeddings", "/v1/images/edits", "image-edit"),
    ],
)
def test_route_unsupported_endpoint_is_400(
    registry: Registry, model_id: str, model_type: str, endpoint: str, needs: str
) -> None:
    with pytest.raises(UnsupportedEndpoint) as caught:
        registry.route(model_id, shape(endpoint))
    error = caught.value
    assert isinstance(error, InvalidRequest)
    assert error.status == 400
    assert error.code == "unsupported_endpoint"
    assert error.param == "model"
    assert error.message == (
        f"The model '{model_id}' has model_type '{model_type}', which does not serve "
        f"{endpoint} (that needs {needs})"
    )


def test_route_endpoint_matrix(registry: Registry) -> None:
    for endpoint, allowed in MODEL_TYPES.items():
        for s in registry.enabled:
            if s.entry.model_type in allowed:
                assert registry.route(s.entry.id, shape(endpoint)) is s
            else:
                with pytest.raises(UnsupportedEndpoint):
                    registry.route(s.entry.id, shape(endpoint))


def test_route_unlisted_endpoint_only_looks_up(registry: Registry) -> None:
    assert registry.route("whisper-model", None) is WHISPER


def test_every_model_type_has_an_endpoint() -> None:
    served = set().union(*MODEL_TYPES.values())
    assert served == set(get_args(ModelType))


def test_route_unknown_model_is_404_before_endpoint_check(registry: Registry) -> None:
    with pytest.raises(ModelNotFound):
        registry.route("nope", shape("/v1/rerank"))


def test_replicas_of_one_entry_are_one_model() -> None:
    specs = replica_specs(spec("chat", "chat-model", 8601, replicas=3))
    registry = Registry([*specs, EMBED])
    assert registry.lookup("chat-model") is specs[0]
    assert registry.route("chat-model", shape("/v1/chat/completions")) is specs[0]
    assert registry.replicas(specs[0]) == specs
    assert registry.replicas(specs[2]) == specs
    assert registry.replicas(EMBED) == (EMBED,)
    assert registry.entries == (specs[0], EMBED)
    assert [s.entry.port for s in registry.enabled] == [8601, 8602, 8603, 8502]


def test_two_entries_with_replicas_and_one_id_are_ambiguous() -> None:
    first = replica_specs(spec("a", "same", 8601, replicas=2))
    second = replica_specs(spec("b", "same", 8701, replicas=2))
    with pytest.raises(AmbiguousModel, match="'a', 'b'"):
        Registry([*first, *second]).lookup("same")


# --- replaced in place -------------------------------------------------------------------


def test_a_registry_replaced_in_place_routes_by_the_new_models_only() -> None:
    registry = Registry([CHAT, EMBED])
    held = registry  # what a part of the router holds: the same object throughout
    added = spec("vision", "vision-model", 8504, model_type="multimodal", mmproj_path="/p")
    aliased = spec("chat", "chat-model", 8501, aliases=["gpt-4o"])
    registry.replace([aliased, added, OFF])
    assert held.models == (aliased, added, OFF)
    assert held.enabled == (aliased, added)
    assert held.entries == (aliased, added)
    assert held.lookup("gpt-4o") is aliased
    assert held.route("vision-model", shape("/v1/chat/completions")) is added
    with pytest.raises(ModelNotFound) as caught:
        held.lookup("embed-model")
    assert caught.value.message.endswith("(known: chat-model, gpt-4o, vision-model)")


def test_a_spec_routed_before_a_replace_keeps_its_own_replicas_out_of_the_new_groups() -> None:
    """A request in flight holds the spec it was routed with; its entry's position may
    name another entry in the new file, whose replicas are not its own."""
    old = replica_specs(spec("chat", "chat-model", 8601, replicas=2))
    registry = Registry(old)
    new = replica_specs(
        ModelSpec(role="other", index=old[0].index, entry=spec("x", "other", 8701).entry)
    )
    moved = replica_specs(spec("chat", "chat-model", 8611, replicas=3))
    registry.replace([*new, *moved])
    assert registry.replicas(old[0]) == (old[0],)
    assert registry.size(old[1]) == 1
    assert registry.replicas(new[0]) == new
    assert registry.replicas(moved[2]) == moved


# --- aliases -----------------------------------------------------------------------------


def test_an_alias_leads_to_its_entry_and_says_it_is_one() -> None:
    aliased = spec("chat", "chat-model", 8501, aliases=["gpt-4o", {"name": "cold"}])
    registry = Registry([aliased, EMBED])
    assert registry.lookup("gpt-4o") is aliased
    assert registry.route("cold", shape("/v1/chat/completions")) is aliased
    assert registry.alias("gpt-4o") == "gpt-4o"
    assert registry.alias("chat-model") is None
    assert registry.alias("nope") is None


def test_an_alias_serves_only_its_entrys_endpoints() -> None:
    registry = Registry(
        [spec("embed", "embed-model", 8502, model_type="embeddings", aliases=["e"])]
    )
    with pytest.raises(UnsupportedEndpoint):
        registry.route("e", shape("/v1/chat/completions"))


def test_the_404_lists_aliases_among_the_known_names() -> None:
    registry = Registry([spec("chat", "chat-model", 8501, aliases=["gpt-4o"])])
    with pytest.raises(ModelNotFound) as caught:
        registry.lookup("gpt-5")
    assert caught.value.message.endswith("(known: chat-model, gpt-4o)")


def test_a_disabled_entrys_alias_leads_nowhere() -> None:
    registry = Registry([spec("off", "off-model", 8505, enabled=False, aliases=["o"])])
    with pytest.raises(ModelNotFound):
        registry.lookup("o")


def test_an_id_wins_over_an_alias_that_slipped_through() -> None:
    first = spec("a", "a", 8501, aliases=["b"])
    second = spec("b", "b", 8502)
    registry = Registry([first, second])
    assert registry.lookup("b") is second
    assert registry.alias("b") is None
