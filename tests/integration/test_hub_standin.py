"""The hub stand-in (tests/fakes/hub_standin.py) against the real clients: huggingface_hub
1.16.1's own functions for the Hugging Face side, httpx for Ollama's registry. No
slm_server code is involved: these tests prove the stand-in answers as the hubs do where
the clients look, so that tests of ``slm_server pull`` can trust it."""

from __future__ import annotations

import hashlib
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import huggingface_hub
import pytest
from huggingface_hub import HfApi, get_hf_file_metadata, hf_hub_download, hf_hub_url
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.hf_api import RepoFile, RepoFolder
from huggingface_hub.utils._http import parse_ratelimit_headers

from tests import one_shot
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
    git_blob_oid,
    lfs_pointer,
    tiny_gguf,
)

pytestmark = pytest.mark.xdist_group("test_hub_standin")

REPO = "acme/tiny-GGUF"
GATED = "acme/gated-GGUF"
PRIVATE = "acme/private-GGUF"
OLD_NAME = "acme/old-name-GGUF"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
TOKEN = "hf_granted_token"
KNOWN_TOKEN = "hf_known_not_granted"
MODEL_FILE = "tiny-Q4_K_M.gguf"
MODEL = tiny_gguf({"general.architecture": "llama", "general.name": "tiny"}, size=64 * 1024)
PART_FILE = "parts/tiny-00001-of-00002.gguf"
PART = tiny_gguf({"general.architecture": "llama", "split.no": 0, "split.count": 2}, size=3000)
BIG_FILE = "big-Q8_0.gguf"
# Past one of huggingface_hub's 10 MiB write chunks (constants.DOWNLOAD_CHUNK_SIZE): what a
# cut download leaves in its .incomplete file is whole chunks only.
BIG = (tiny_gguf({"general.architecture": "llama"}) + bytes(range(251)) * 43_000)[:10_600_000]
CHUNK = huggingface_hub.constants.DOWNLOAD_CHUNK_SIZE
README = b"---\nlicense: mit\n---\n# tiny\n"
TEMPLATE = b"{{ .Prompt }}"
PARAMS = b'{"stop":["<end_of_turn>"],"temperature":1,"top_k":64,"top_p":0.95}'
OLLAMA_MODEL = tiny_gguf({"general.architecture": "gemma3"}, size=32 * 1024)
MANIFEST_V2 = "application/vnd.docker.distribution.manifest.v2+json"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def tiny_repo(*extra: HfFile, **fields: Any) -> HfRepo:
    return HfRepo(
        files=(
            HfFile(MODEL_FILE, data=MODEL),
            HfFile(PART_FILE, data=PART),
            HfFile("README.md", data=README),
            *extra,
        ),
        commit=COMMIT,
        **fields,
    )


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubStandin]:
    directory = tmp_path_factory.mktemp("hub")
    big = directory / BIG_FILE
    big.write_bytes(BIG)
    repos = {
        REPO: tiny_repo(HfFile(BIG_FILE, source=big)),
        GATED: tiny_repo(gated="manual", tokens=(TOKEN,)),
        PRIVATE: tiny_repo(private=True, tokens=(TOKEN,)),
    }
    models = {
        "library/tiny:1b": OllamaModel(
            layers=(
                OllamaLayer("application/vnd.ollama.image.model", data=OLLAMA_MODEL),
                OllamaLayer("application/vnd.ollama.image.template", data=TEMPLATE),
                OllamaLayer("application/vnd.ollama.image.params", data=PARAMS),
            ),
            config={"model_format": "gguf", "model_family": "gemma3", "file_type": "Q4_K_M"},
        )
    }
    with HubStandin.start(
        directory,
        hf=repos,
        ollama=models,
        tokens=(KNOWN_TOKEN,),
        renames={OLD_NAME: REPO},
    ) as standin:
        yield standin
    huggingface_hub.close_session()
    assert "Traceback" not in standin.output(), (
        standin.output()
    )  # its pooled connections to the stopped stand-in


@pytest.fixture(autouse=True)
def _fresh(request: pytest.FixtureRequest) -> None:
    if "hub" in request.fixturenames:
        request.getfixturevalue("hub").reset()


@pytest.fixture
def api(hub: HubStandin) -> HfApi:
    return HfApi(endpoint=hub.hf_endpoint, token=False)


@pytest.fixture
def registry(hub: HubStandin) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=hub.ollama_registry, timeout=10.0, trust_env=False) as client:
        yield client


