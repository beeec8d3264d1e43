"""The preflight's findings on ``/v1/models`` objects made to trip each of them, and the
model ``launch`` chooses when none is named."""

from __future__ import annotations

from typing import Any

import pytest

from slm_server.cli.launch.agents import AGENTS
from slm_server.cli.launch.preflight import Finding, choose_model, preflight
from slm_server.cli.launch.survey import Local, Survey

URL = "http://127.0.0.1:8000"
CLAUDE = AGENTS["claude"]
SMALL = 250 << 20  # bytes of weights: a 270M model at 4 bits
LARGE = 5 << 30


def model(model_id: str, **fields: Any) -> dict[str, Any]:
    """A chat model as ``GET /v1/models`` shows it: ready, 32k context, tools left to a
    template that takes them; ``fields`` replace any of it."""
    shown: dict[str, Any] = {
        "id": model_id,
        "object": "model",
        "model_type": "lm",
        "context_length": 32768,
        "supports_function_calling": False,
        "status": {"state": "ready"},
        "tools": {"mode": "auto", "repair": True, "applies": "native"},
    }
    return {**shown, **fields}


def survey(*models: dict[str, Any], **local: Local) -> Survey:
    """The gateway's list, and the registry's word on each name (every name capped at
    256, with large weights, unless given)."""
    facts = {str(m["id"]): Local(str(m["id"]), 256, LARGE) for m in models}
    return Survey(URL, models=models, local={**facts, **local})


def said(found: list[Finding]) -> list[tuple[str, str]]:
    return [(f.severity, f.text) for f in found]


def test_a_capped_model_that_fits_and_takes_tools_passes_silently() -> None:
    assert preflight(CLAUDE, survey(model("m")), "m") == []


def test_a_gateway_that_does_not_answer_is_an_error() -> None:
    [finding] = preflight(CLAUDE, Survey(URL, down="ConnectError: refused"), "m")
    assert finding.severity == "error"
    assert finding.text.startswith(f"the gateway at {URL} does not answer (ConnectError: refused)")
    assert "./start.sh" in finding.text and "--url" in finding.text


def test_a_refused_key_is_an_error_that_names_the_option() -> None:
    [finding] = preflight(CLAUDE, Survey(URL, key_refused=True), "m")
    assert finding.severity == "error"
    assert "refused the API key (401)" in finding.text and "--api-key" in finding.text


def test_an_unknown_model_is_an_error_listing_the_chat_models() -> None:
    embed = model("embed", model_type="embeddings")
    [finding] = preflight(CLAUDE, survey(model("a"), embed, model("b")), "nope")
    assert finding == Finding(
        "error", "the gateway serves no model named 'nope'; its chat models: a, b"
    )


def test_a_model_that_is_not_for_chat_is_an_error() -> None:
    [finding] = preflight(
        CLAUDE, survey(model("a"), model("embed", model_type="embeddings")), "embed"
    )
    assert finding == Finding(
        "error", "embed is not a chat model (model_type embeddings): Claude Code needs one of: a"
    )


@pytest.mark.parametrize("state", ["abandoned", "failed", "stopped"])
def test_a_backend_that_is_gone_is_an_error(state: str) -> None:
    [finding] = preflight(CLAUDE, survey(model("m", status={"state": state})), "m")
    assert finding.severity == "error"
    assert finding.text.startswith(f"m's backend is {state}: the gateway refuses its requests")


def test_a_lookup_the_gateway_refused_is_an_error() -> None:
    found = Survey(URL, refused={"m": "GET /v1/models/m answered 409: two entries share it"})
    assert said(preflight(CLAUDE, found, "m")) == [
        ("error", "GET /v1/models/m answered 409: two entries share it")
    ]


def test_no_chat_model_to_choose_is_an_error() -> None:
    [finding] = preflight(CLAUDE, survey(model("e", model_type="embeddings")), None)
    assert finding.severity == "error" and "serves no chat model" in finding.text


def test_a_context_shorter_than_the_agents_prompt_is_a_warning() -> None:
    [finding] = preflight(CLAUDE, survey(model("m", context_length=4096)), "m")
    assert finding.severity == "warning"
    assert finding.text == (
        "m's context of 4,096 tokens is shorter than Claude Code's prompt (about 15,000 "
        "tokens of system prompt and tools): its requests will be refused (400) unless the "
        "prompt is cut down; give the entry a longer context_length (docs/agents.md)"
    )


def test_each_agent_is_held_to_its_own_prompt() -> None:
    # 10,000 tokens hold opencode's prompt (about 9,500) but not Codex CLI's (11,000).
    shown = survey(model("m", context_length=10_000))
    assert preflight(AGENTS["opencode"], shown, "m") == []
    [finding] = preflight(AGENTS["codex"], shown, "m")
    assert "Codex CLI's prompt (about 11,000 tokens" in finding.text


def test_an_unknown_context_is_a_note() -> None:
    [finding] = preflight(CLAUDE, survey(model("m", context_length=None)), "m")
    assert finding.severity == "note"
    assert finding.text.startswith("m has no context_length: the model's own applies")


