"""``POST /v1/models/pull``, ``GET /v1/models/local`` and ``POST /v1/models/add`` through
the real router process, pulling from the hub stand-in (``tests.fakes.hub_control``, a
real process serving Hugging Face's and Ollama's routes): off unless turned on, keys
apply, refusals before any stream, the event stream to ``done``, a client that leaves
cancels its pull (and the next one resumes), one pull per model and two at once, a
router that stops ends its pulls, and ``add`` against a running gateway whose fake
llama-servers then serve the new model."""

from __future__ import annotations

import hashlib
import json
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests import one_shot
from tests.fakes.hub_control import HfFile, HfRepo, HubStandin, OllamaLayer, OllamaModel, cdn_gets
from tests.fakes.hub_control import tiny_gguf as gguf_bytes
from tests.integration.watched import fake_entry, watched
from tests.processes import free_port, poll, registry_env, running_router
from tests.registry_entries import registry_entry
from tests.unit.discover.stores import tiny_gguf

pytestmark = pytest.mark.xdist_group("test_pull_api")

KEY = "pull-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
TINY_REPO = "acme/tiny-GGUF"
TINY_FILE = "tiny-Q4_K_M.gguf"
TINY_REF = f"{TINY_REPO}/{TINY_FILE}"
SLOW = "ollama:slow:1b"
SLOWER = "ollama:slower:1b"
THIRD = "ollama:third:1b"
# Past three of the Ollama download's 1 MiB chunks (a cancel is seen at each), sent by
# the stand-in 64 KiB every 50 ms: some 2.4 s to pull, a chunk every 0.8 s.
BLOB = gguf_bytes({"general.architecture": "llama"}, size=3 * (1 << 20) + 4096)
# Other blobs: two models sharing one would share its partial file too.
OTHER_BLOB = gguf_bytes({"general.architecture": "llama", "general.name": "o"}, size=len(BLOB))
THIRD_BLOB = gguf_bytes({"general.architecture": "llama", "general.name": "t"}, size=len(BLOB))
OLLAMA_CDN = "/cdn/ollama/*"


def ollama_model(blob: bytes) -> OllamaModel:
    return OllamaModel(
        layers=(OllamaLayer("application/vnd.ollama.image.model", data=blob),),
        config={"model_format": "gguf", "model_family": "llama", "file_type": "Q4_K_M"},
    )


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubStandin]:
    directory = tmp_path_factory.mktemp("hub")
    tiny = tiny_gguf(directory / TINY_FILE, context=4096, file_type=15)
    repos = {TINY_REPO: HfRepo(files=(HfFile(TINY_FILE, source=tiny),))}
    models = {
        "library/slow:1b": ollama_model(BLOB),
        "library/slower:1b": ollama_model(OTHER_BLOB),
        "library/third:1b": ollama_model(THIRD_BLOB),
    }
    with HubStandin.start(directory, hf=repos, ollama=models) as standin:
        yield standin


@pytest.fixture(autouse=True)
def clean_hub(hub: HubStandin) -> None:
    hub.reset()


def hub_env(hub: HubStandin, tmp: Path) -> dict[str, str]:
    """Where pulls come from and go: the stand-in, and a models folder and home of the
    test's (discovery looks in the home's stores)."""
    return {
        "SLM_MODELS_DIR": str(tmp / "models"),
        "SLM_OLLAMA_REGISTRY": hub.ollama_registry,
        "HF_ENDPOINT": hub.hf_endpoint,
        "HF_HOME": str(tmp / "hf"),
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HOME": str(tmp / "home"),
        "SLM_API_KEYS": KEY,
    }


def a_registry(tmp: Path) -> dict[str, Any]:
    return {"chat": registry_entry("chat", free_port())}


@contextmanager
def router_on(hub: HubStandin, tmp: Path, **extra: str) -> Iterator[tuple[Any, str]]:
    tmp.mkdir(parents=True, exist_ok=True)
    env = registry_env(tmp, a_registry(tmp), **hub_env(hub, tmp), SLM_PULL_API="true", **extra)
    with running_router(env, tmp) as (router, url):
        yield router, url