def download(hub: HubStandin, local_dir: Path, filename: str, **kwargs: Any) -> Path:
    kwargs.setdefault("token", False)
    kwargs.setdefault("repo_id", REPO)
    path = hf_hub_download(
        filename=filename, endpoint=hub.hf_endpoint, local_dir=local_dir, **kwargs
    )
    return Path(path)


# ---------------------------------------------------------------------------- listings


def test_tree_lists_every_file_with_lfs_metadata_across_pages(hub: HubStandin, api: HfApi) -> None:
    hub.set_page_size(2)
    entries = list(api.list_repo_tree(REPO, recursive=True))

    by_path = {entry.path: entry for entry in entries}
    assert sorted(by_path) == [
        ".gitattributes",
        "README.md",
        BIG_FILE,
        "parts",
        PART_FILE,
        MODEL_FILE,
    ]
    model = by_path[MODEL_FILE]
    assert isinstance(model, RepoFile)
    assert model.size == len(MODEL)
    assert model.lfs is not None
    assert model.lfs.sha256 == sha256(MODEL)
    assert model.lfs.size == len(MODEL)
    pointer = lfs_pointer(sha256(MODEL), len(MODEL))
    assert model.lfs.pointer_size == len(pointer)
    assert model.blob_id == git_blob_oid(pointer)  # git stores the pointer, not the bytes
    readme = by_path["README.md"]
    assert isinstance(readme, RepoFile)
    assert readme.lfs is None
    assert readme.blob_id == git_blob_oid(README)
    assert isinstance(by_path["parts"], RepoFolder)

    pages = [r for r in hub.requests() if "/tree/" in r["path"]]
    assert len(pages) == 3  # six entries, two a page, followed by the Link header
    assert "cursor=" not in pages[0]["path"]
    assert all("cursor=" in r["path"] and "recursive=" in r["path"] for r in pages[1:])


def test_tree_of_a_folder_and_without_recursion(hub: HubStandin, api: HfApi) -> None:
    top = {entry.path: type(entry) for entry in api.list_repo_tree(REPO)}
    assert top == {
        ".gitattributes": RepoFile,
        "README.md": RepoFile,
        BIG_FILE: RepoFile,
        "parts": RepoFolder,
        MODEL_FILE: RepoFile,
    }
    assert [entry.path for entry in api.list_repo_tree(REPO, path_in_repo="parts")] == [PART_FILE]
    with pytest.raises(RemoteEntryNotFoundError):
        list(api.list_repo_tree(REPO, path_in_repo="nowhere"))


def test_model_info_with_files_metadata(hub: HubStandin, api: HfApi) -> None:
    info = api.model_info(REPO, files_metadata=True)
    assert info.id == REPO
    assert info.sha == COMMIT
    assert info.gated is False
    assert info.siblings is not None
    siblings = {sibling.rfilename: sibling for sibling in info.siblings}
    assert set(siblings) == {".gitattributes", "README.md", BIG_FILE, PART_FILE, MODEL_FILE}
    model = siblings[MODEL_FILE]
    assert model.size == len(MODEL)
    assert model.lfs is not None
    assert model.lfs.sha256 == sha256(MODEL)
    assert siblings["README.md"].blob_id == git_blob_oid(README)

    assert api.model_info(REPO, revision=COMMIT).sha == COMMIT
    plain = api.model_info(REPO)
    assert plain.siblings is not None
    assert all(sibling.size is None for sibling in plain.siblings)
    assert hub.requests()[0]["path"] == f"/api/models/{REPO}?blobs=true"

    paths = api.get_paths_info(REPO, [MODEL_FILE, "parts", "missing.gguf"])
    assert [(type(p), p.path) for p in paths] == [(RepoFile, MODEL_FILE), (RepoFolder, "parts")]


# ---------------------------------------------------------------------------- files


