"""``python -m slm_server pull`` against a hostile hub and from a hostile command line,
through its real code path and the hub stand-in: references that are not ones,
manifests and listings that lie, blobs that send too much, resumes answered wrongly,
redirects that loop or leave HTTP, names that climb or hide, a symlink planted in the
models folder, thousands of listed files, error messages full of terminal escapes, a
terminal five columns wide. Each ends in a clear ``error:`` line (exit 1, no
traceback) or a right file; never a file outside the models folder, never a wrong one
under its final name."""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

import tests.integration.test_pull_api as api
from tests import one_shot
from tests.fakes.hub_control import (
    HfFile,
    HfRepo,
    HubStandin,
    OllamaLayer,
    OllamaModel,
    cdn_gets,
    tiny_gguf,
)
from tests.integration.pull_runs import (
    Run,
    env_for,
    files_under,
    models_dir,
    pull,
    pull_in_a_terminal,
    sha256_of,
)
from tests.processes import poll

pytestmark = pytest.mark.xdist_group("test_pull_hostile")

MIB = 1 << 20
MID_SIZE = 12 * MIB + 4321  # over one of huggingface_hub's 10 MiB pieces
MODEL = "application/vnd.ollama.image.model"
TEMPLATE = "application/vnd.ollama.image.template"
CDN = "/cdn/*"
TINY = tiny_gguf({"general.architecture": "llama"}, size=65536)


@pytest.fixture(scope="module")
def mid_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sources") / "mid-Q4_K_M.gguf"
    body = bytearray(tiny_gguf({"general.architecture": "llama"}, size=MID_SIZE))
    for i in range(4096, len(body), 4093):  # not all zeros: a misplaced byte shows
        body[i] = i % 251 or 1
    path.write_bytes(bytes(body))
    return path


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory, mid_file: Path) -> Iterator[HubStandin]:
    repos = {
        "acme/tiny-GGUF": HfRepo(files=(HfFile("tiny-Q4_K_M.gguf", data=TINY),)),
        "acme/mid-GGUF": HfRepo(files=(HfFile("mid-Q4_K_M.gguf", source=mid_file),)),
    }
    models = {
        "library/tiny:1": OllamaModel(
            layers=(OllamaLayer(MODEL, data=TINY), OllamaLayer(TEMPLATE, data=b"{{ .Prompt }}"))
        ),
        "library/mid:1": OllamaModel(layers=(OllamaLayer(MODEL, source=mid_file),)),
    }
    with HubStandin.start(tmp_path_factory.mktemp("hub"), hf=repos, ollama=models) as standin:
        yield standin


@pytest.fixture(autouse=True)
def clean_hub(hub: HubStandin) -> Iterator[None]:
    hub.reset()
    yield
    hub.reset()


def final_files(env: dict[str, str]) -> list[str]:
    return [f for f in files_under(models_dir(env)) if not f.startswith(".pull/")]


def staged(env: dict[str, str]) -> list[Path]:
    """What a download left in staging (not the library's locks and notes)."""
    return [
        models_dir(env) / f
        for f in files_under(models_dir(env))
        if f.endswith((".incomplete", ".partial", ".gguf"))
    ]


def refused(run: Run, said: str) -> str:
    """The run ended in one clear error line saying ``said``; that line."""
    assert run.code == 1, (run.code, run.out, run.err)
    assert "Traceback" not in run.err, run.err
    assert run.out == ""
    [line] = [line for line in run.err.splitlines() if line.startswith("error: ")]
    assert said in line, run.err
    assert line.isprintable()
    return line


def blob_requests(hub: HubStandin) -> list[dict[str, Any]]:
    return [r for r in hub.requests() if "/blobs/" in r["path"] or r["path"].startswith("/cdn/")]


# ---------------------------------------------------------------- the command line


