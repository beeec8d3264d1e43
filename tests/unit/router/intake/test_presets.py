"""Request presets, pure: the precedence of an alias's preset over its entry's, of set
over the client over default, the cap as min(client, cap) on every field a backend
bounds output by, strip, and each API shape's own names."""

from __future__ import annotations

from typing import Any

import pytest

from slm_server.router.intake.presets import (
    SHAPES,
    ApiShape,
    Rule,
    Rules,
    apply_preset,
    cap_binds,
    resolve,
)
from tests.registry_entries import model_entry

CHAT = SHAPES["chat"]
COMPLETIONS = SHAPES["completions"]
RESPONSES = SHAPES["responses"]


def applied(body: dict[str, Any], shape: ApiShape, rules: Rules) -> dict[str, Any]:
    return apply_preset(body, shape, rules)


# --- set, default, strip -------------------------------------------------------------


def test_set_overrides_the_client_and_fills_what_it_left_out() -> None:
    rules = Rules(rules={"temperature": Rule("set", 0.1)})
    assert applied({"temperature": 1.5}, CHAT, rules) == {"temperature": 0.1}
    assert applied({}, CHAT, rules) == {"temperature": 0.1}
    assert applied({"temperature": None}, CHAT, rules) == {"temperature": 0.1}


def test_default_is_used_only_when_the_client_sends_none() -> None:
    rules = Rules(rules={"top_k": Rule("default", 40)})
    assert applied({}, CHAT, rules) == {"top_k": 40}
    assert applied({"top_k": 5}, CHAT, rules) == {"top_k": 5}
    # An explicit null is the client's: the backend's own default (as it always was
    # for the registry's chat_template_kwargs).
    assert applied({"top_k": None}, CHAT, rules) == {"top_k": None}


def test_strip_removes_and_is_no_change_when_absent() -> None:
    rules = Rules(rules={"logit_bias": Rule("strip")})
    assert applied({"logit_bias": {"1": 5}, "x": 1}, CHAT, rules) == {"x": 1}
    body = {"x": 1}
    assert applied(body, CHAT, rules) is body


def test_no_change_is_the_same_body_and_a_change_a_new_one() -> None:
    body: dict[str, Any] = {"top_k": 5, "max_tokens": 10}
    rules = Rules(cap=100, rules={"top_k": Rule("default", 40)})
    assert applied(body, CHAT, rules) is body
    changed = applied(body, CHAT, Rules(cap=5))
    assert changed is not body
    assert body == {"top_k": 5, "max_tokens": 10}
    assert changed == {"top_k": 5, "max_tokens": 5}


def test_registry_values_are_copied_not_shared() -> None:
    value = {"enable_thinking": False}
    out = applied({}, CHAT, Rules(rules={"chat_template_kwargs": Rule("set", value)}))
    out["chat_template_kwargs"]["enable_thinking"] = True
    assert value == {"enable_thinking": False}


# --- the cap -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("asked", "sent"),
    [
        (10, 10),
        (100, 100),
        (101, 100),
        (10**12, 100),
        (0, 0),
        (-1, 100),
        (-7, 100),
        (None, 100),
        (True, 100),
        ("50", 100),
        (50.0, 100),
        ([50], 100),
    ],
)
@pytest.mark.parametrize("name", ["max_tokens", "max_completion_tokens", "n_predict"])
def test_the_cap_is_min_of_client_and_cap_whatever_the_client_sends(
    name: str, asked: Any, sent: int
) -> None:
    assert applied({name: asked}, CHAT, Rules(cap=100)) == {name: sent}


def test_the_cap_applies_when_the_client_sends_none() -> None:
    assert applied({}, CHAT, Rules(cap=64)) == {"max_tokens": 64}
    assert applied({}, COMPLETIONS, Rules(cap=64)) == {"max_tokens": 64}
    assert applied({}, RESPONSES, Rules(cap=64)) == {"max_output_tokens": 64}


def test_every_bound_a_backend_reads_is_capped_so_none_slips_by() -> None:
    """llama-server takes n_predict over max_completion_tokens over max_tokens: a small
    max_tokens beside a huge n_predict must not leave the huge one."""
    body = {"max_tokens": 10, "max_completion_tokens": 5000, "n_predict": -1}
    assert applied(body, CHAT, Rules(cap=100)) == {
        "max_tokens": 10,
        "max_completion_tokens": 100,
        "n_predict": 100,
    }


def test_responses_caps_max_output_tokens_and_the_chat_names_it_would_forward() -> None:
    body = {"max_output_tokens": 9000, "n_predict": 9000}
    assert applied(body, RESPONSES, Rules(cap=100)) == {
        "max_output_tokens": 100,
        "n_predict": 100,
    }


def test_the_cap_holds_over_a_set_of_a_larger_bound() -> None:
    rules = Rules(cap=100, rules={"max_tokens": Rule("set", 5000)})
    assert applied({}, CHAT, rules) == {"max_tokens": 100}


def test_the_cap_holds_for_streams_and_several_choices() -> None:
    body = {"stream": True, "n": 2, "max_tokens": 9000}
    assert applied(body, CHAT, Rules(cap=100)) == {"stream": True, "n": 2, "max_tokens": 100}


# --- each shape's own names ----------------------------------------------------------


def test_responses_names_max_tokens_max_output_tokens() -> None:
    rules = Rules(rules={"max_tokens": Rule("default", 256)})
    assert applied({}, RESPONSES, rules) == {"max_output_tokens": 256}
    assert applied({}, CHAT, rules) == {"max_tokens": 256}