def test_file_metadata_of_an_lfs_file_and_a_plain_one(hub: HubStandin) -> None:
    url = hf_hub_url(REPO, MODEL_FILE, endpoint=hub.hf_endpoint)
    lfs = get_hf_file_metadata(url, token=False)
    assert lfs.etag == sha256(MODEL)
    assert lfs.size == len(MODEL)
    assert lfs.commit_hash == COMMIT
    assert lfs.location.startswith(f"{hub.cdn_url}/cdn/")
    assert urlsplit(lfs.location).netloc != urlsplit(url).netloc

    by_commit = get_hf_file_metadata(
        hf_hub_url(REPO, MODEL_FILE, revision=COMMIT, endpoint=hub.hf_endpoint), token=False
    )
    assert (by_commit.etag, by_commit.commit_hash) == (lfs.etag, COMMIT)

    readme_url = hf_hub_url(REPO, "README.md", endpoint=hub.hf_endpoint)
    plain = get_hf_file_metadata(readme_url, token=False)
    assert plain.etag == git_blob_oid(README)
    assert plain.size == len(README)
    assert plain.location == readme_url

    [head] = [r for r in hub.requests() if r["path"] == f"/{REPO}/resolve/main/{MODEL_FILE}"]
    assert (head["method"], head["status"]) == ("HEAD", 302)


def test_download_to_local_dir_equals_the_source(hub: HubStandin, tmp_path: Path) -> None:
    model = download(hub, tmp_path, MODEL_FILE)
    part = download(hub, tmp_path, PART_FILE)
    readme = download(hub, tmp_path, "README.md")
    assert model == tmp_path / MODEL_FILE
    assert model.read_bytes() == MODEL
    assert part.read_bytes() == PART
    assert readme.read_bytes() == README

    [model_get] = [r for r in cdn_gets(hub.requests()) if r["body_bytes"] == len(MODEL)]
    assert (model_get["status"], model_get["completed"], model_get["server"]) == (200, True, "cdn")


@pytest.mark.parametrize(
    ("reset", "error"), [(False, httpx.RemoteProtocolError), (True, httpx.ReadError)]
)
def test_cut_download_resumes_with_a_range(
    hub: HubStandin, tmp_path: Path, reset: bool, error: type[Exception]
) -> None:
    cut = CHUNK + 100_000
    hub.fault("cut_after", "/cdn/*", times=1, bytes=cut, reset=reset)
    with pytest.raises(error):
        download(hub, tmp_path, BIG_FILE)
    assert not (tmp_path / BIG_FILE).exists()
    [partial] = (tmp_path / ".cache" / "huggingface" / "download").glob("*.incomplete")
    assert partial.name.endswith(f".{sha256(BIG)}.incomplete")
    kept = partial.stat().st_size
    # Whole 10 MiB chunks only: the 100_000 bytes after the first were lost. After an RST
    # the kernel may drop what the client had not read yet, so even the first may be.
    assert kept == CHUNK or (reset and kept == 0)

    assert download(hub, tmp_path, BIG_FILE).read_bytes() == BIG
    first, second = cdn_gets(hub.requests())
    assert (first["range"], first["body_bytes"], first["closed"]) == (None, cut, True)
    assert second["range"] == (f"bytes={kept}-" if kept else None)
    assert (second["status"], second["body_bytes"]) == (206 if kept else 200, len(BIG) - kept)
    assert not second["authorization"]


def test_a_stall_mid_body_is_resumed_within_one_call(
    hub: HubStandin, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read timeout while streaming (HF_HUB_DOWNLOAD_TIMEOUT, read when http_get runs)
    is one of the two errors http_get itself resumes from, after a 1 s sleep."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_DOWNLOAD_TIMEOUT", 1)
    hub.fault("hold", "/cdn/*", times=1, after_bytes=CHUNK + 10)
    assert download(hub, tmp_path, BIG_FILE).read_bytes() == BIG
    first, second = cdn_gets(hub.requests())
    assert (first["status"], first["body_bytes"], first["closed"]) == (200, CHUNK + 10, True)
    assert (second["range"], second["status"]) == (f"bytes={CHUNK}-", 206)


def test_a_server_ignoring_the_range_restarts_the_file(hub: HubStandin, tmp_path: Path) -> None:
    hub.fault("cut_after", "/cdn/*", times=1, bytes=CHUNK + 10)
    with pytest.raises(httpx.RemoteProtocolError):
        download(hub, tmp_path, BIG_FILE)
    hub.fault("ignore_range", "/cdn/*", times=1)
    assert download(hub, tmp_path, BIG_FILE).read_bytes() == BIG
    first, second = cdn_gets(hub.requests())
    assert first["faults"] == ["cut_after"]
    assert (second["range"], second["status"]) == (f"bytes={CHUNK}-", 200)
    assert (second["faults"], second["body_bytes"]) == (["ignore_range"], len(BIG))


