"""The rules by which ``/upstream/`` reaches an engine's paths: how one is written and
matched, and the registry's ``upstream_paths`` field validated by them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from slm_server.registry.schema import ConfigError, parse_registry
from slm_server.registry.upstream_paths import PathRule, is_engine_path, parse_rule
from tests.registry_entries import registry_entry

SOURCE = Path("/registry/models.yaml")


def test_a_rule_is_a_path_with_or_without_a_method_and_a_tail() -> None:
    assert parse_rule("/slots") == PathRule(None, "/slots")
    assert parse_rule("GET /slots") == PathRule("GET", "/slots")
    assert parse_rule("POST /slots/*") == PathRule("POST", "/slots", under=True)
    assert parse_rule("/*") == PathRule(None, "/", under=True)
    assert str(parse_rule("POST /slots/*")) == "POST /slots/*"


def test_a_rule_matches_its_method_and_its_path_or_what_is_under_it() -> None:
    slots = parse_rule("POST /slots/*")
    assert slots.matches("POST", "/slots/0")
    assert not slots.matches("POST", "/slots")  # the tail covers what is under it only
    assert not slots.matches("GET", "/slots/0")
    assert not slots.matches("POST", "/slotsx/0")
    assert parse_rule("/metrics").matches("GET", "/metrics")
    assert parse_rule("/metrics").matches("POST", "/metrics")
    assert not parse_rule("/metrics").matches("GET", "/metrics/x")
    assert parse_rule("/*").matches("GET", "/anything/at/all")
    assert not parse_rule("/*").matches("GET", "/")


@pytest.mark.parametrize(
    "text",
    [
        "slots",  # not absolute
        "FETCH /slots",  # not a method
        "GET /slots?action=save",  # a query
        "/slots/../props",
        "/./slots",
        "//slots",
        "/slots/",
        "/a%2fb",
        "/a b",
        "/a\\b",
        "GET  /x extra",
    ],
)
def test_a_rule_that_is_not_one_says_why(text: str) -> None:
    with pytest.raises(ValueError, match=r"is not a (method|path rule)"):
        parse_rule(text)


def test_engine_paths() -> None:
    assert is_engine_path("/")
    assert is_engine_path("/v1/chat/completions")
    assert is_engine_path("/slots/0")
    assert is_engine_path("/a:b@c,d;e=f")
    for bad in ("", "x", "/..", "/a/./b", "/a//b", "/a/", "/%2e", "/é"):
        assert not is_engine_path(bad), bad


def registry(**fields: Any) -> str:
    entry = registry_entry("m1", 8501, model_path="models/m1.gguf", quantization="Q4_1", **fields)
    return yaml.safe_dump({"models": {"standard": entry}}, sort_keys=False)


def test_the_field_takes_rules_and_refuses_anything_else_naming_the_entry() -> None:
    parsed = parse_registry(registry(upstream_paths=["GET /slots", "POST /slots/*"]), SOURCE)
    assert parsed.models[0].entry.upstream_paths == ["GET /slots", "POST /slots/*"]
    with pytest.raises(ConfigError) as caught:
        parse_registry(registry(upstream_paths=["GET /slots", "/slots/../props"]), SOURCE)
    [line] = [str(p) for p in caught.value.problems]
    assert line.startswith(f"{SOURCE}: model 'standard' (id 'm1'): field 'upstream_paths': ")
    assert "'/slots/../props' is not a path rule" in line


def test_a_remote_is_never_reached_through_upstream() -> None:
    remote = {
        "id": "far",
        "backend": "remote",
        "url": "http://10.0.0.5:8080/v1",
        "default_timeout": 60,
        "upstream_paths": ["/slots"],
    }
    text = yaml.safe_dump({"models": {"far": remote}}, sort_keys=False)
    with pytest.raises(ConfigError) as caught:
        parse_registry(text, SOURCE)
    [line] = [str(p) for p in caught.value.problems]
    assert "field 'upstream_paths': a remote is not reached through /upstream/" in line