def test_completions_have_no_chat_template() -> None:
    rules = Rules(rules={"chat_template_kwargs": Rule("set", {"enable_thinking": False})})
    body: dict[str, Any] = {"prompt": "x"}
    assert applied(body, COMPLETIONS, rules) is body
    assert applied({}, RESPONSES, rules) == {"chat_template_kwargs": {"enable_thinking": False}}


# --- layers: alias over entry over chat_template_kwargs --------------------------------


def test_the_entry_chat_template_kwargs_is_a_default_as_before() -> None:
    rules = resolve(model_entry(chat_template_kwargs={"enable_thinking": False}), None)
    assert rules == Rules(
        rules={"chat_template_kwargs": Rule("default", {"enable_thinking": False})}
    )


def test_an_entry_without_presets_has_no_rules() -> None:
    assert resolve(model_entry(), None).empty
    assert resolve(model_entry(aliases=["a"]), "a").empty


def test_the_entry_preset_over_its_chat_template_kwargs() -> None:
    e = model_entry(
        chat_template_kwargs={"enable_thinking": True},
        preset={"set": {"chat_template_kwargs": {"enable_thinking": False}}},
    )
    assert applied({"chat_template_kwargs": {"x": 1}}, CHAT, resolve(e, None)) == {
        "chat_template_kwargs": {"enable_thinking": False}
    }


def test_an_alias_preset_wins_parameter_by_parameter_and_its_cap_replaces() -> None:
    e = model_entry(
        preset={
            "max_output_tokens": 1000,
            "set": {"temperature": 0.7, "top_p": 0.9},
            "default": {"top_k": 40},
            "strip": ["seed"],
        },
        aliases=[
            "plain",
            {
                "name": "cold",
                "preset": {
                    "max_output_tokens": 20,
                    "set": {"temperature": 0.0},
                    "strip": ["top_k"],
                    "default": {"seed": 1},
                },
            },
        ],
    )
    body = {"temperature": 1.2, "top_k": 3, "seed": 9, "max_tokens": 500}
    by_id = applied(body, CHAT, resolve(e, None))
    assert by_id == {"temperature": 0.7, "top_p": 0.9, "top_k": 3, "max_tokens": 500}
    assert applied(body, CHAT, resolve(e, "plain")) == by_id
    assert applied(body, CHAT, resolve(e, "cold")) == {
        "temperature": 0.0,
        "top_p": 0.9,  # the entry's, which the alias does not name
        "seed": 9,  # the alias's default gives way to the client
        "max_tokens": 20,
    }


def test_an_alias_with_only_a_cap_keeps_the_entry_rules() -> None:
    e = model_entry(
        preset={"set": {"temperature": 0.3}},
        aliases=[{"name": "short", "preset": {"max_output_tokens": 8}}],
    )
    assert applied({}, CHAT, resolve(e, "short")) == {"temperature": 0.3, "max_tokens": 8}


# --- Anthropic's Messages API ----------------------------------------------------------

MESSAGES = SHAPES["messages"]


def test_messages_caps_max_tokens_and_names_stop_its_own_way() -> None:
    rules = Rules(cap=64, rules={"stop": Rule("set", ["END"])})
    assert applied({"max_tokens": 4096}, MESSAGES, rules) == {
        "max_tokens": 64,
        "stop_sequences": ["END"],
    }
    assert applied({}, MESSAGES, Rules(cap=64)) == {"max_tokens": 64}
    # A chat-only bound forwarded by the translation is capped too.
    assert applied({"max_tokens": 8, "n_predict": 999}, MESSAGES, Rules(cap=64)) == {
        "max_tokens": 8,
        "n_predict": 64,
    }


def test_messages_thinking_stands_for_a_chat_template_kwargs_default() -> None:
    rules = Rules(rules={"chat_template_kwargs": Rule("default", {"enable_thinking": False})})
    thinking = {"thinking": {"type": "enabled", "budget_tokens": 1024}}
    assert applied(thinking, MESSAGES, rules) == thinking
    assert applied({}, MESSAGES, rules) == {"chat_template_kwargs": {"enable_thinking": False}}
    forced = Rules(rules={"chat_template_kwargs": Rule("set", {"enable_thinking": False})})
    assert applied(thinking, MESSAGES, forced) == {
        **thinking,
        "chat_template_kwargs": {"enable_thinking": False},
    }


# --- whether the cap, not the client, bounds the output ------------------------------


def test_cap_binds_when_the_client_s_bound_is_larger_or_none() -> None:
    messages = SHAPES["messages"]
    assert cap_binds({"max_tokens": 32000}, messages, Rules(cap=256))
    assert cap_binds({}, RESPONSES, Rules(cap=256))
    assert cap_binds({"max_output_tokens": None}, RESPONSES, Rules(cap=256))
    assert cap_binds({"max_tokens": -1}, CHAT, Rules(cap=256))
    assert not cap_binds({"max_tokens": 256}, messages, Rules(cap=256))
    assert not cap_binds({"max_tokens": 10}, CHAT, Rules(cap=256))
    # Any bound of the client's within the cap is what ends the answer first.
    assert not cap_binds({"max_tokens": 10, "n_predict": 99999}, CHAT, Rules(cap=256))
    assert not cap_binds({"max_tokens": 32000}, messages, Rules())
