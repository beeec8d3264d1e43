"""``python -m slm_server pull`` through its real code path (huggingface_hub for the
Hugging Face side, our client for Ollama's registry) against the local hub stand-in,
which serves the default models' real files and small synthetic ones: a clean pull, a
resume after ``kill -9`` and after a cut, a checksum mismatch, a disk too small and one
that fills, the hubs' refusals, a redirect, a slow-loris, names that climb, the
progress bar on a terminal, and ``pull --add``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fakes.forward_proxy import forward_proxy
from tests.fakes.hub_control import (
    DEFAULT_HF_REPOS,
    DEFAULT_OLLAMA_MODELS,
    GEMMA3_GGUF,
    SMOLLM2_GGUF,
    HfFile,
    HfRepo,
    HubStandin,
    OllamaLayer,
    OllamaModel,
    cdn_gets,
    tiny_gguf,
)
from tests.integration.pull_runs import (
    env_for,
    files_under,
    models_dir,
    pull,
    pull_in_a_terminal,
    pull_on_a_small_disk,
    sha256_of,
)
from tests.processes import ROOT, poll

pytestmark = pytest.mark.xdist_group("test_pull")

MIB = 1 << 20
BIG_SIZE = 24 * MIB + 12_345  # over two of huggingface_hub's 10 MiB pieces
MODEL = "application/vnd.ollama.image.model"
TEMPLATE = "application/vnd.ollama.image.template"
CDN = "/cdn/*"


@pytest.fixture(scope="module")
def big_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sources") / "big-Q4_K_M.gguf"
    body = bytearray(tiny_gguf({"general.architecture": "llama"}, size=BIG_SIZE))
    body[4096::4099] = bytes(len(body[4096::4099]))  # not all zeros: a flipped byte shows
    for i in range(4096, len(body), 7919):
        body[i] = i % 251
    path.write_bytes(bytes(body))
    return path


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory, big_file: Path) -> Iterator[HubStandin]:
    tiny = tiny_gguf({"general.architecture": "llama", "llama.context_length": 4096}, size=65536)
    repos = {
        **DEFAULT_HF_REPOS,
        "acme/big-GGUF": HfRepo(files=(HfFile("big-Q4_K_M.gguf", source=big_file),)),
        "acme/tiny-GGUF": HfRepo(
            files=(HfFile("tiny-Q4_K_M.gguf", data=tiny), HfFile("README.md", data=b"# t\n"))
        ),
        "acme/gated-GGUF": HfRepo(
            files=(HfFile("gated-Q4_K_M.gguf", data=tiny),), gated="manual", tokens=("hf_good",)
        ),
    }
    models = {
        **DEFAULT_OLLAMA_MODELS,
        "library/tiny:1": OllamaModel(layers=(OllamaLayer(MODEL, data=tiny),)),
        "library/big:1": OllamaModel(
            layers=(
                OllamaLayer(MODEL, source=big_file),
                OllamaLayer(TEMPLATE, data=b"{{ .Prompt }}"),
            )
        ),
    }
    directory = tmp_path_factory.mktemp("hub")
    with HubStandin.start(
        directory,
        hf=repos,
        ollama=models,
        tokens=("hf_known",),
        renames={"acme/old-GGUF": "acme/tiny-GGUF"},
    ) as standin:
        yield standin


@pytest.fixture(autouse=True)
def clean_hub(hub: HubStandin) -> Iterator[None]:
    hub.reset()
    yield
    hub.reset()


def no_model_anywhere(env: dict[str, str]) -> None:
    """No file under the models folder outside staging, and no whole file in it."""
    left = files_under(models_dir(env))
    assert [f for f in left if not f.startswith(".pull/")] == [], left


# ---------------------------------------------------------------- a clean pull


def test_a_clean_pull_of_each_default_model_from_each_hub(hub: HubStandin, tmp_path: Path) -> None:
    env = env_for(hub, tmp_path)
    smol = pull(env, "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF")
    assert smol.code == 0, smol.err
    path = (
        models_dir(env) / "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF/SmolLM2-135M-Instruct.Q4_1.gguf"
    )
    assert sha256_of(path) == sha256_of(SMOLLM2_GGUF)
    assert f"the model is {path}" in smol.out
    assert "pulling HuggingFaceTB/SmolLM2-135M-Instruct-GGUF: 1 file(s), 1 to fetch" in smol.err

    gemma = pull(env, "ollama:gemma3:270m")
    assert gemma.code == 0, gemma.err
    blob = models_dir(env) / "ollama/gemma3-270m.gguf"
    assert sha256_of(blob) == sha256_of(GEMMA3_GGUF)
    template = models_dir(env) / "ollama/gemma3-270m.ollama-template"
    params = models_dir(env) / "ollama/gemma3-270m.ollama-params.json"
    assert "<start_of_turn>" in template.read_text() and '"stop"' in params.read_text()
    assert [f for f in files_under(models_dir(env)) if f.startswith(".pull/")] == []

    hub.reset()
    again = pull(env, "ollama:gemma3:270m")
    again_hf = pull(env, "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF")
    assert again.code == 0 and again_hf.code == 0, again.err + again_hf.err
    assert "already there, checked" in again.err and "already there, checked" in again_hf.err
    assert "nothing fetched" in again.out and "nothing fetched" in again_hf.out
    assert cdn_gets(hub.requests()) == [], (
        "a file already there with its checksum is not fetched again"
    )


def test_a_split_model_comes_whole_with_its_projector(hub: HubStandin, tmp_path: Path) -> None:
    env = env_for(hub, tmp_path)
    done = pull(env, "ggml-org/gemma-3-270m-GGUF:Q8_0")
    assert done.code == 0, done.err
    assert files_under(models_dir(env) / "ggml-org") == [
        "gemma-3-270m-GGUF/Q8_0/gemma-3-270m-Q8_0-00001-of-00002.gguf",
        "gemma-3-270m-GGUF/Q8_0/gemma-3-270m-Q8_0-00002-of-00002.gguf",
        "gemma-3-270m-GGUF/mmproj-gemma-3-270m-f16.gguf",
    ]
    assert "its vision projector:" in done.out
    assert "00001-of-00002.gguf" in done.out.split("the model is", 1)[1]


# ---------------------------------------------------------------- resuming


def _partial(env: dict[str, str]) -> list[Path]:
    staging = models_dir(env) / ".pull"
    if not staging.exists():
        return []
    return [
        p
        for p in staging.rglob("*")
        if p.is_file() and p.name.endswith((".incomplete", ".partial"))
    ]


@pytest.mark.parametrize("reference", ["acme/big-GGUF", "ollama:big:1"], ids=["hf", "ollama"])
def test_a_pull_killed_mid_file_resumes_where_it_stopped(
    hub: HubStandin, tmp_path: Path, big_file: Path, reference: str
) -> None:
    env = env_for(hub, tmp_path)
    hub.fault("hold", CDN, times=1, after_bytes=12 * MIB)
    log = (tmp_path / "first.log").open("w")
    first = subprocess.Popen(
        [sys.executable, "-m", "slm_server", "pull", reference],
        env=env,
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        kept = 10 * MIB  # huggingface_hub writes whole 10 MiB pieces; ours writes as it reads
        poll(
            lambda: any(p.stat().st_size >= kept for p in _partial(env)),
            30,
            "the first pull to write part of the file",
        )
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
        log.close()
    [partial] = _partial(env)
    have = partial.stat().st_size
    assert kept <= have < BIG_SIZE
    assert not (models_dir(env) / "acme").exists() and not (models_dir(env) / "ollama").exists()

    second = pull(env, reference)
    assert second.code == 0, second.err
    resumed = [r for r in cdn_gets(hub.requests()) if r["range"] is not None][-1]
    assert resumed["range"] == f"bytes={have}-", resumed
    assert resumed["status"] == 206 and resumed["body_bytes"] == BIG_SIZE - have
    assert f"resumed at {have / 1e6:.1f} MB" in second.err
    [final] = [p for p in models_dir(env).rglob("*.gguf") if ".pull" not in p.parts]
    assert sha256_of(final) == sha256_of(big_file)
    assert _partial(env) == []


@pytest.mark.parametrize("reference", ["acme/big-GGUF", "ollama:big:1"], ids=["hf", "ollama"])
def test_a_cut_connection_is_resumed_within_the_same_pull(
    hub: HubStandin, tmp_path: Path, big_file: Path, reference: str
) -> None:
    env = env_for(hub, tmp_path)
    hub.fault("cut_after", CDN, times=1, bytes=12 * MIB)
    done = pull(env, reference)
    assert done.code == 0, done.err
    first, second = [r for r in cdn_gets(hub.requests()) if r["body_bytes"] > 1024]
    assert first["range"] is None and first["body_bytes"] == 12 * MIB
    assert second["range"] is not None and second["range"].startswith("bytes=")
    start = int(second["range"].removeprefix("bytes=").rstrip("-"))
    assert 10 * MIB <= start <= 12 * MIB and second["body_bytes"] == BIG_SIZE - start
    [final] = [p for p in models_dir(env).rglob("*.gguf") if ".pull" not in p.parts]
    assert sha256_of(final) == sha256_of(big_file)


# ---------------------------------------------------------------- checks


@pytest.mark.parametrize(
    ("reference", "said"),
    [("acme/big-GGUF", "is not the hub's"), ("ollama:big:1", "not the manifest's")],
    ids=["hf", "ollama"],
)
def test_a_checksum_mismatch_is_refused_and_nothing_gets_the_final_name(
    hub: HubStandin, tmp_path: Path, reference: str, said: str
) -> None:
    env = env_for(hub, tmp_path)
    hub.fault("corrupt", CDN, offset=BIG_SIZE // 2)
    done = pull(env, reference)
    assert done.code == 1
    assert said in done.err and "nothing was put under its name" in done.err, done.err
    no_model_anywhere(env)
    assert _partial(env) == [] or all(p.stat().st_size < BIG_SIZE for p in _partial(env))


@pytest.mark.parametrize("reference", ["acme/big-GGUF", "ollama:big:1"], ids=["hf", "ollama"])
def test_a_disk_too_small_is_refused_before_a_byte_is_fetched(
    hub: HubStandin, tmp_path: Path, reference: str
) -> None:
    env = env_for(hub, tmp_path)
    done = pull_on_a_small_disk(env, 8 * 1024, reference)
    assert done.code == 1, done.err
    assert "not enough disk space" in done.err and "nothing was fetched" in done.err
    assert cdn_gets(hub.requests()) == []
    assert done.err.split("--- left:", 1)[1].strip() == ""


@pytest.mark.parametrize("reference", ["acme/big-GGUF", "ollama:big:1"], ids=["hf", "ollama"])
def test_a_disk_that_fills_during_the_download_is_left_as_it_was(
    hub: HubStandin, tmp_path: Path, reference: str
) -> None:
    env = env_for(hub, tmp_path)
    hub.fault("trickle", CDN, chunk=256 * 1024, interval=0.02)
    done = pull_on_a_small_disk(env, 40 * 1024, reference, fill_after_start=True)
    assert done.code == 1, done.err
    assert "the disk filled while writing" in done.err, done.err
    left = done.err.split("--- left:", 1)[1].split()
    assert [f for f in left if f.endswith((".gguf", ".incomplete", ".partial"))] == [], left


# ---------------------------------------------------------------- the hubs' refusals


@pytest.mark.parametrize(
    ("reference", "fault", "said"),
    [
        ("acme/nope-GGUF", None, "no such repository on the hub"),
        ("acme/tiny-GGUF/nope.gguf", None, "has no model file nope.gguf"),
        ("acme/tiny-GGUF:Q2_K", None, "has no Q2_K file (it holds: Q4_K_M)"),
        (
            "acme/tiny-GGUF",
            {
                "kind": "status",
                "path": "/acme/tiny-GGUF/resolve/*",
                "status": 404,
                "error_code": "EntryNotFound",
            },
            "no such file on the hub",
        ),
        ("acme/gated-GGUF", None, "is gated"),
        (
            "acme/tiny-GGUF",
            {"kind": "status", "path": "/api/models/*", "status": 429, "retry_after": 0},
            "rate limiting",
        ),
        (
            "acme/tiny-GGUF",
            {"kind": "status", "path": "/api/models/*", "status": 500},
            "the hub answered 500",
        ),
        ("ollama:nope:1", None, "not in the registry"),
        (
            "ollama:gemma3:270m",
            {"kind": "status", "path": "/v2/library/gemma3/manifests/*", "status": 401},
            "the registry refused access",
        ),
        (
            "ollama:gemma3:270m",
            {
                "kind": "status",
                "path": "/v2/library/gemma3/manifests/*",
                "status": 429,
                "retry_after": 0,
            },
            "the registry is rate limiting",
        ),
    ],
    ids=[
        "hf-no-repo",
        "hf-no-file",
        "hf-no-quant",
        "hf-404-on-resolve",
        "hf-gated",
        "hf-429",
        "hf-500",
        "ollama-404",
        "ollama-401",
        "ollama-429",
    ],
)
def test_a_hub_refusal_is_one_clear_line_and_nothing_is_written(
    hub: HubStandin, tmp_path: Path, reference: str, fault: dict[str, Any] | None, said: str
) -> None:
    env = env_for(hub, tmp_path)
    if fault is not None:
        spec = dict(fault)
        hub.fault(spec.pop("kind"), spec.pop("path"), **spec)
    done = pull(env, reference)
    assert done.code == 1
    [line] = done.err.strip().splitlines()[-1:]
    assert line.startswith("error: ") and said in line, done.err
    assert "Traceback" not in done.err
    no_model_anywhere(env)


def test_a_gated_repository_answers_to_its_token_and_the_cdn_never_sees_it(
    hub: HubStandin, tmp_path: Path
) -> None:
    env = env_for(hub, tmp_path, HF_TOKEN="hf_good")
    done = pull(env, "acme/gated-GGUF")
    assert done.code == 0, done.err
    hub_side = [r for r in hub.requests() if r["server"] == "hub" and "/resolve/" in r["path"]]
    assert hub_side and all(r["token"] == "hf_good" for r in hub_side)
    assert all(not r["authorization"] for r in cdn_gets(hub.requests()))
    wrong = pull(env_for(hub, tmp_path / "x", HF_TOKEN="hf_unknown"), "acme/tiny-GGUF")
    assert wrong.code == 1 and "check HF_TOKEN" in wrong.err, wrong.err


def test_a_renamed_repository_is_followed_through_its_redirect(
    hub: HubStandin, tmp_path: Path
) -> None:
    env = env_for(hub, tmp_path)
    done = pull(env, "acme/old-GGUF")
    assert done.code == 0, done.err
    assert (models_dir(env) / "acme/old-GGUF/tiny-Q4_K_M.gguf").is_file()
    assert any(r["status"] == 307 for r in hub.requests())


@pytest.mark.parametrize("reference", ["acme/big-GGUF", "ollama:big:1"], ids=["hf", "ollama"])
def test_a_slow_loris_hub_is_given_up_as_stalled_and_the_next_pull_resumes(
    hub: HubStandin, tmp_path: Path, reference: str
) -> None:
    env = env_for(hub, tmp_path, SLM_PULL_STALL_SECONDS="1", SLM_PULL_MIN_BYTES_PER_SECOND="100000")
    hub.fault("trickle", CDN, times=1, chunk=64, interval=0.05)
    done = pull(env, reference)
    assert done.code == 1
    assert "less than 100000 bytes a second for 1 s" in done.err, done.err
    no_model_anywhere(env)
    again = pull(env, reference)
    assert again.code == 0, again.err


def test_a_registry_that_never_answers_is_given_up(hub: HubStandin, tmp_path: Path) -> None:
    env = env_for(hub, tmp_path, SLM_PULL_STALL_SECONDS="1")
    hub.fault("hold", "/v2/library/gemma3/manifests/*")
    done = pull(env, "ollama:gemma3:270m")
    assert done.code == 1 and "the registry stopped answering" in done.err, done.err
    hub.clear_faults()
    hub.fault("hold", "/api/models/*")
    listing = pull(env, "acme/tiny-GGUF")
    assert listing.code == 1 and "the hub stopped answering" in listing.err, listing.err


# ---------------------------------------------------------------- names


@pytest.mark.parametrize(
    "reference", ["acme/tiny-GGUF/../x.gguf", "acme/../etc/x.gguf", "ollama:../x"]
)
def test_a_reference_that_climbs_is_refused_before_the_hub_is_asked(
    hub: HubStandin, tmp_path: Path, reference: str
) -> None:
    done = pull(env_for(hub, tmp_path), reference)
    assert done.code == 1 and "error: " in done.err and "Traceback" not in done.err
    assert hub.requests() == []


def test_a_hub_listing_a_climbing_name_is_refused(hub: HubStandin, tmp_path: Path) -> None:
    env = env_for(hub, tmp_path)
    hub.fault("hostile_listing", "*", repo="acme/big-GGUF", names=["../../evil-Q2_K.gguf"], size=10)
    done = pull(env, "acme/big-GGUF:Q2_K")
    assert done.code == 1 and "not a plain relative path" in done.err, done.err
    assert not (tmp_path / "home" / "evil-Q2_K.gguf").exists()
    assert not any(p.name == "evil-Q2_K.gguf" for p in tmp_path.rglob("*"))


# ---------------------------------------------------------------- what a person sees


def test_the_progress_bar_is_drawn_on_a_terminal(hub: HubStandin, tmp_path: Path) -> None:
    env = env_for(hub, tmp_path)
    hub.fault("trickle", CDN, chunk=512 * 1024, interval=0.05)
    run = pull_in_a_terminal(env, "acme/big-GGUF", columns=100)
    assert run.code == 0, run.out
    redraws = [frame for frame in run.out.split("\r") if "% [" in frame]
    assert len(redraws) >= 5, run.out
    last = redraws[-1].split("\x1b[K")[0]
    assert last.startswith("big-Q4_K_M.gguf 100% [")
    assert "25.2 MB / 25.2 MB" in last and "MB/s" in last and "left" in last
    assert all(len(frame.split("\x1b[K")[0]) < 100 for frame in redraws)
    middle = redraws[len(redraws) // 2]
    assert "=" in middle and "MB/s" in middle and " s left" in middle, middle
    assert "acme/big-GGUF/big-Q4_K_M.gguf: checked and in place" in run.out


def test_in_a_pipe_progress_is_plain_lines(hub: HubStandin, tmp_path: Path) -> None:
    env = env_for(hub, tmp_path)
    hub.fault("trickle", CDN, chunk=1024 * 1024, interval=0.02)
    done = pull(env, "acme/big-GGUF")
    assert done.code == 0, done.err
    assert "\r" not in done.err and "\x1b" not in done.err
    lines = [
        line for line in done.err.splitlines() if line.startswith("acme/big-GGUF/big-Q4_K_M.gguf: ")
    ]
    assert lines[-2].startswith("acme/big-GGUF/big-Q4_K_M.gguf: 25.2 MB / 25.2 MB (100%)")
    assert 3 <= len(lines) <= 14


# ---------------------------------------------------------------- pull --add


def test_pull_add_writes_an_entry_check_accepts(hub: HubStandin, tmp_path: Path) -> None:
    env = env_for(hub, tmp_path, SLM_MEMORY_BUDGET_MB="4096")
    done = pull(env, "ollama:gemma3:270m", "--add", "--id", "gemma-pulled", "--port", "18555")
    assert done.code == 0, done.err
    assert "no gateway is running: the entry takes effect at its next start" in done.out
    registry = yaml.safe_load(Path(env["SLM_CONFIG"]).read_text())
    [entry] = registry["models"].values()
    assert entry["id"] == "gemma-pulled" and entry["port"] == 18555
    assert entry["model_path"] == str(models_dir(env) / "ollama/gemma3-270m.gguf")
    assert entry["chat_template_file"] == "config/gemma3-chat-template.jinja"
    checked = subprocess.run(
        [sys.executable, "-m", "slm_server", "check"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "gemma-pulled" in checked.stdout
    assert os.path.exists(entry["model_path"])


def test_both_hubs_are_reached_through_a_proxy(hub: HubStandin, tmp_path: Path) -> None:
    with forward_proxy() as (proxy, carried):
        env = env_for(hub, tmp_path, HTTP_PROXY=proxy, http_proxy=proxy, NO_PROXY="", no_proxy="")
        hf = pull(env, "acme/tiny-GGUF")
        ollama = pull(env, "ollama:tiny:1")
    assert hf.code == 0 and ollama.code == 0, hf.err + ollama.err
    assert any("/api/models/acme/tiny-GGUF" in line for line in carried), carried
    assert any(line.startswith("GET http://") and "/cdn/" in line for line in carried), carried
    assert any("/v2/library/tiny/manifests/1" in line for line in carried), carried
    through = [line for line in carried if "/cdn/" in line]
    assert len(through) >= 2  # each hub's download, after its redirect, went through it too