@pytest.fixture(scope="module")
def on(hub: HubStandin, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A router with the API on (and keys set): its URL and models folder."""
    tmp = tmp_path_factory.mktemp("on")
    with router_on(hub, tmp) as (_router, url):
        yield url, tmp / "models"


def events_of(response: httpx.Response) -> Iterator[dict[str, Any]]:
    for line in response.iter_lines():
        if line.startswith("data: "):
            event = json.loads(line.removeprefix("data: "))
            assert isinstance(event, dict)
            yield event


def pull(url: str, body: dict[str, Any], timeout: float = 60) -> list[dict[str, Any]]:
    """Every event of one pull, its answer checked to be a stream."""
    with one_shot.stream(
        "POST", f"{url}/v1/models/pull", json=body, headers=AUTH, timeout=timeout
    ) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        return list(events_of(response))


def refusal(response: httpx.Response, status: int, code: str) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) >= {"message", "type", "param", "code"}
    assert error["code"] == code, error
    message = error["message"]
    assert isinstance(message, str)
    return message


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_off_unless_turned_on_and_keys_apply(hub: HubStandin, tmp_path: Path) -> None:
    env = registry_env(tmp_path, a_registry(tmp_path), **hub_env(hub, tmp_path))
    with running_router(env, tmp_path) as (_router, url):
        body = {"model": TINY_REF}
        refusal(one_shot.post(f"{url}/v1/models/pull", json=body), 401, "invalid_api_key")
        refusal(one_shot.get(f"{url}/v1/models/local"), 401, "invalid_api_key")
        answer = one_shot.post(f"{url}/v1/models/pull", json=body, headers=AUTH)
        message = refusal(answer, 403, "pull_disabled")
        assert "SLM_PULL_API=true" in message
        refusal(one_shot.get(f"{url}/v1/models/local", headers=AUTH), 403, "pull_disabled")
        add = one_shot.post(f"{url}/v1/models/add", json={"model": "x"}, headers=AUTH)
        refusal(add, 403, "pull_disabled")
    assert hub.requests() == []
    assert not (tmp_path / "models").exists()


def test_a_bad_body_or_reference_is_refused_before_any_stream(
    hub: HubStandin, on: tuple[str, Path]
) -> None:
    url, _models = on
    pulls = f"{url}/v1/models/pull"
    refusal(one_shot.post(pulls, json={"model": TINY_REF}), 401, "invalid_api_key")
    for body, code in (
        ({"model": "not a reference"}, "bad_reference"),
        ({"model": "o/r/../../x.gguf"}, "unsafe_name"),
        ({"model": TINY_REF, "add": "yes"}, "invalid_add"),
        ({"model": TINY_REF, "load": "sometimes"}, "invalid_load"),
        ({}, "missing_model"),
    ):
        answer = one_shot.post(pulls, json=body, headers=AUTH)
        refusal(answer, 400, code)
        assert answer.headers["content-type"] == "application/json"
    plain = one_shot.post(pulls, content=b"{}", headers={**AUTH, "content-type": "text/plain"})
    refusal(plain, 415, "unsupported_media_type")
    broken = one_shot.post(
        pulls, content=b"[", headers={**AUTH, "content-type": "application/json"}
    )
    refusal(broken, 400, "invalid_json")
    assert hub.requests() == []


def test_a_pull_streams_its_events_to_done_and_the_file_is_there(
    hub: HubStandin, on: tuple[str, Path]
) -> None:
    url, models = on
    events = pull(url, {"model": TINY_REF})
    types = [e["type"] for e in events]
    assert types[0] == "planned" and types[-2:] == ["file", "done"], types
    assert set(types[1:-2]) <= {"progress"}
    planned, ready, done = events[0], events[-2], events[-1]
    assert [f["name"] for f in planned["files"]] == [f"{TINY_REPO}/{TINY_FILE}"]
    path = models / TINY_REPO / TINY_FILE
    assert (ready["path"], ready["fetched"]) == (str(path), True)
    assert done == {
        "type": "done",
        "reference": TINY_REF,
        "model": str(path),
        "projector": None,
        "parts": [str(path)],
        "extras": [],
        "fetched_bytes": path.stat().st_size,
        "added": None,
    }
    assert sha(path) == sha(hub.directory.parent / TINY_FILE)

    listed = one_shot.get(f"{url}/v1/models/local", headers=AUTH)
    assert listed.status_code == 200, listed.text
    names = {m["name"]: m for m in listed.json()}
    found = names[f"models/{TINY_REPO}/{TINY_FILE}"]
    assert (found["path"], found["served_as"], found["quantization"]) == (str(path), [], "Q4_K_M")

    again = pull(url, {"model": TINY_REF})  # there already: nothing fetched
    assert again[-1]["fetched_bytes"] == 0 and again[-1]["model"] == str(path)


def test_a_client_that_leaves_cancels_its_pull_and_the_next_pull_resumes(
    hub: HubStandin, on: tuple[str, Path]
) -> None:
    url, models = on
    hub.fault("trickle", OLLAMA_CDN, chunk=65536, interval=0.05)
    with one_shot.stream(
        "POST", f"{url}/v1/models/pull", json={"model": SLOW}, headers=AUTH, timeout=60
    ) as response:
        assert response.status_code == 200
        for event in events_of(response):
            if event["type"] == "progress" and event["done"] > 0:
                break
    # The worker stopped reading: the stand-in saw its download go, unfinished.
    records = hub.wait_for(
        lambda rs: any(r["finished"] and not r["completed"] for r in cdn_gets(rs)), timeout=15
    )
    cut = cdn_gets(records)[0]
    assert cut["closed"] and cut["body_bytes"] < len(BLOB)
    partials = list((models / ".pull" / "ollama").glob("*.partial"))
    assert len(partials) == 1 and 0 < partials[0].stat().st_size < len(BLOB)
    kept = partials[0].stat().st_size

    hub.clear_faults()
    answers: list[list[dict[str, Any]]] = []

    def pulled_again() -> bool:
        with one_shot.stream(
            "POST", f"{url}/v1/models/pull", json={"model": SLOW}, headers=AUTH, timeout=60
        ) as response:
            if response.status_code == 409:  # the cancelled thread is still ending
                response.read()
                return False
            assert response.status_code == 200, response.read()
            answers.append(list(events_of(response)))
            return True

    poll(pulled_again, 15, "the cancelled pull to end")
    done = answers[0][-1]
    assert done["type"] == "done", answers[0]
    assert done["fetched_bytes"] == len(BLOB)
    assert Path(done["model"]).read_bytes() == BLOB
    resumed = cdn_gets(hub.requests())[-1]
    assert resumed["range"] == f"bytes={kept}-" and resumed["completed"]
    assert not list((models / ".pull" / "ollama").glob("*.partial"))


def test_one_pull_per_model_and_two_at_once(hub: HubStandin, on: tuple[str, Path]) -> None:
    url, _models = on  # neither model is pulled by another test: both take seconds
    hub.fault("trickle", OLLAMA_CDN, chunk=65536, interval=0.05)
    pulls = f"{url}/v1/models/pull"
    with (
        one_shot.stream("POST", pulls, json={"model": SLOWER}, headers=AUTH, timeout=60) as first,
        one_shot.stream("POST", pulls, json={"model": THIRD}, headers=AUTH, timeout=60) as second,
    ):
        streams = [events_of(first), events_of(second)]
        assert [next(s)["type"] for s in streams] == ["planned", "planned"]
        same = one_shot.post(pulls, json={"model": "ollama:library/slower"}, headers=AUTH)
        message = refusal(same, 409, "pull_in_progress")
        assert SLOWER in message
        refusal(one_shot.post(pulls, json={"model": TINY_REF}, headers=AUTH), 429, "too_many_pulls")
        ends = [list(s)[-1] for s in streams]
        assert [e["type"] for e in ends] == ["done", "done"], ends


def test_a_router_that_stops_ends_its_pulls(hub: HubStandin, tmp_path: Path) -> None:
    hub.fault("trickle", OLLAMA_CDN, chunk=65536, interval=0.1)  # some 5 s to pull
    with (
        router_on(hub, tmp_path, SLM_DRAIN_TIMEOUT_SECONDS="30") as (router, url),
        one_shot.stream(
            "POST", f"{url}/v1/models/pull", json={"model": SLOW}, headers=AUTH, timeout=60
        ) as response,
    ):
        events = events_of(response)
        assert next(events)["type"] == "planned"
        router.popen.send_signal(signal.SIGTERM)
        last = list(events)[-1]
        assert (last["type"], last["code"]) == ("error", "cancelled"), last
        assert router.popen.wait(timeout=15) in (0, -signal.SIGTERM)
    assert "did not end" not in router.text()


def test_add_through_the_api_serves_the_model_after_the_reload(
    hub: HubStandin, tmp_path: Path
) -> None:
    models = {"keep": fake_entry(tmp_path, "keep")}
    env = {**hub_env(hub, tmp_path), "SLM_PULL_API": "true", "SLM_DRAIN_TIMEOUT_SECONDS": "1"}
    with watched(tmp_path, models, router=True, wait_ready=True, llama_server=None, **env) as stack:
        kept = stack.pid("keep")
        body = {"model": TINY_REF, "add": True, "id": "pulled-tiny"}
        done = pull(stack.url, body)[-1]
        assert done["type"] == "done", done
        added = done["added"]
        assert (added["id"], added["role"]) == ("pulled-tiny", "pulled-tiny")
        assert added["entry"]["model_path"] == done["model"]
        assert added["lines"][0].startswith("pulled-tiny (pulled-tiny) added to ")
        reload = added["reload"]
        assert reload["reloaded"] and reload["added"] == ["pulled-tiny"], reload
        assert reload["unchanged"] == ["keep"]

        local = Path(env["SLM_MODELS_DIR"]) / "mine" / "Second-Q4_K_M.gguf"
        tiny_gguf(local, file_type=15)
        adds = f"{stack.url}/v1/models/add"
        answer = one_shot.post(adds, json={"model": "mine/Second-Q4_K_M.gguf"}, headers=AUTH)
        assert answer.status_code == 200, answer.text
        second = answer.json()
        assert (second["object"], second["id"]) == ("model.added", "second-q4_k_m")
        assert second["reload"]["added"] == ["second-q4_k_m"]
        taken = one_shot.post(adds, json={"model": str(local)}, headers=AUTH)
        assert "already in the registry" in refusal(taken, 409, "id_taken")
        outside = one_shot.post(adds, json={"model": str(stack.tmp / "keep.gguf")}, headers=AUTH)
        refusal(outside, 400, "outside_models_dir")
        refusal(
            one_shot.post(adds, json={"model": "no/such.gguf"}, headers=AUTH),
            404,
            "model_not_found",
        )

        stack.models = yaml.safe_load(Path(stack.env["SLM_CONFIG"]).read_text())["models"]
        for model in ("pulled-tiny", "second-q4_k_m"):
            stack.wait_state(model, "unloaded")
            chat = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
            reply = one_shot.post(
                f"{stack.url}/v1/chat/completions", json=chat, headers=AUTH, timeout=60
            )
            assert reply.status_code == 200, reply.text
            assert reply.json()["choices"]
        listed = one_shot.get(f"{stack.url}/v1/models/local", headers=AUTH).json()
        served = {m["name"]: m["served_as"] for m in listed}
        assert served[f"models/{TINY_REPO}/{TINY_FILE}"] == ["pulled-tiny"]
        assert stack.pid("keep") == kept
