"""``python -m slm_server add`` on the default models' own files, with the real
llama-server: the entry takes the context, type and quantization from the file's
header (read here independently, with the ``gguf`` package), ``check`` accepts it, and
a running gateway serves an added file after the reload, the chat template llama-server
applies being the one the file carries, with no other model restarted."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import openai
import pytest
import yaml

from tests import one_shot
from tests.integration.real_stack import llama_server_bin
from tests.integration.watched import watched
from tests.openai_shapes import strict_chat_completion
from tests.processes import ROOT, free_port, poll

# One worker for the file: the header cache below then reads each file once.
pytestmark = [pytest.mark.real_model, pytest.mark.xdist_group("test_add_real")]

SMOLLM2 = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3 = ROOT / "models" / "gemma-3-270m-q4_k_m.gguf"
# Large enough that neither file's trained context is capped to fit.
BUDGET_MB = "65536"


@dataclass(frozen=True)
class Header:
    """What ``add`` should take from a GGUF file, as the ``gguf`` package reads it."""

    context_length: int
    quantization: str  # general.file_type's name: Q4_1, Q4_K_M...
    chat_template: str | None


@functools.cache
def header(path: Path) -> Header:
    """``path``'s header facts (the reader parses every field: seconds for Gemma's
    vocabulary, so each file is read once)."""
    fields = gguf.GGUFReader(path).fields

    def value(key: str) -> Any:
        field = fields.get(key)
        return None if field is None else field.contents()

    arch = value("general.architecture")
    file_type = gguf.LlamaFileType(value("general.file_type"))
    return Header(
        context_length=int(value(f"{arch}.context_length")),
        quantization=file_type.name.removeprefix("MOSTLY_"),
        chat_template=value("tokenizer.chat_template"),
    )


def slm(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m slm_server ARGS`` run to its end; fails the test on a non-zero exit."""
    done = subprocess.run(
        [sys.executable, "-m", "slm_server", *args],
        env={**os.environ, **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"{args}: {done.stdout}\n{done.stderr}"
    return done


def registry_env(workdir: Path) -> dict[str, str]:
    """An environment whose registry (not yet written) and logs are under ``workdir``."""
    return {
        "SLM_CONFIG": str(workdir / "models.yaml"),
        "SLM_BACKEND_LOG_DIR": str(workdir / "logs"),
        "SLM_LLAMA_SERVER_BIN": llama_server_bin(),
        "SLM_ENV_FILE": str(workdir / "no.env"),
        "SLM_MEMORY_BUDGET_MB": BUDGET_MB,
    }


def added(
    env: dict[str, str], model: Path, *flags: str
) -> tuple[subprocess.CompletedProcess[str], str, dict[str, Any]]:
    """``add MODEL FLAGS`` into ``env``'s registry: the command's run, and the entry's
    role and fields (it is the registry's last)."""
    done = slm(env, "add", str(model), *flags)
    models: dict[str, dict[str, Any]] = yaml.safe_load(Path(env["SLM_CONFIG"]).read_text())[
        "models"
    ]
    role = list(models)[-1]
    return done, role, models[role]


def served_template(port: int) -> str:
    """The chat template the llama-server on ``port`` applies (its ``/props``)."""
    props = one_shot.get(f"http://127.0.0.1:{port}/props", timeout=10)
    assert props.status_code == 200, props.text
    template = props.json()["chat_template"]
    assert isinstance(template, str)
    return template


@pytest.mark.parametrize("model", [SMOLLM2, GEMMA3], ids=["smollm2", "gemma3"])
def test_add_writes_what_the_file_says_and_check_accepts_it(tmp_path: Path, model: Path) -> None:
    env = registry_env(tmp_path)
    config = Path(env["SLM_CONFIG"])
    port = str(free_port())
    facts = header(model)

    dry = slm(env, "add", str(model), "--port", port, "--dry-run")
    assert "would be added (dry run: nothing written)" in dry.stdout
    assert not config.exists()

    done, role, entry = added(env, model, "--port", port)
    assert yaml.safe_load(config.read_text())["models"] == {role: entry}
    shown = dry.stdout.replace("would be added (dry run: nothing written)", "added")
    no_gateway = "no gateway is running: the entry takes effect at its next start\n"
    assert done.stdout == shown + no_gateway  # the dry run showed what was written
    assert entry["model_path"] == f"models/{model.name}"
    assert entry["backend"] == "llamacpp"
    assert entry["context_length"] == facts.context_length
    assert f"at context {facts.context_length} (the file's trained context)" in dry.stdout
    assert entry["quantization"] == facts.quantization
    assert "model_type" not in entry  # a chat model: the default, lm
    if facts.chat_template is not None:
        # The template is the file's own: the entry names none, llama-server reads it.
        assert not {"chat_template_file", "chat_template_kwargs"} & set(entry)
        assert "template: the file's own (tokenizer.chat_template)" in dry.stdout
    else:
        # Gemma's file carries none: the entry names the Gemma turns the project ships.
        assert entry["chat_template_file"] == "config/gemma3-chat-template.jinja"
        assert "template: the file carries none" in dry.stdout

    checked = slm(env, "check")
    assert f"{role} ({entry['id']}) -> 127.0.0.1:{port}" in checked.stdout
    assert f"--ctx-size {facts.context_length}" in checked.stdout
    assert ("--chat-template-file" in checked.stdout) == (facts.chat_template is None)


def test_a_running_gateway_serves_an_added_file_after_the_reload_and_restarts_nothing(
    tmp_path: Path,
) -> None:
    # SmolLM2 as `add` writes it, loaded at launch, in a registry of its own.
    (tmp_path / "first").mkdir()
    first = registry_env(tmp_path / "first")
    _, kept_role, kept = added(
        first, SMOLLM2, "--load", "always", "--port", str(free_port()), "--no-reload"
    )
    models = {kept_role: kept}
    with watched(
        tmp_path, models, llama_server=llama_server_bin(), SLM_MEMORY_BUDGET_MB=BUDGET_MB
    ) as stack:
        kept_pid = stack.pid(kept_role)
        assert served_template(kept["port"]) == header(SMOLLM2).chat_template

        port = free_port()
        done, role, entry = added(stack.env, GEMMA3, "--port", str(port))
        assert "reloading the running gateway:" in done.stdout
        assert f"  added: {role}" in done.stdout and f"  unchanged: {kept_role}" in done.stdout
        reloaded = stack.wait_event("config_reloaded")
        assert reloaded["added"] == [role] and reloaded["unchanged"] == [kept_role], reloaded
        stack.models = yaml.safe_load(Path(stack.env["SLM_CONFIG"]).read_text())["models"]
        stack.wait_state(role, "unloaded")  # load: on_demand, add's default
        poll(lambda: stack.router_state(role) == "unloaded", 15, "the router to list it")

        with openai.OpenAI(
            base_url=f"{stack.url}/v1", api_key="unused", max_retries=0, timeout=120
        ) as client:
            assert entry["id"] in {m.id for m in client.models.list()}
            raw = client.chat.completions.with_raw_response.create(
                model=entry["id"],
                messages=[{"role": "user", "content": "Say hello."}],
                max_tokens=8,
                temperature=0,
            )
        completion = strict_chat_completion(raw.http_response.json())
        assert completion.model == entry["id"]
        assert completion.choices[0].message.content
        assert stack.state(role)["state"] == "ready" and stack.state(role)["port"] == port
        # Gemma's file carries no template: the entry names the project's Gemma turns,
        # and llama-server applies them rather than its ChatML fallback.
        assert header(GEMMA3).chat_template is None
        served = served_template(port)
        assert "<start_of_turn>" in served and "<|im_start|>" not in served, served

        assert stack.pid(kept_role) == kept_pid
        assert stack.state(kept_role)["restarts"] == 0
        assert stack.events("restart_started") == []
        assert [e["role"] for e in stack.events("backend_loaded")] == [role]
        assert [e for e in stack.events() if e.get("role") == kept_role] == []