@pytest.mark.parametrize(
    "reference",
    [
        "acme/tiny-GGUF; touch /tmp/slm-owned",
        "$(touch /tmp/slm-owned)/x",
        "acme/tiny-GGUF/../../../tmp/x.gguf",
        "acme/tiny-GGUF\x1b]0;owned\x07",
        "a" * 5000,
        "ollama:registry.ollama.ai/library/tiny:1",
        "ollama:127.0.0.1:9/tiny",
        "https://evil.test/acme/tiny-GGUF",
    ],
)
def test_a_hostile_reference_is_one_error_line_and_nothing_is_asked_or_written(
    hub: HubStandin, tmp_path: Path, reference: str
) -> None:
    env = env_for(hub, tmp_path)
    line = refused(pull(env, reference), "")
    assert "is not a model reference" in line or "refused the file name" in line
    assert "\x1b" not in line and len(line) < 6000
    assert hub.requests() == []
    assert files_under(models_dir(env)) == []
    assert not Path("/tmp/slm-owned").exists()


# ---------------------------------------------------------------- a hostile Ollama registry


def ollama_manifest(*layers: dict[str, Any]) -> str:
    return json.dumps({"schemaVersion": 2, "layers": list(layers)})


def serve_manifest(hub: HubStandin, model: str, body: str) -> None:
    hub.fault("status", f"/v2/library/{model}/manifests/*", status=200, body=body)


def mid_layer(mid_file: Path, size: int) -> dict[str, Any]:
    return {"mediaType": MODEL, "digest": f"sha256:{sha256_of(mid_file)}", "size": size}


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ("HUGE", "the manifest is over 1 MiB"),
        ("<html>Bad gateway</html>", "the manifest is not JSON"),
        ('{"layers": [{"mediaType": "' + MODEL + '", "size": 5}]}', "has no valid digest"),
        ("PETABYTE", "not enough disk space"),
        ("TWO_MODELS", "the manifest has 2 model layers, not one"),
        ('{"layers": []}', "the manifest has 0 model layers, not one"),
    ],
)
def test_a_manifest_that_lies_is_refused_before_any_blob(
    hub: HubStandin, tmp_path: Path, mid_file: Path, body: str, said: str
) -> None:
    env = env_for(hub, tmp_path)
    if body == "HUGE":
        body = "{" + " " * (MIB + 10) + "}"
    elif body == "PETABYTE":
        body = ollama_manifest(mid_layer(mid_file, 10**15))
    elif body == "TWO_MODELS":
        body = ollama_manifest(mid_layer(mid_file, MID_SIZE), mid_layer(mid_file, MID_SIZE))
    serve_manifest(hub, "mid", body)
    refused(pull(env, "ollama:mid:1"), said)
    assert blob_requests(hub) == []
    assert files_under(models_dir(env)) == []


def test_a_blob_longer_than_its_manifest_says_is_stopped_at_that_size(
    hub: HubStandin, tmp_path: Path, mid_file: Path
) -> None:
    env = env_for(hub, tmp_path)
    serve_manifest(hub, "mid", ollama_manifest(mid_layer(mid_file, MIB)))
    refused(pull(env, "ollama:mid:1"), "more bytes than the manifest's 1048576")
    assert final_files(env) == []
    assert all(p.stat().st_size <= MIB for p in staged(env)), staged(env)


@pytest.mark.parametrize(
    ("reference", "cut", "final"),
    [
        ("ollama:mid:1", 4 * MIB, "ollama/mid-1.gguf"),
        # Past huggingface_hub's first 10 MiB piece: only a whole piece reaches the disk.
        ("acme/mid-GGUF", 11 * MIB, "acme/mid-GGUF/mid-Q4_K_M.gguf"),
    ],
    ids=["ollama", "hf"],
)
def test_a_resume_the_hub_answers_whole_is_still_right(
    hub: HubStandin, tmp_path: Path, mid_file: Path, reference: str, cut: int, final: str
) -> None:
    env = env_for(hub, tmp_path)
    hub.fault("cut_after", CDN, times=1, bytes=cut)
    hub.fault("ignore_range", CDN)
    done = pull(env, reference)
    assert done.code == 0, done.err
    assert sha256_of(models_dir(env) / final) == sha256_of(mid_file)
    resumed = [r for r in cdn_gets(hub.requests()) if r["range"] is not None]
    assert resumed and all(r["status"] == 200 for r in resumed), resumed


