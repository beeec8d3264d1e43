"""A hostile Ollama registry, played by an in-process transport: manifests that are too
big, not JSON or lie about their layers, blobs that send too much or resume from the
wrong place, redirects that loop or leave HTTP. Each is refused with a clear error and
nothing under a final name; what the registry sends is read only as far as needed."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from slm_server.pull import ollama
from slm_server.pull.errors import PullError
from slm_server.pull.events import Event
from slm_server.pull.reference import OllamaReference
from slm_server.pull.result import Pulled
from slm_server.settings import PullSettings

BASE = "http://registry.test"
REF = OllamaReference("library", "m", "1")
MANIFEST_PATH = "/v2/library/m/manifests/1"
MODEL = "application/vnd.ollama.image.model"
BLOB = bytes(range(256)) * 64  # 16 KiB, not all alike: a misplaced byte shows
SIZE = len(BLOB)
DIGEST = hashlib.sha256(BLOB).hexdigest()
BLOB_PATH = f"/v2/library/m/blobs/sha256:{DIGEST}"
MIB = 1 << 20

Handler = Callable[[httpx.Request], httpx.Response]


class Registry:
    """The routes the test gives, and every request made."""

    def __init__(self, routes: dict[str, Handler]) -> None:
        self.routes = routes
        self.seen: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.scheme not in ("http", "https"):  # what the real transport says
            with httpx.HTTPTransport() as real:
                return real.handle_request(request)
        self.seen.append(request)
        handler = self.routes.get(request.url.path)
        if handler is None:
            return httpx.Response(404, json={"errors": [{"code": "NAME_UNKNOWN"}]})
        return handler(request)

    def paths(self) -> list[str]:
        return [r.url.path for r in self.seen]


class Counted:
    """A body of ``chunks`` pieces of ``size`` bytes, counting how many were read."""

    def __init__(self, size: int, chunks: int, first: bytes = b"") -> None:
        self.size, self.chunks, self.first, self.taken = size, chunks, first, 0

    def __iter__(self) -> Iterator[bytes]:
        if self.first:
            self.taken += 1
            yield self.first
        for _ in range(self.chunks):
            self.taken += 1
            yield b"x" * self.size


def manifest(*layers: dict[str, Any]) -> Handler:
    body = json.dumps({"schemaVersion": 2, "layers": list(layers)}).encode()
    return lambda _request: httpx.Response(200, content=body)


def layer(size: Any = SIZE, digest: Any = f"sha256:{DIGEST}", media: str = MODEL) -> dict[str, Any]:
    return {"mediaType": media, "digest": digest, "size": size}


def run(tmp_path: Path, registry: Registry) -> Pulled:
    settings = PullSettings(models_dir=tmp_path / "models", ollama_registry=BASE)
    client = ollama._Registry(BASE, REF, settings)
    client.client.close()
    client.client = httpx.Client(transport=httpx.MockTransport(registry), follow_redirects=True)
    seen: list[Event] = []
    try:
        return ollama._pull(client, REF, settings, seen.append, None, lambda: 0.0)
    finally:
        client.close()


def refused(tmp_path: Path, registry: Registry) -> PullError:
    with pytest.raises(PullError) as raised:
        run(tmp_path, registry)
    message = str(raised.value)
    assert "Traceback" not in message and message.isprintable(), message
    return raised.value


def final_files(tmp_path: Path) -> list[str]:
    models = tmp_path / "models"
    return sorted(
        p.relative_to(models).as_posix()
        for p in models.rglob("*")
        if p.is_file() and not p.relative_to(models).as_posix().startswith(".pull/")
    )


def partial(tmp_path: Path) -> Path:
    return tmp_path / "models" / ".pull" / "ollama" / f"sha256-{DIGEST}.partial"


def blob_answer(request: httpx.Request) -> httpx.Response:
    """An honest blob: 200, or 206 from where the Range asks."""
    asked = request.headers.get("Range")
    if asked is None:
        return httpx.Response(200, content=BLOB)
    start = int(asked.removeprefix("bytes=").rstrip("-"))
    headers = {"Content-Range": f"bytes {start}-{len(BLOB) - 1}/{len(BLOB)}"}
    return httpx.Response(206, content=BLOB[start:], headers=headers)


def test_an_honest_registry_is_pulled_through_the_stand_in_transport(tmp_path: Path) -> None:
    registry = Registry({MANIFEST_PATH: manifest(layer()), BLOB_PATH: blob_answer})
    pulled = run(tmp_path, registry)
    assert pulled.model.read_bytes() == BLOB
    assert final_files(tmp_path) == ["ollama/m-1.gguf"]


def test_a_manifest_over_one_mib_is_refused_after_reading_just_over_one_mib(
    tmp_path: Path,
) -> None:
    endless = Counted(64 * 1024, 100 * 16)  # 100 MiB on offer
    registry = Registry({MANIFEST_PATH: lambda _r: httpx.Response(200, content=endless)})
    error = refused(tmp_path, registry)
    assert error.kind == "hub_error" and "over 1 MiB" in str(error)
    assert endless.taken <= 17 + 1  # 1 MiB in 64 KiB pieces, and the one over
    assert registry.paths() == [MANIFEST_PATH]


@pytest.mark.parametrize(
    "body",
    [
        b"not json at all",
        b"\xff\xfe\x00garbage",
        b"[]",
        b'"layers"',
        b'{"layers": {"a": 1}}',
        b'{"layers": null}',
        json.dumps({"layers": [{"mediaType": MODEL, "size": 5}]}).encode(),
        json.dumps({"layers": [layer(digest="sha512:" + "ab" * 64)]}).encode(),
        json.dumps({"layers": [layer(digest="sha256:" + DIGEST.upper())]}).encode(),
        json.dumps({"layers": [layer(digest="sha256:" + DIGEST + "/../../x")]}).encode(),
        json.dumps({"layers": [layer(digest=["sha256:" + DIGEST])]}).encode(),
        json.dumps({"layers": [layer(size=-1)]}).encode(),
        json.dumps({"layers": [layer(size=True)]}).encode(),
        json.dumps({"layers": [layer(size="16384")]}).encode(),
        json.dumps({"layers": [layer(size=16384.0)]}).encode(),
        json.dumps({"layers": [layer(size=None)]}).encode(),
        json.dumps({"layers": [layer(), "a string"]}).encode(),
    ],
)
def test_a_manifest_that_is_not_one_is_refused_before_any_blob(tmp_path: Path, body: bytes) -> None:
    registry = Registry(
        {MANIFEST_PATH: lambda _r: httpx.Response(200, content=body), BLOB_PATH: blob_answer}
    )
    error = refused(tmp_path, registry)
    assert error.kind == "hub_error"
    assert registry.paths() == [MANIFEST_PATH]
    assert final_files(tmp_path) == []


def test_a_layer_of_a_petabyte_is_refused_by_the_disk_check_not_tried(tmp_path: Path) -> None:
    registry = Registry({MANIFEST_PATH: manifest(layer(size=10**15)), BLOB_PATH: blob_answer})
    error = refused(tmp_path, registry)
    assert error.kind == "no_space"
    assert registry.paths() == [MANIFEST_PATH]
    assert not partial(tmp_path).exists()


@pytest.mark.parametrize("models", [0, 2])
def test_a_manifest_with_other_than_one_model_layer_is_refused(tmp_path: Path, models: int) -> None:
    other = hashlib.sha256(b"other").hexdigest()
    layers = [layer(), layer(size=5, digest=f"sha256:{other}")][:models]
    layers.append(
        layer(size=4, digest=f"sha256:{DIGEST}", media="application/vnd.ollama.image.template")
    )
    registry = Registry({MANIFEST_PATH: manifest(*layers), BLOB_PATH: blob_answer})
    error = refused(tmp_path, registry)
    assert error.kind == "hub_error" and f"{models} model layers" in str(error)
    assert registry.paths() == [MANIFEST_PATH]


def test_a_blob_longer_than_its_manifest_says_is_stopped_not_written_out(tmp_path: Path) -> None:
    endless = Counted(MIB, 1024, first=BLOB)  # the blob, then a GiB more
    registry = Registry(
        {
            MANIFEST_PATH: manifest(layer()),
            BLOB_PATH: lambda _r: httpx.Response(200, content=endless),
        }
    )
    error = refused(tmp_path, registry)
    assert error.kind == "hub_error" and "more bytes than the manifest's" in str(error)
    assert endless.taken == 2  # the blob, and the first piece too many
    assert partial(tmp_path).stat().st_size <= len(BLOB)
    assert final_files(tmp_path) == []


@pytest.mark.parametrize(
    "content_range",
    [
        f"bytes 0-{len(BLOB) - 1}/{len(BLOB)}",  # from the start, as if no Range were sent
        f"bytes 5000-{len(BLOB) - 1}/{len(BLOB)}",  # further on than asked
        None,  # a 206 that says nothing of where it starts
        "bytes */16384",
    ],
)
def test_a_resume_answered_from_another_offset_leaves_the_partial_file_as_it_was(
    tmp_path: Path, content_range: str | None
) -> None:
    have = 4096
    partial(tmp_path).parent.mkdir(parents=True)
    partial(tmp_path).write_bytes(BLOB[:have])

    def elsewhere(request: httpx.Request) -> httpx.Response:
        assert request.headers["Range"] == f"bytes={have}-"
        start = (
            int(content_range.split()[1].split("-")[0])
            if content_range and "*" not in content_range
            else 0
        )
        headers = {"Content-Range": content_range} if content_range else {}
        return httpx.Response(206, content=BLOB[start:], headers=headers)

    registry = Registry({MANIFEST_PATH: manifest(layer()), BLOB_PATH: elsewhere})
    error = refused(tmp_path, registry)
    assert error.kind == "hub_error" and f"asked for the bytes from {have}" in str(error)
    assert partial(tmp_path).read_bytes() == BLOB[:have]  # nothing written over it
    assert final_files(tmp_path) == []

    # An honest registry then resumes from it.
    registry = Registry({MANIFEST_PATH: manifest(layer()), BLOB_PATH: blob_answer})
    assert run(tmp_path, registry).model.read_bytes() == BLOB
    [asked] = [r.headers.get("Range") for r in registry.seen if r.url.path == BLOB_PATH]
    assert asked == f"bytes={have}-"


def test_a_redirect_loop_is_given_up_after_a_bounded_number_of_requests(tmp_path: Path) -> None:
    loop = f"{BASE}{BLOB_PATH}"
    registry = Registry(
        {
            MANIFEST_PATH: manifest(layer()),
            BLOB_PATH: lambda _r: httpx.Response(307, headers={"Location": loop}),
        }
    )
    error = refused(tmp_path, registry)
    assert error.kind == "hub_error" and "redirect" in str(error).lower()
    assert 1 < registry.paths().count(BLOB_PATH) <= 21
    assert final_files(tmp_path) == []


@pytest.mark.parametrize(
    "location",
    [
        "file:///etc/passwd",
        "ftp://registry.test/blob",
        "gopher://x/",
        "data:,hello",
        "http://[::1",
    ],
)
def test_a_redirect_out_of_http_is_refused(tmp_path: Path, location: str) -> None:
    registry = Registry(
        {
            MANIFEST_PATH: manifest(layer()),
            BLOB_PATH: lambda _r: httpx.Response(302, headers={"Location": location}),
        }
    )
    error = refused(tmp_path, registry)
    assert error.kind == "hub_error"
    assert registry.paths() == [MANIFEST_PATH, BLOB_PATH]
    assert final_files(tmp_path) == []
    assert not partial(tmp_path).exists() or partial(tmp_path).stat().st_size == 0


def test_a_registry_error_message_is_escaped_for_the_terminal(tmp_path: Path) -> None:
    hostile = "\x1b]0;owned\x07\x1b[2J\rfine\u202e"
    registry = Registry(
        {
            MANIFEST_PATH: lambda _r: httpx.Response(
                500, json={"errors": [{"code": "UNKNOWN", "message": hostile}]}
            )
        }
    )
    with pytest.raises(PullError) as raised:
        run(tmp_path, registry)
    # The error keeps the registry's words (the API sends them JSON-escaped); the
    # command line escapes them (tests/unit/pull/test_hostile_view.py).
    assert hostile in str(raised.value)


def answering(body: bytes) -> Handler:
    def answer(_request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body)

    return answer


def test_a_manifest_repeating_a_text_layer_has_only_the_first_fetched(tmp_path: Path) -> None:
    templates = [f"{{{{ .Prompt }}}} {i}".encode() for i in range(50)]
    routes: dict[str, Handler] = {BLOB_PATH: blob_answer}
    layers = [layer()]
    for text in templates:
        digest = hashlib.sha256(text).hexdigest()
        routes[f"/v2/library/m/blobs/sha256:{digest}"] = answering(text)
        layers.append(
            layer(
                size=len(text),
                digest=f"sha256:{digest}",
                media="application/vnd.ollama.image.template",
            )
        )
    routes[MANIFEST_PATH] = manifest(*layers)
    registry = Registry(routes)
    pulled = run(tmp_path, registry)
    assert [p.name for p in pulled.extras] == ["m-1.ollama-template"]
    assert pulled.extras[0].read_bytes() == templates[0]
    assert len(registry.seen) == 3  # the manifest, the model, one template


@pytest.mark.parametrize("status", [404, 500])
def test_an_endless_error_body_is_read_no_further_than_its_start(
    tmp_path: Path, status: int
) -> None:
    endless = Counted(64 * 1024, 1600, first=b'{"errors": [{"code": "X", "message": "')
    registry = Registry({MANIFEST_PATH: lambda _r: httpx.Response(status, content=endless)})
    error = refused(tmp_path, registry)
    assert error.kind in ("not_found", "hub_error") and f"HTTP {status}" in str(error)
    assert endless.taken <= 2  # of 100 MiB on offer