def test_corrupt_bytes_are_not_caught_by_huggingface_hub(hub: HubStandin, tmp_path: Path) -> None:
    hub.fault("corrupt", "/cdn/*", offset=100)
    data = download(hub, tmp_path, MODEL_FILE).read_bytes()
    assert len(data) == len(MODEL)
    assert [i for i in range(len(MODEL)) if data[i] != MODEL[i]] == [100]
    assert sha256(data) != sha256(MODEL)  # only the caller's own check finds it


def test_cdn_ranges(hub: HubStandin) -> None:
    location = get_hf_file_metadata(hf_hub_url(REPO, MODEL_FILE, endpoint=hub.hf_endpoint)).location
    with httpx.Client(trust_env=False) as client:
        part = client.get(location, headers={"Range": "bytes=4-7"})
        assert (part.status_code, part.content) == (206, MODEL[4:8])
        assert part.headers["Content-Range"] == f"bytes 4-7/{len(MODEL)}"
        assert part.headers["Accept-Ranges"] == "bytes"
        disposition = part.headers["Content-Disposition"]
        assert disposition == f"inline; filename*=UTF-8''{MODEL_FILE}; filename=\"{MODEL_FILE}\";"
        tail = client.get(location, headers={"Range": "bytes=-10"})
        assert (tail.status_code, tail.content) == (206, MODEL[-10:])
        beyond = client.get(location, headers={"Range": f"bytes={len(MODEL)}-"})
        assert beyond.status_code == 416
        assert beyond.headers["Content-Range"] == f"bytes */{len(MODEL)}"
        head = client.head(location)
        assert (head.status_code, head.headers["Content-Length"]) == (200, str(len(MODEL)))
        tampered = client.get(location.replace("Signature=", "Signature=0"))
        assert tampered.status_code == 403


# ---------------------------------------------------------------------------- errors


def test_errors_become_huggingface_hub_exceptions(hub: HubStandin, tmp_path: Path) -> None:
    with pytest.raises(RepositoryNotFoundError):
        download(hub, tmp_path, MODEL_FILE, repo_id="acme/missing")
    with pytest.raises(RepositoryNotFoundError):
        HfApi(endpoint=hub.hf_endpoint, token=False).model_info("acme/missing")
    with pytest.raises(RemoteEntryNotFoundError):
        download(hub, tmp_path, "missing.gguf")
    with pytest.raises(RevisionNotFoundError):
        download(hub, tmp_path, MODEL_FILE, revision="no-such-branch")
    statuses = [(r["path"].split("/resolve/")[0], r["status"]) for r in hub.requests()]
    assert statuses == [
        ("/acme/missing", 401),
        ("/api/models/acme/missing", 401),
        (f"/{REPO}", 404),
        (f"/{REPO}", 404),
    ]


def test_gated_and_private_repos(hub: HubStandin, tmp_path: Path) -> None:
    with pytest.raises(GatedRepoError) as anonymous:
        download(hub, tmp_path, MODEL_FILE, repo_id=GATED)
    assert anonymous.value.response.status_code == 401
    with pytest.raises(GatedRepoError) as not_granted:
        download(hub, tmp_path, MODEL_FILE, repo_id=GATED, token=KNOWN_TOKEN)
    assert not_granted.value.response.status_code == 403
    info = HfApi(endpoint=hub.hf_endpoint, token=False).model_info(GATED)
    assert info.gated == "manual"  # the listing of a gated repo is public, as on the hub

    with pytest.raises(RepositoryNotFoundError):
        download(hub, tmp_path, MODEL_FILE, repo_id=PRIVATE)
    with pytest.raises(HfHubHTTPError) as unknown_token:
        download(hub, tmp_path, MODEL_FILE, repo_id=REPO, token="hf_nobody_knows")
    assert not isinstance(unknown_token.value, RepositoryNotFoundError)
    assert unknown_token.value.response.status_code == 401
    assert unknown_token.value.server_message == "Invalid credentials in Authorization header"


def test_token_opens_a_gated_repo_and_stays_off_the_cdn(hub: HubStandin, tmp_path: Path) -> None:
    path = download(hub, tmp_path, MODEL_FILE, repo_id=GATED, token=TOKEN)
    assert path.read_bytes() == MODEL
    assert download(hub, tmp_path / "p", "README.md", repo_id=PRIVATE, token=TOKEN).exists()
    records = hub.requests()
    head = next(r for r in records if r["path"] == f"/{GATED}/resolve/main/{MODEL_FILE}")
    assert (head["status"], head["token"]) == (302, TOKEN)
    [cdn] = cdn_gets(records)
    assert (cdn["server"], cdn["authorization"], cdn["token"]) == ("cdn", False, None)