@pytest.mark.parametrize(
    ("reference", "path"),
    [
        ("ollama:tiny:1", "/v2/library/tiny/blobs/*"),
        ("acme/tiny-GGUF", "/acme/tiny-GGUF/resolve/*"),
    ],
)
def test_a_redirect_loop_is_given_up_after_a_bounded_number_of_requests(
    hub: HubStandin, tmp_path: Path, reference: str, path: str
) -> None:
    env = env_for(hub, tmp_path)
    hub.fault("redirect", path, status=302, location="{hub}{path}")
    run = pull(env, reference)
    refused(run, "")
    looped = [r for r in hub.requests() if r["status"] == 302]
    # httpx gives up after 20; huggingface_hub asks once and refuses a HEAD that
    # redirects off the hub without the file's metadata.
    assert 1 <= len(looped) <= 25, len(looped)
    assert final_files(env) == []


@pytest.mark.parametrize("location", ["file:///etc/passwd", "ftp://127.0.0.1/x", "data:,hello"])
@pytest.mark.parametrize(
    ("reference", "path"),
    [
        ("ollama:tiny:1", "/v2/library/tiny/blobs/*"),
        ("acme/tiny-GGUF", "/acme/tiny-GGUF/resolve/*"),
    ],
)
def test_a_redirect_out_of_http_is_refused(
    hub: HubStandin, tmp_path: Path, reference: str, path: str, location: str
) -> None:
    env = env_for(hub, tmp_path)
    hub.fault("redirect", path, status=302, location=location)
    refused(pull(env, reference), "")
    assert final_files(env) == []
    assert cdn_gets(hub.requests()) == []


# ---------------------------------------------------------------- a hostile Hugging Face Hub


def listing(hub: HubStandin, repo: str) -> dict[str, Any]:
    answer = one_shot.get(f"{hub.hf_endpoint}/api/models/{repo}", params={"blobs": "true"})
    answer.raise_for_status()
    body: dict[str, Any] = answer.json()
    return body


def serve_listing(hub: HubStandin, repo: str, **lies: Any) -> None:
    """The repository's model_info with its GGUF's ``size`` or ``sha256`` replaced."""
    body = listing(hub, repo)
    for sibling in body["siblings"]:
        if sibling["rfilename"].endswith(".gguf"):
            if "size" in lies:
                sibling["size"] = lies["size"]
                sibling["lfs"]["size"] = lies["size"]
            if "sha256" in lies:
                sibling["lfs"]["sha256"] = lies["sha256"]
    hub.fault("status", f"/api/models/{repo}*", status=200, body=json.dumps(body))


@pytest.mark.parametrize("size", [MIB, MID_SIZE + 1, 0])
def test_a_listing_whose_size_is_not_the_served_one_is_refused_before_the_download(
    hub: HubStandin, tmp_path: Path, size: int
) -> None:
    env = env_for(hub, tmp_path)
    serve_listing(hub, "acme/mid-GGUF", size=size)
    refused(pull(env, "acme/mid-GGUF"), f"the hub serves {MID_SIZE} bytes, its listing says {size}")
    assert final_files(env) == []
    assert all(p.stat().st_size <= size for p in staged(env)), staged(env)


def test_a_hub_that_sends_more_than_it_announced_is_stopped_at_the_announced_size(
    hub: HubStandin, tmp_path: Path
) -> None:
    env = env_for(hub, tmp_path)
    serve_listing(hub, "acme/mid-GGUF", size=MIB)
    hub.fault("headers", "/acme/mid-GGUF/resolve/*", method="HEAD", set={"X-Linked-Size": MIB})
    hub.fault("headers", CDN, drop=["Content-Length"])
    refused(pull(env, "acme/mid-GGUF"), "more bytes than the hub's 1048576")
    assert final_files(env) == []
    assert all(p.stat().st_size <= 2 * MIB for p in staged(env)), staged(env)


def test_a_listing_whose_sha256_lies_keeps_nothing(hub: HubStandin, tmp_path: Path) -> None:
    env = env_for(hub, tmp_path)
    serve_listing(hub, "acme/tiny-GGUF", sha256="0" * 64)
    refused(pull(env, "acme/tiny-GGUF"), "is not the hub's " + "0" * 64)
    assert final_files(env) == []