def test_a_template_without_tools_is_a_warning_that_says_the_gateway_renders_them() -> None:
    tools = {"mode": "auto", "repair": True, "applies": "render"}
    [finding] = preflight(CLAUDE, survey(model("m", tools=tools)), "m")
    assert finding == Finding(
        "warning",
        "m's chat template takes no tools: the gateway writes Claude Code's tools into the "
        "prompt itself and reads the calls back from the model's text (tools: auto); every "
        "call is checked and mended",
    )
    unchecked = {"mode": "render", "repair": False, "applies": "render"}
    [finding] = preflight(CLAUDE, survey(model("m", tools=unchecked)), "m")
    assert "(tools: render); calls are passed as the model wrote them" in finding.text


def test_native_tools_on_a_template_that_may_take_none_is_a_warning() -> None:
    tools = {"mode": "native", "repair": True, "applies": "native"}
    [finding] = preflight(CLAUDE, survey(model("m", tools=tools)), "m")
    assert finding.severity == "warning"
    assert "tools: native" in finding.text and "supports_function_calling: false" in finding.text
    said_so = model("m", tools=tools, supports_function_calling=True)
    assert preflight(CLAUDE, survey(said_so), "m") == []


def test_a_template_not_yet_loaded_is_a_note() -> None:
    tools = {"mode": "auto", "repair": True, "applies": None}
    [finding] = preflight(CLAUDE, survey(model("m", tools=tools)), "m")
    assert finding.severity == "note"
    assert finding.text.startswith("whether m's template takes tools is known once")


def test_no_cap_on_a_small_model_is_a_warning_naming_its_capped_alias() -> None:
    shown = survey(
        model("gemma"),
        model("gemma-agent"),
        gemma=Local("gemma", None, SMALL),
        **{"gemma-agent": Local("gemma", 256, SMALL)},
    )
    [finding] = preflight(CLAUDE, shown, "gemma")
    assert finding.severity == "warning"
    assert finding.text == (
        "gemma has no output cap (max_output_tokens in its entry's or alias's preset) and a "
        "model this small (250 MiB of weights) rarely stops by itself: Claude Code asks for "
        "32,000 output tokens a turn (128,000 when it asks again), so each answer runs until "
        "the gateway's deadline (the entry's default_timeout) cuts it; name gemma-agent "
        "(capped at 256 tokens)"
    )
    assert preflight(CLAUDE, shown, "gemma-agent") == []


def test_no_cap_and_no_capped_alias_says_how_to_cap_it() -> None:
    [finding] = preflight(CLAUDE, survey(model("m"), m=Local("m", None, SMALL)), "m")
    assert finding.text.endswith(
        "give its entry or an alias preset: {max_output_tokens: 256} (docs/agents.md)"
    )


def test_no_cap_on_a_larger_or_remote_model_is_a_note() -> None:
    for weights in (LARGE, None):
        [finding] = preflight(AGENTS["codex"], survey(model("m"), m=Local("m", None, weights)), "m")
        assert finding == Finding(
            "note",
            "m has no output cap: Codex CLI asks for no output bound: the model writes until "
            "it stops",
        )


def test_a_cap_the_registry_here_does_not_show_is_a_note() -> None:
    shown = Survey(URL, models=(model("m"),), local_note="its registry /x.yaml has changed")
    [finding] = preflight(CLAUDE, shown, "m")
    assert finding == Finding(
        "note", "m's output cap is not known: its registry /x.yaml has changed"
    )


def test_findings_add_up() -> None:
    tools = {"mode": "auto", "repair": True, "applies": "render"}
    shown = survey(model("m", context_length=2048, tools=tools), m=Local("m", None, SMALL))
    assert [f.severity for f in preflight(CLAUDE, shown, "m")] == ["warning"] * 3


def test_the_default_model_fits_the_prompt_and_is_capped() -> None:
    shown = survey(
        model("smol", context_length=4096),
        model("gemma"),
        model("gemma-agent"),
        model("embed", model_type="embeddings"),
        smol=Local("smol", None, SMALL),
        gemma=Local("gemma", None, SMALL),
        **{"gemma-agent": Local("gemma", 256, SMALL)},
    )
    assert choose_model(CLAUDE, shown) == "gemma-agent"


def test_the_default_model_falls_back_to_a_fit_then_to_the_first() -> None:
    uncapped = {"a": Local("a", None, SMALL), "b": Local("b", None, SMALL)}
    assert (
        choose_model(CLAUDE, survey(model("a", context_length=4096), model("b"), **uncapped)) == "b"
    )
    short = survey(model("a", context_length=4096), model("b", context_length=2048), **uncapped)
    assert choose_model(CLAUDE, short) == "a"
    gone = survey(model("a", status={"state": "failed"}), model("b", context_length=2048))
    assert choose_model(CLAUDE, gone) == "b"
    assert choose_model(CLAUDE, survey(model("e", model_type="embeddings"))) is None


def test_the_default_model_without_the_registry_is_the_first_that_fits() -> None:
    shown = Survey(URL, models=(model("a", context_length=4096), model("b"), model("c")))
    assert choose_model(CLAUDE, shown) == "b"