@pytest.mark.parametrize("status", [403, 500, 503])
def test_status_faults_reach_the_caller(hub: HubStandin, status: int) -> None:
    hub.fault("status", "*/resolve/*", times=1, status=status)
    with pytest.raises(HfHubHTTPError) as caught:
        get_hf_file_metadata(hf_hub_url(REPO, MODEL_FILE, endpoint=hub.hf_endpoint), token=False)
    assert caught.value.response.status_code == status


def test_headers_fault_changes_what_the_client_reads(hub: HubStandin) -> None:
    hub.fault(
        "headers",
        "*/resolve/*",
        method="HEAD",
        times=1,
        drop=["X-Linked-Etag"],
        set={"X-Linked-Size": "5"},
    )
    meta = get_hf_file_metadata(hf_hub_url(REPO, MODEL_FILE, endpoint=hub.hf_endpoint))
    assert meta.etag == git_blob_oid(lfs_pointer(sha256(MODEL), len(MODEL)))  # ETag instead
    assert meta.size == 5
    hub.fault("headers", "*/resolve/*", method="GET", times=1, drop=["Content-Length"])
    answer = one_shot.get(hub.resolve_url(REPO, "README.md"))
    assert "Content-Length" not in answer.headers
    assert answer.content == README


def test_rate_limit_answer_and_retry(hub: HubStandin, tmp_path: Path) -> None:
    hub.fault("status", "*/resolve/*", method="HEAD", times=1, status=429, retry_after=0)
    url = hf_hub_url(REPO, MODEL_FILE, endpoint=hub.hf_endpoint)
    with pytest.raises(HfHubHTTPError) as caught:
        get_hf_file_metadata(url, token=False)
    response = caught.value.response
    assert response.status_code == 429
    assert response.headers["Retry-After"] == "0"
    limit = parse_ratelimit_headers(response.headers)
    assert limit is not None
    assert (limit.resource_type, limit.remaining, limit.reset_in_seconds) == ("resolvers", 0, 0)

    # hf_hub_download asks once more, with retries, after a failed HEAD.
    hub.fault("status", "*/resolve/*", method="HEAD", times=1, status=429, retry_after=0)
    assert download(hub, tmp_path, MODEL_FILE).read_bytes() == MODEL
    heads = [r["status"] for r in hub.requests() if r["method"] == "HEAD"]
    assert heads == [429, 429, 302]


# ---------------------------------------------------------------------------- redirects, listings


def test_renamed_repo_and_extra_hops(hub: HubStandin, tmp_path: Path) -> None:
    assert download(hub, tmp_path, "README.md", repo_id=OLD_NAME).read_bytes() == README
    first, second = hub.requests()[:2]
    assert (first["path"], first["status"]) == (f"/{OLD_NAME}/resolve/main/README.md", 307)
    assert (second["path"], second["status"]) == (f"/{REPO}/resolve/main/README.md", 200)
    assert HfApi(endpoint=hub.hf_endpoint, token=False).model_info(OLD_NAME).id == REPO

    hub.reset()
    hub.fault("redirect", "/cdn/*", times=1, location="{hub}{path}?{query}")
    assert download(hub, tmp_path / "hop", MODEL_FILE).read_bytes() == MODEL
    hop, served = cdn_gets(hub.requests())
    assert (hop["server"], hop["status"]) == ("cdn", 307)
    assert (served["server"], served["status"], served["body_bytes"]) == ("hub", 200, len(MODEL))