def test_an_etag_other_than_the_listing_s_sha256_never_puts_a_wrong_file_in_place(
    hub: HubStandin, tmp_path: Path
) -> None:
    env = env_for(hub, tmp_path)
    other = hashlib.sha256(b"other").hexdigest()
    hub.fault(
        "headers", "/acme/tiny-GGUF/resolve/*", method="HEAD", set={"X-Linked-Etag": f'"{other}"'}
    )
    done = pull(env, "acme/tiny-GGUF")
    assert done.code == 0, done.err  # the bytes are the listing's: they are kept
    final = models_dir(env) / "acme/tiny-GGUF/tiny-Q4_K_M.gguf"
    assert final.read_bytes() == TINY


@pytest.mark.parametrize(
    ("name", "reference", "said"),
    [
        ("x" * 300 + "-Q2_K.gguf", "acme/tiny-GGUF:Q2_K", "error: "),
        ("evil\u202eflugg.-Q3_K_S.gguf", "acme/tiny-GGUF:Q3_K_S", "not a plain relative path"),
        ("/tmp/evil-Q3_K_L.gguf", "acme/tiny-GGUF:Q3_K_L", "not a plain relative path"),
        ("..\\..\\evil-Q5_0.gguf", "acme/tiny-GGUF:Q5_0", "not a plain relative path"),
        ("evil\x1b[2J-Q6_K.gguf", "acme/tiny-GGUF:Q6_K", "not a plain relative path"),
    ],
)
def test_a_listed_name_that_climbs_or_hides_is_refused_and_nothing_lands_outside(
    hub: HubStandin, tmp_path: Path, name: str, reference: str, said: str
) -> None:
    env = env_for(hub, tmp_path)
    hub.fault("hostile_listing", "*", repo="acme/tiny-GGUF", names=[name], size=10)
    line = refused(pull(env, reference), said)
    assert "\x1b" not in line and "\u202e" not in line
    assert final_files(env) == []
    assert [p for p in tmp_path.rglob("*evil*")] == []