def test_hostile_listing(hub: HubStandin, api: HfApi, tmp_path: Path) -> None:
    names = ["../evil.gguf", "/abs.gguf", "sub/../../x.gguf"]
    hub.fault("hostile_listing", repo=REPO, names=names)
    listed = {entry.path for entry in api.list_repo_tree(REPO, recursive=True)}
    assert set(names) <= listed
    siblings = api.model_info(REPO).siblings
    assert siblings is not None
    assert set(names) <= {sibling.rfilename for sibling in siblings}
    escaped = one_shot.request("HEAD", f"{hub.hf_endpoint}/{REPO}/resolve/main/..%2Fevil.gguf")
    assert escaped.status_code == 302
    absolute = one_shot.get(f"{hub.hf_endpoint}/{REPO}/resolve/main//abs.gguf")
    assert absolute.status_code == 302

    # huggingface_hub itself does not refuse such a name (on POSIX, hf_hub_download joins
    # it under local_dir as it is); httpx removes the dot segments from the URL, so the
    # hub is asked for revision "evil.gguf", which it does not have.
    with pytest.raises(RevisionNotFoundError):
        download(hub, tmp_path / "dl", "../evil.gguf")
    assert not (tmp_path / "evil.gguf").exists()
    assert hub.requests()[-1]["path"] == f"/{REPO}/resolve/evil.gguf"

    hub.clear_faults()
    assert not set(names) & {entry.path for entry in api.list_repo_tree(REPO, recursive=True)}


# ---------------------------------------------------------------------------- Ollama


def test_ollama_manifest_and_blobs(hub: HubStandin, registry: httpx.Client) -> None:
    manifest = registry.get("/v2/library/tiny/manifests/1b", headers={"Accept": MANIFEST_V2})
    assert manifest.status_code == 200
    assert manifest.headers["Content-Type"] == MANIFEST_V2
    assert manifest.headers["Docker-Content-Digest"] == f"sha256:{sha256(manifest.content)}"
    document = manifest.json()
    assert (document["schemaVersion"], document["mediaType"]) == (2, MANIFEST_V2)
    layers = document["layers"]
    assert [layer["mediaType"].rsplit(".", 1)[-1] for layer in layers] == [
        "model",
        "template",
        "params",
    ]
    assert layers[0] == {
        "mediaType": "application/vnd.ollama.image.model",
        "digest": f"sha256:{sha256(OLLAMA_MODEL)}",
        "size": len(OLLAMA_MODEL),
    }
    for layer in [*layers, document["config"]]:
        redirect = registry.get(f"/v2/library/tiny/blobs/{layer['digest']}")
        assert redirect.status_code == 307
        assert redirect.headers["Location"].startswith(f"{hub.cdn_url}/cdn/")
        blob = registry.get(f"/v2/library/tiny/blobs/{layer['digest']}", follow_redirects=True)
        assert blob.status_code == 200
        assert f"sha256:{sha256(blob.content)}" == layer["digest"]
        assert len(blob.content) == layer["size"]
    config = json.loads(
        registry.get(
            f"/v2/library/tiny/blobs/{document['config']['digest']}", follow_redirects=True
        ).content
    )
    assert config["model_format"] == "gguf"
    assert config["rootfs"]["diff_ids"] == [layer["digest"] for layer in layers]

    model_digest = layers[0]["digest"]
    part = registry.get(
        f"/v2/library/tiny/blobs/{model_digest}",
        headers={"Range": "bytes=100-"},
        follow_redirects=True,
    )
    assert (part.status_code, part.content) == (206, OLLAMA_MODEL[100:])
    head = registry.head(f"/v2/library/tiny/blobs/{model_digest}", follow_redirects=True)
    assert head.headers["Content-Length"] == str(len(OLLAMA_MODEL))


def test_ollama_errors(hub: HubStandin, registry: httpx.Client) -> None:
    def error(path: str) -> tuple[int, str]:
        answer = registry.get(path)
        return answer.status_code, answer.json()["errors"][0]["code"]

    assert error("/v2/library/tiny/manifests/7b") == (404, "MANIFEST_UNKNOWN")
    assert error("/v2/library/nothing/manifests/1b") == (404, "NAME_UNKNOWN")
    assert error(f"/v2/library/tiny/blobs/sha256:{'0' * 64}") == (404, "BLOB_UNKNOWN")
    hub.fault("status", "/v2/*", times=1, status=429, retry_after=3)
    limited = registry.get("/v2/library/tiny/manifests/1b")
    assert limited.status_code == 429
    assert limited.headers["Retry-After"] == "3"
    assert limited.json()["errors"][0]["code"] == "TOOMANYREQUESTS"


# ---------------------------------------------------------------------------- stalls


def test_hold_makes_a_read_timeout(hub: HubStandin, registry: httpx.Client) -> None:
    hub.fault("hold", "/v2/*/manifests/*", times=1)
    with pytest.raises(httpx.ReadTimeout):
        registry.get("/v2/library/tiny/manifests/1b", timeout=httpx.Timeout(5.0, read=1.0))
    hub.wait_for(lambda records: records[-1]["closed"] and records[-1]["status"] is None)

    hub.fault("hold", "*/resolve/*", times=1)
    with pytest.raises(httpx.ReadTimeout):
        get_hf_file_metadata(
            hf_hub_url(REPO, MODEL_FILE, endpoint=hub.hf_endpoint), token=False, timeout=1.0
        )

    hub.fault("hold", "/cdn/*", times=1, after_bytes=1000)
    location = get_hf_file_metadata(hf_hub_url(REPO, MODEL_FILE, endpoint=hub.hf_endpoint)).location
    assert read_until_stalled(location) == MODEL[:1000]


def read_until_stalled(url: str) -> bytes:
    """The body's bytes up to a 1 s read timeout."""
    received = bytearray()
    timeout = httpx.Timeout(5.0, read=1.0)
    with one_shot.stream("GET", url, timeout=timeout) as answer:
        try:
            for piece in answer.iter_bytes():
                received += piece
        except httpx.ReadTimeout:
            return bytes(received)
    raise AssertionError(f"the body ended after {len(received)} bytes without a stall")


def test_trickle_sends_slowly(hub: HubStandin) -> None:
    hub.fault("trickle", "*/resolve/*", times=1, chunk=8, interval=0.1)
    started = time.monotonic()
    answer = one_shot.get(hub.resolve_url(REPO, "README.md"))
    assert answer.content == README
    assert time.monotonic() - started >= 0.1 * (len(README) // 8)


def test_unknown_fault_kind_is_refused(hub: HubStandin) -> None:
    with pytest.raises(ValueError, match="unknown fault kind"):
        hub.fault("explode")


# ---------------------------------------------------------------------------- own processes


def test_default_models_are_the_real_files(tmp_path: Path) -> None:
    with HubStandin.start(tmp_path, hf=DEFAULT_HF_REPOS, ollama=DEFAULT_OLLAMA_MODELS) as hub:
        gemma_repo = "ggml-org/gemma-3-270m-GGUF"
        listed = {
            entry.path
            for entry in HfApi(endpoint=hub.hf_endpoint, token=False).list_repo_tree(
                gemma_repo, recursive=True
            )
        }
        assert {
            "gemma-3-270m-Q4_K_M.gguf",
            "mmproj-gemma-3-270m-f16.gguf",
            "Q8_0/gemma-3-270m-Q8_0-00001-of-00002.gguf",
            "Q8_0/gemma-3-270m-Q8_0-00002-of-00002.gguf",
        } <= listed
        meta = get_hf_file_metadata(
            hf_hub_url(gemma_repo, "gemma-3-270m-Q4_K_M.gguf", endpoint=hub.hf_endpoint),
            token=False,
        )
        assert meta.size == GEMMA3_GGUF.stat().st_size
        assert meta.etag is not None
        assert len(meta.etag) == 64
        with httpx.Client(base_url=hub.ollama_registry, trust_env=False) as client:
            manifest = client.get("/v2/library/gemma3/manifests/270m").json()
            model = manifest["layers"][0]
            assert model["digest"] == f"sha256:{meta.etag}"  # the same file, hashed once
            assert model["size"] == meta.size
            magic = client.get(
                f"/v2/library/gemma3/blobs/{model['digest']}",
                headers={"Range": "bytes=0-3"},
                follow_redirects=True,
            )
            assert (magic.status_code, magic.content) == (206, b"GGUF")
        smol = get_hf_file_metadata(
            hf_hub_url(
                "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF",
                SMOLLM2_GGUF.name,
                endpoint=hub.hf_endpoint,
            ),
            token=False,
        )
        assert smol.size == SMOLLM2_GGUF.stat().st_size


def test_sigterm_stops_it_with_a_connection_held(tmp_path: Path) -> None:
    hub = HubStandin.start(tmp_path, hf={REPO: tiny_repo()})
    try:
        hub.fault("hold", "*")
        with socket.create_connection(("127.0.0.1", hub.hub_port), timeout=5) as held:
            held.sendall(b"GET /api/models/acme/tiny-GGUF HTTP/1.1\r\nHost: x\r\n\r\n")
            hub.wait_for(lambda records: len(records) == 1)
            started = time.monotonic()
            output = hub.stop()
            assert hub.returncode == 0
            assert time.monotonic() - started < 3
            assert held.recv(1) == b""  # closed without an answer
    finally:
        hub.stop()
    assert "hub-standin stopped" in output
    assert "Traceback" not in output, output