def test_a_symlink_planted_in_the_models_folder_is_refused(hub: HubStandin, tmp_path: Path) -> None:
    env = env_for(hub, tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    models_dir(env).mkdir(parents=True)
    (models_dir(env) / "acme").symlink_to(outside)
    refused(pull(env, "acme/tiny-GGUF"), "it resolves outside")
    assert list(outside.iterdir()) == []
    assert cdn_gets(hub.requests()) == []


def test_thousands_of_listed_files_are_bounded_in_time_and_in_the_error(
    hub: HubStandin, tmp_path: Path
) -> None:
    env = env_for(hub, tmp_path)
    names = [f"junk/j{i}-Q8_0-{i:05d}.gguf" for i in range(3000)]
    hub.fault("hostile_listing", "*", repo="acme/tiny-GGUF", names=names, size=1)
    done = pull(env, "acme/tiny-GGUF")  # the preferred Q4_K_M among them
    assert done.code == 0, done.err
    assert (models_dir(env) / "acme/tiny-GGUF/tiny-Q4_K_M.gguf").read_bytes() == TINY
    line = refused(pull(env, "acme/tiny-GGUF:Q8_0"), "several files match")
    assert len(line) < 2000 and "and 2980 more" in line


def test_an_error_message_full_of_escapes_reaches_the_terminal_escaped(
    hub: HubStandin, tmp_path: Path
) -> None:
    env = env_for(hub, tmp_path)
    hostile = "\x1b]0;owned\x07\x1b[2J\x1b[1Aall fine\u202e"
    hub.fault("status", "/v2/library/tiny/manifests/*", status=500, message=hostile)
    ollama = refused(pull(env, "ollama:tiny:1"), "\\x1b]0;owned\\x07")
    hub.fault("status", "/api/models/*", status=500, body=json.dumps({"error": hostile}))
    hf = refused(pull(env, "acme/tiny-GGUF"), "the hub answered 500")
    for line in (ollama, hf):
        assert "\x1b" not in line and "\x07" not in line and "\u202e" not in line


# ---------------------------------------------------------------- the progress view


def test_a_terminal_five_columns_wide_gets_bars_that_fit(hub: HubStandin, tmp_path: Path) -> None:
    env = env_for(hub, tmp_path)
    hub.fault("trickle", CDN, chunk=256 * 1024, interval=0.02)
    done = pull_in_a_terminal(env, "acme/mid-GGUF", columns=5)
    assert done.code == 0, done.out
    bars = re.findall(r"\r([^\r\n]*)\x1b\[K", done.out)
    assert bars, done.out
    assert all(len(bar) <= 4 for bar in bars), bars


# ---------------------------------------------------------------- the API, and its clients


@pytest.fixture(scope="module")
def router(hub: HubStandin, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A router with the pull API on, giving up a silent hub after 2 s: its URL and
    models folder."""
    tmp = tmp_path_factory.mktemp("router")
    with api.router_on(hub, tmp, SLM_PULL_STALL_SECONDS="2") as (_router, url):
        yield url, tmp / "models"


def post_raw(url: str, content: bytes) -> httpx.Response:
    headers = {**api.AUTH, "content-type": "application/json"}
    return one_shot.post(f"{url}/v1/models/pull", content=content, headers=headers)


@pytest.mark.parametrize(
    ("content", "status", "code"),
    [
        (b'{"model": "' + b"a" * (70 * 1024) + b'"}', 413, "request_too_large"),
        (b"[" * 30_000 + b"]" * 30_000, 400, "invalid_json"),
        (b'{"model": {"model": {"model": "acme/tiny-GGUF"}}}', 400, "invalid_model"),
        (b'["acme/tiny-GGUF"]', 400, "invalid_json"),
        (b"null", 400, "invalid_json"),
        (b'{"model": ["acme/tiny-GGUF"]}', 400, "invalid_model"),
        (b'{"model": true}', 400, "invalid_model"),
        (b'{"model": 1e999}', 400, "invalid_json"),
        (b'{"model": "acme/tiny-GGUF\\u0000"}', 400, "bad_reference"),
        (b'{"model": "acme/tiny-GGUF\\u001b]0;owned\\u0007"}', 400, "bad_reference"),
        (b'{"model": "' + b"a/" * 4000 + b'x.gguf"}', 400, "bad_reference"),
        (b'{"model": "acme/tiny-GGUF", "add": "\\ud800"}', 400, "invalid_json"),
    ],
)
def test_a_hostile_body_is_refused_before_any_stream_and_asks_no_hub(
    hub: HubStandin, router: tuple[str, Path], content: bytes, status: int, code: str
) -> None:
    url, _models = router
    answer = post_raw(url, content)
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"] == "application/json"
    assert answer.json()["error"]["code"] == code, answer.text
    assert "\x1b" not in answer.text and "\x00" not in answer.text
    assert hub.requests() == []  # so nothing was fetched, nor written


def pull_accepted_again(url: str, reference: str, timeout: float) -> list[dict[str, Any]]:
    """Pull ``reference`` once its model is free again (409 until then); its events."""
    answers: list[list[dict[str, Any]]] = []

    def accepted() -> bool:
        with one_shot.stream(
            "POST", f"{url}/v1/models/pull", json={"model": reference}, headers=api.AUTH, timeout=60
        ) as response:
            if response.status_code == 409:
                response.read()
                return False
            assert response.status_code == 200, response.read()
            answers.append(list(api.events_of(response)))
            return True

    poll(accepted, timeout, f"{reference} to be free to pull again")
    return answers[0]


@pytest.mark.parametrize("stage", ["before_any_event", "while_the_manifest_is_held"])
def test_a_client_that_leaves_at_any_stage_frees_the_model_for_the_next_pull(
    hub: HubStandin, router: tuple[str, Path], stage: str
) -> None:
    url, _models = router
    if stage == "while_the_manifest_is_held":
        hub.fault("hold", "/v2/library/tiny/manifests/*", times=1)
    with one_shot.stream(
        "POST", f"{url}/v1/models/pull", json={"model": "ollama:tiny:1"}, headers=api.AUTH
    ) as response:
        assert response.status_code == 200
        if stage == "while_the_manifest_is_held":
            hub.wait_for(lambda rs: any("/manifests/" in r["path"] for r in rs), timeout=10)
    # Within the stall time (2 s) and a margin: the held manifest is given up.
    events = pull_accepted_again(url, "ollama:tiny:1", timeout=15)
    assert events[-1]["type"] == "done", events
    assert Path(events[-1]["model"]).read_bytes() == TINY


def test_a_hub_name_full_of_escapes_reaches_an_api_client_json_escaped(
    hub: HubStandin, router: tuple[str, Path]
) -> None:
    url, _models = router
    hostile = "\x1b]0;owned\x07 all fine"
    hub.fault("status", "/v2/library/mid/manifests/*", status=500, message=hostile)
    with one_shot.stream(
        "POST", f"{url}/v1/models/pull", json={"model": "ollama:mid:1"}, headers=api.AUTH
    ) as response:
        raw = response.read()
    assert b"\x1b" not in raw and b"\\u001b]0;owned\\u0007" in raw
    [*_, last] = [
        json.loads(line[6:]) for line in raw.decode().splitlines() if line.startswith("data: ")
    ]
    assert last["type"] == "error" and hostile in last["message"], last


@pytest.mark.parametrize(
    ("reference", "planted"), [("acme/tiny-GGUF", ".pull"), ("ollama:tiny:1", ".pull/ollama")]
)
def test_a_symlink_planted_as_the_staging_folder_is_refused(
    hub: HubStandin, tmp_path: Path, reference: str, planted: str
) -> None:
    env = env_for(hub, tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    link = models_dir(env) / planted
    link.parent.mkdir(parents=True)
    link.symlink_to(outside)
    refused(pull(env, reference), "it resolves outside")
    assert list(outside.iterdir()) == []
    assert final_files(env) == []
    assert cdn_gets(hub.requests()) == []


def test_a_listing_of_a_petabyte_is_refused_by_the_disk_check_not_tried(
    hub: HubStandin, tmp_path: Path
) -> None:
    env = env_for(hub, tmp_path)
    serve_listing(hub, "acme/mid-GGUF", size=10**15)
    refused(pull(env, "acme/mid-GGUF"), "not enough disk space")
    assert cdn_gets(hub.requests()) == []
    assert files_under(models_dir(env)) == []


def test_a_client_that_does_not_read_neither_stalls_the_pull_nor_misses_its_end(
    hub: HubStandin, router: tuple[str, Path], mid_file: Path
) -> None:
    url, models = router
    hub.fault("trickle", CDN, chunk=512 * 1024, interval=0.01)
    final = models / "ollama/mid-1.gguf"
    with one_shot.stream(
        "POST", f"{url}/v1/models/pull", json={"model": "ollama:mid:1"}, headers=api.AUTH
    ) as response:
        assert response.status_code == 200
        # Nothing read yet: the pull goes on to its end all the same.
        poll(final.exists, 30, "the pull to finish while its client reads nothing")
        events = list(api.events_of(response))
    assert events[0]["type"] == "planned" and events[-1]["type"] == "done", events
    progress = [e for e in events if e["type"] == "progress"]
    assert 1 <= len(progress) <= 64  # coalesced, never one per chunk (handoff.LIMIT)
    assert sha256_of(final) == sha256_of(mid_file)


class _EndlessError(BaseHTTPRequestHandler):
    """Every request: ``status``, then a body that does not end (up to 256 MiB)."""

    sent = 0
    status = 500
    protocol_version = "HTTP/1.0"

    def do_GET(self) -> None:
        self.send_response(type(self).status)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        piece = b"e" * (256 * 1024)
        try:
            for _ in range(1024):
                self.wfile.write(piece)
                type(self).sent += len(piece)
        except OSError:
            return  # the client has gone

    do_HEAD = do_GET

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def endless_error() -> Iterator[str]:
    _EndlessError.sent = 0
    server = ThreadingHTTPServer(("127.0.0.1", 0), _EndlessError)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.mark.parametrize(("status", "said"), [(500, "the hub answered 500"), (200, "is not JSON")])
def test_an_endless_answer_from_the_hub_is_read_only_in_part(
    hub: HubStandin, tmp_path: Path, endless_error: str, status: int, said: str
) -> None:
    _EndlessError.status = status  # 200: a listing that never ends
    env = env_for(hub, tmp_path, HF_ENDPOINT=endless_error)
    line = refused(pull(env, "acme/tiny-GGUF"), said)
    assert _EndlessError.sent < 128 * MIB, (_EndlessError.sent, line)  # of 256 MiB each
