"""A local stand-in for the Hugging Face Hub and Ollama's registry, run as a real process.

    python -m tests.fakes.hub_standin --config CONFIG.json --port-file PORTS.json
        [--hub-port 0] [--cdn-port 0] [--parent-pid PID]

Two listening sockets in one process: the "hub" (huggingface.co and registry.ollama.ai
routes, and the control API under ``/_control``) on 127.0.0.1, and the "cdn" (where LFS
files and Ollama blobs are served from, as cdn-lfs.hf.co and Cloudflare R2 do) on
127.0.0.2 when that address can be bound, else 127.0.0.1: the host differs (and the port
always does), so huggingface_hub drops the Authorization header on the redirect to it, as
it does for the real CDN. Once both listen, the ports are written to ``--port-file`` as
``{"hub": port, "cdn": port, "cdn_host": host, "pid": pid}``. SIGTERM or SIGINT stops it
(exit code 0); so does the death of ``--parent-pid``.

Tests drive it through ``tests.fakes.hub_control``; the configuration (repos, models,
tokens) is described there. Routes, as huggingface_hub 1.16.1 and Ollama request them:

Hugging Face (``{id}`` is ``owner/name``; ``{rev}`` a branch or the full commit sha,
percent-encoded as huggingface_hub sends it):
    GET  /api/models/{id}                     model_info (``?blobs=true``: sizes, blob ids, lfs)
    GET  /api/models/{id}/revision/{rev}      the same at a revision
    GET  /api/models/{id}/tree/{rev}[/{path}] list_repo_tree (``recursive``, ``expand``,
                                              ``cursor``; ``Link: <...>; rel="next"``)
    POST /api/models/{id}/paths-info/{rev}    get_paths_info (form: paths=..., expand=...)
    HEAD|GET /{id}/resolve/{rev}/{path}       LFS file: 302 to the CDN with X-Repo-Commit,
                                              X-Linked-Etag, X-Linked-Size, ETag (git oid);
                                              other file: 200 with the bytes, ETag = git oid
    HEAD|GET /cdn/repos/{id}/{sha256}?...     the CDN: bytes by sha256, with Range
Errors carry the hub's X-Error-Code / X-Error-Message headers and a JSON {"error": ...}
body: an unknown (or private, without the right token) repo is 401 RepoNotFound, an
unknown revision 404 RevisionNotFound, a missing file 404 EntryNotFound, a gated repo's
file 401 GatedRepo without a token and 403 GatedRepo with a token not granted, a token the
hub does not know 401 "Invalid credentials in Authorization header". A renamed repo
answers 307 with a relative Location to its new name, as the hub does.

Ollama (``{name}`` is ``namespace/model``):
    GET  /v2/                                 200 {}
    HEAD|GET /v2/{name}/manifests/{tag}       the manifest (docker manifest v2), with
                                              Docker-Content-Digest; 404 MANIFEST_UNKNOWN /
                                              NAME_UNKNOWN in the registry's error format
    HEAD|GET /v2/{name}/blobs/sha256:{hex}    307 to the CDN (as the registry redirects to R2)
    HEAD|GET /cdn/ollama/docker/registry/v2/blobs/sha256/{xx}/{hex}/data?X-Amz-...

Every route is answered on both ports (so a fault can redirect from one host to the
other); ``/_control`` only on the hub port.

Control API (hub port; JSON in and out):
    GET    /_control/health     {"pid", "hub", "cdn", "cdn_host"}
    POST   /_control/faults     add faults (a list, or one object); answers them with ids
    GET    /_control/faults     the faults installed, with what remains of each
    DELETE /_control/faults     remove all faults
    GET    /_control/requests   the request log (see ``RequestLog``)
    POST   /_control/reset      remove faults, clear the log, restore the settings
    POST   /_control/settings   {"page_size": n}: entries per page of a tree listing

A fault is {"kind": ..., "path": fnmatch pattern on the URL path as sent (percent-encoded,
no query; "*" also matches "/"; default "*"),
"method": "GET"|"HEAD"|... (default: any; GET for the body faults), "times": n (default:
every matching request), ...parameters}. Kinds (see ``FAULT_KINDS``):
    status          answer ``status`` with the side's own error headers and body (HF
                    X-Error-Code headers and {"error"}; Ollama {"errors": [...]}; the CDN an
                    S3-style XML error). ``retry_after`` (seconds, 429/503), ``error_code`` and
                    ``message`` (HF X-Error-Code / X-Error-Message), ``headers``, ``body``.
    cut_after       send ``bytes`` bytes of the body, then close the connection (``reset``:
                    true sends a TCP RST instead of a FIN). The count is of this response's
                    body, so a Range request that resumes continues with correct bytes.
    corrupt         flip the byte at file offset ``offset`` (default 0), size unchanged.
    trickle         headers, then ``chunk`` bytes (default 1) every ``interval`` s (0.5).
    hold            accept the request and never answer (``after_headers``: send the
                    headers, then nothing; ``after_bytes``: headers and n body bytes, then
                    nothing), until the client goes away or the stand-in stops.
    redirect        answer ``status`` (default 307) with Location ``location``, in which
                    {hub}, {cdn}, {path} (raw URL path) and {query} are replaced; or, with
                    ``replace``: [old, new], the request's own path with old replaced by new
                    (a relative redirect, as the hub's for a renamed repo).
    ignore_range    answer 200 with the whole body even when a Range was sent.
    headers         ``set`` {name: value} and ``drop`` [names] on the response's headers
                    (without Content-Length the body is delimited by closing the connection).
    hostile_listing the listings of repo ``repo`` (model_info, tree, paths-info) include
                    files named ``names`` (e.g. "../evil.gguf", "/abs.gguf"), ``size`` bytes
                    each (default 16), LFS unless ``lfs`` is false; resolve serves them while
                    the fault is installed.
"""

from __future__ import annotations

import argparse
import base64
import fnmatch
import hashlib
import hmac
import json
import os
import select
import signal
import socket
import struct
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType
from typing import Any, cast
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit

JSON = dict[str, Any]
HUB_HOST = "127.0.0.1"
CDN_HOSTS = ("127.0.0.2", "127.0.0.1")
READ_CHUNK = 256 * 1024
DEFAULT_PAGE_SIZE = 1000
DATE = "2025-08-14T09:26:12.000Z"
LAST_MODIFIED_HTTP = "Thu, 14 Aug 2025 09:26:12 GMT"
MANIFEST_V2 = "application/vnd.docker.distribution.manifest.v2+json"
IMAGE_CONFIG = "application/vnd.docker.container.image.v1+json"
LFS_POINTER = "version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n"
GITATTRIBUTES = (
    "*.7z filter=lfs diff=lfs merge=lfs -text\n"
    "*.bin filter=lfs diff=lfs merge=lfs -text\n"
    "*.gguf filter=lfs diff=lfs merge=lfs -text\n"
    "*.safetensors filter=lfs diff=lfs merge=lfs -text\n"
    "*.zip filter=lfs diff=lfs merge=lfs -text\n"
)
BODY_KINDS = frozenset({"cut_after", "corrupt", "trickle", "ignore_range"})
FAULT_KINDS = frozenset({"status", "hold", "redirect", "headers", "hostile_listing", *BODY_KINDS})
SIGNING_KEY = b"hub-standin"
TEXT_SUFFIXES = (".md", ".txt", ".json", ".jinja", ".yaml", ".yml", ".py", ".gitattributes")


# ---------------------------------------------------------------------------- git / lfs


def git_blob_oid(data: bytes) -> str:
    """The git object id of a blob holding ``data`` (``git hash-object``)."""
    return hashlib.sha1(b"blob %d\x00" % len(data) + data, usedforsecurity=False).hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    """The Git LFS pointer file git stores for a file of this sha256 and size."""
    return LFS_POINTER.format(sha256=sha256, size=size).encode()


# ---------------------------------------------------------------------------- blobs


class Blob:
    """Bytes served: a file on disk (read on demand) or bytes in memory. The sha256 and
    the git oid are computed once, on first use, by whichever thread needs them first."""

    def __init__(self, *, source: Path | None = None, data: bytes | None = None) -> None:
        if (source is None) == (data is None):
            raise ValueError("a blob has a source file or data, not both")
        self.source = source
        self.data = data
        self.size = source.stat().st_size if source is not None else len(cast(bytes, data))
        self._lock = threading.Lock()
        self._sha256: str | None = None
        self._git_oid: str | None = None

    def chunks(self, start: int, end: int) -> Iterator[bytes]:
        """The bytes [start, end) in pieces of at most READ_CHUNK."""
        if self.data is not None:
            for offset in range(start, end, READ_CHUNK):
                yield self.data[offset : min(end, offset + READ_CHUNK)]
            return
        assert self.source is not None
        with self.source.open("rb") as handle:
            handle.seek(start)
            remaining = end - start
            while remaining > 0:
                piece = handle.read(min(READ_CHUNK, remaining))
                if not piece:
                    raise OSError(f"{self.source} shrank while being served")
                remaining -= len(piece)
                yield piece

    def read(self) -> bytes:
        return b"".join(self.chunks(0, self.size))

    @property
    def sha256(self) -> str:
        with self._lock:
            if self._sha256 is None:
                digest = hashlib.sha256()
                for piece in self.chunks(0, self.size):
                    digest.update(piece)
                self._sha256 = digest.hexdigest()
            return self._sha256

    @property
    def git_oid(self) -> str:
        """The git oid of the bytes themselves (what a non-LFS file's oid is)."""
        with self._lock:
            if self._git_oid is None:
                digest = hashlib.sha1(b"blob %d\x00" % self.size, usedforsecurity=False)
                for piece in self.chunks(0, self.size):
                    digest.update(piece)
                self._git_oid = digest.hexdigest()
            return self._git_oid


EMPTY = Blob(data=b"")
_BLOBS_BY_PATH: dict[str, Blob] = {}


def blob_from(spec: Mapping[str, Any]) -> Blob:
    """A blob from {"source": path} or {"data_b64": ...}; one Blob per file path."""
    if spec.get("source") is not None:
        path = str(Path(spec["source"]).resolve())
        if path not in _BLOBS_BY_PATH:
            _BLOBS_BY_PATH[path] = Blob(source=Path(path))
        return _BLOBS_BY_PATH[path]
    return Blob(data=base64.b64decode(spec.get("data_b64", "")))


# ---------------------------------------------------------------------------- content


@dataclass
class HfFile:
    path: str
    blob: Blob
    lfs: bool

    @property
    def oid(self) -> str:
        """The git oid the hub reports: of the pointer file for an LFS file."""
        if self.lfs:
            return git_blob_oid(self.pointer)
        return self.blob.git_oid

    @property
    def pointer(self) -> bytes:
        return lfs_pointer(self.blob.sha256, self.blob.size)

    def entry(self, commit: str, expand: bool) -> JSON:
        item: JSON = {"type": "file", "oid": self.oid, "size": self.blob.size}
        if self.lfs:
            item["lfs"] = {
                "oid": self.blob.sha256,
                "size": self.blob.size,
                "pointerSize": len(self.pointer),
            }
        item["path"] = self.path
        if expand:
            item["lastCommit"] = last_commit(commit)
            item["securityFileStatus"] = {
                "status": "safe",
                "avScan": {"virusFound": False, "virusNames": None},
                "pickleImportScan": None,
            }
        return item

    def sibling(self, blobs: bool) -> JSON:
        item: JSON = {"rfilename": self.path}
        if blobs:
            item["blobId"] = self.oid
            item["size"] = self.blob.size
            if self.lfs:
                item["lfs"] = {
                    "sha256": self.blob.sha256,
                    "size": self.blob.size,
                    "pointerSize": len(self.pointer),
                }
        return item


def last_commit(commit: str) -> JSON:
    return {"id": commit, "title": "Upload folder using huggingface_hub", "date": DATE}


def tree_oid(commit: str, path: str) -> str:
    return hashlib.sha1(f"tree {commit} {path}".encode(), usedforsecurity=False).hexdigest()


@dataclass
class HfRepo:
    repo_id: str
    commit: str
    branches: dict[str, str]
    files: dict[str, HfFile]
    gated: str | bool
    private: bool
    tokens: frozenset[str]
    extra: JSON

    @classmethod
    def from_config(cls, repo_id: str, spec: Mapping[str, Any]) -> HfRepo:
        commit = spec.get("commit") or hashlib.sha1(repo_id.encode()).hexdigest()
        files: dict[str, HfFile] = {}
        if spec.get("gitattributes", True):
            files[".gitattributes"] = HfFile(
                ".gitattributes", Blob(data=GITATTRIBUTES.encode()), lfs=False
            )
        for item in spec.get("files", []):
            blob = blob_from(item)
            lfs = item.get("lfs")
            if lfs is None:
                lfs = not item["path"].endswith(TEXT_SUFFIXES)
            files[item["path"]] = HfFile(item["path"], blob, bool(lfs))
        gated = spec.get("gated", False)
        return cls(
            repo_id=repo_id,
            commit=commit,
            branches=dict(spec.get("branches") or {"main": commit}),
            files=files,
            gated="manual" if gated is True else gated,
            private=bool(spec.get("private", False)),
            tokens=frozenset(spec.get("tokens", ())),
            extra=dict(spec.get("extra", {})),
        )

    def resolve(self, revision: str) -> str | None:
        if revision in self.branches:
            return self.branches[revision]
        if revision == self.commit or revision in self.branches.values():
            return revision
        return None

    def directories(self) -> set[str]:
        found: set[str] = set()
        for path in self.files:
            parts = path.split("/")[:-1]
            for depth in range(1, len(parts) + 1):
                found.add("/".join(parts[:depth]))
        return found


@dataclass
class OllamaModel:
    name: str
    tag: str
    layers: list[tuple[str, Blob]]
    config: Blob

    @classmethod
    def from_config(cls, reference: str, spec: Mapping[str, Any]) -> OllamaModel:
        name, _, tag = reference.partition(":")
        layers = [(item["mediaType"], blob_from(item)) for item in spec.get("layers", [])]
        config = dict(spec.get("config", {}))
        config.setdefault(
            "rootfs",
            {"type": "layers", "diff_ids": [f"sha256:{blob.sha256}" for _, blob in layers]},
        )
        return cls(name, tag or "latest", layers, Blob(data=json.dumps(config).encode()))

    @property
    def manifest(self) -> bytes:
        document = {
            "schemaVersion": 2,
            "mediaType": MANIFEST_V2,
            "config": {
                "mediaType": IMAGE_CONFIG,
                "digest": f"sha256:{self.config.sha256}",
                "size": self.config.size,
            },
            "layers": [
                {"mediaType": media, "digest": f"sha256:{blob.sha256}", "size": blob.size}
                for media, blob in self.layers
            ],
        }
        return json.dumps(document, separators=(",", ":")).encode()

    def blobs(self) -> Iterator[Blob]:
        yield self.config
        for _, blob in self.layers:
            yield blob


class Store:
    """What the stand-in serves, from the configuration file."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        hf = config.get("hf", {})
        self.repos = {repo_id: HfRepo.from_config(repo_id, spec) for repo_id, spec in hf.items()}
        self.renames: dict[str, str] = dict(config.get("renames", {}))
        tokens = set(config.get("tokens", ()))
        for repo in self.repos.values():
            tokens.update(repo.tokens)
        self.tokens = frozenset(tokens)
        self.models: dict[str, dict[str, OllamaModel]] = {}
        for reference, spec in config.get("ollama", {}).items():
            model = OllamaModel.from_config(reference, spec)
            self.models.setdefault(model.name, {})[model.tag] = model
        self.page_size = int(config.get("page_size", DEFAULT_PAGE_SIZE))

    def all_blobs(self) -> Iterator[Blob]:
        for repo in self.repos.values():
            for item in repo.files.values():
                yield item.blob
        for tags in self.models.values():
            for model in tags.values():
                yield from model.blobs()

    def blob_by_sha256(self, sha256: str, extra: list[Blob]) -> Blob | None:
        candidates = [*extra, *self.all_blobs()]
        # Blobs already hashed first: a request for one file hashes no other.
        candidates.sort(key=lambda blob: blob._sha256 is None)
        for blob in candidates:
            if blob.sha256 == sha256:
                return blob
        return None


# ---------------------------------------------------------------------------- faults and log


@dataclass
class Fault:
    id: int
    kind: str
    path: str
    method: str | None
    times: int | None
    params: JSON
    hits: int = 0

    def matches(self, method: str, path: str) -> bool:
        if self.times is not None and self.hits >= self.times:
            return False
        wanted = self.method or ("GET" if self.kind in BODY_KINDS else None)
        if wanted is not None and wanted.upper() != method:
            return False
        return fnmatch.fnmatchcase(path, self.path)

    def public(self) -> JSON:
        return {
            "id": self.id,
            "kind": self.kind,
            "path": self.path,
            "method": self.method,
            "times": self.times,
            "hits": self.hits,
            **self.params,
        }


class FaultBook:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._faults: list[Fault] = []
        self._next_id = 1

    def add(self, specs: list[JSON]) -> list[JSON]:
        faults: list[Fault] = []
        for spec in specs:
            params = dict(spec)
            kind = params.pop("kind", None)
            if kind not in FAULT_KINDS:
                raise ValueError(f"unknown fault kind {kind!r}; known: {sorted(FAULT_KINDS)}")
            times = params.pop("times", None)
            if times is not None and (not isinstance(times, int) or times < 1):
                raise ValueError(f"times must be a positive integer, not {times!r}")
            method = params.pop("method", None)
            faults.append(Fault(0, kind, str(params.pop("path", "*")), method, times, params))
        with self._lock:
            for fault in faults:
                fault.id = self._next_id
                self._next_id += 1
            self._faults.extend(faults)
        return [fault.public() for fault in faults]

    def take(self, method: str, path: str) -> dict[str, Fault]:
        """For each kind, the first installed fault that matches; each one taken counts a hit."""
        chosen: dict[str, Fault] = {}
        with self._lock:
            for fault in self._faults:
                if fault.kind == "hostile_listing" or fault.kind in chosen:
                    continue
                if fault.matches(method, path):
                    fault.hits += 1
                    chosen[fault.kind] = fault
        return chosen

    def hostile(self, repo_id: str, method: str, path: str, *, listing: bool) -> list[HfFile]:
        """The hostile files added to ``repo_id``: counted as a hit on a listing request."""
        files: list[HfFile] = []
        with self._lock:
            for fault in self._faults:
                if fault.kind != "hostile_listing" or fault.params.get("repo") != repo_id:
                    continue
                if listing:
                    if not fault.matches(method, path):
                        continue
                    fault.hits += 1
                size = int(fault.params.get("size", 16))
                for name in fault.params.get("names", []):
                    data = (f"hostile:{name}:".encode() * (size // 8 + 1))[:size]
                    lfs = bool(fault.params.get("lfs", True))
                    files.append(HfFile(str(name), Blob(data=data), lfs))
        return files

    def listing(self) -> list[JSON]:
        with self._lock:
            return [fault.public() for fault in self._faults]

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()


class RequestLog:
    """Every request but the control API's, in arrival order. A record is made when the
    request arrives (``status`` None until the status line is sent) and completed when the
    answer is: {"id", "server" ("hub"|"cdn"), "method", "path" (path and query as sent),
    "range", "accept", "authorization" (bool), "token", "user_agent", "status",
    "content_length" (as declared), "body_bytes" (body bytes written), "completed" (the
    whole body was written), "closed" (the stand-in closed the connection: a cut, a client
    gone, the stand-in stopping), "faults" (kinds applied), "started", "finished"}."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: list[JSON] = []

    def start(self, record: JSON) -> JSON:
        with self._lock:
            record["id"] = len(self._records) + 1
            self._records.append(record)
        return record

    def update(self, record: JSON, **fields: Any) -> None:
        with self._lock:
            record.update(fields)

    def snapshot(self) -> list[JSON]:
        with self._lock:
            return [dict(record) for record in self._records]

    def clear(self) -> None:
        with self._lock:
            self._records.clear()


# ---------------------------------------------------------------------------- the app


class App:
    def __init__(self, config: Mapping[str, Any]) -> None:
        self.store = Store(config)
        self.faults = FaultBook()
        self.log = RequestLog()
        self.page_size = self.store.page_size
        self.stopping = threading.Event()
        self.hub_url = ""
        self.cdn_url = ""
        self.ports: JSON = {}


@dataclass
class Reply:
    status: int
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: Blob = EMPTY
    start: int = 0
    end: int | None = None

    def header(self, name: str) -> str | None:
        for key, value in self.headers:
            if key.lower() == name.lower():
                return value
        return None


class Aborted(Exception):
    """The connection is to be closed without finishing the answer."""


def json_reply(status: int, document: Any, headers: list[tuple[str, str]] | None = None) -> Reply:
    body = json.dumps(document).encode()
    return Reply(
        status,
        [("Content-Type", "application/json; charset=utf-8"), *(headers or [])],
        Blob(data=body),
    )


def text_reply(status: int, text: str, content_type: str = "text/plain; charset=utf-8") -> Reply:
    return Reply(status, [("Content-Type", content_type)], Blob(data=text.encode()))


def hf_error(
    status: int,
    code: str | None,
    message: str,
    headers: list[tuple[str, str]] | None = None,
) -> Reply:
    extra = [("X-Error-Message", message), *(headers or [])]
    if code is not None:
        extra.insert(0, ("X-Error-Code", code))
    return json_reply(status, {"error": message}, extra)


def repo_not_found() -> Reply:
    return hf_error(
        401,
        "RepoNotFound",
        "Repository not found",
        [("WWW-Authenticate", 'Bearer realm="Authentication required", charset="UTF-8"')],
    )


def invalid_credentials() -> Reply:
    return hf_error(401, None, "Invalid credentials in Authorization header")


def entry_not_found(commit: str | None) -> Reply:
    headers = [("X-Repo-Commit", commit)] if commit else []
    return hf_error(404, "EntryNotFound", "Entry not found", headers)


def revision_not_found(revision: str) -> Reply:
    return hf_error(404, "RevisionNotFound", f"Invalid rev id: {revision}")


def ratelimit_headers(resource: str, retry_after: int) -> list[tuple[str, str]]:
    return [
        ("Retry-After", str(retry_after)),
        ("RateLimit", f'"{resource}";r=0;t={retry_after}'),
        ("RateLimit-Policy", f'"fixed window";"{resource}";q=500;w=300'),
    ]


def ollama_error(status: int, code: str, message: str, detail: Any = None) -> Reply:
    return json_reply(
        status,
        {"errors": [{"code": code, "message": message, "detail": detail}]},
        [("Docker-Distribution-Api-Version", "registry/2.0")],
    )


def cdn_error(status: int, code: str, message: str) -> Reply:
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{message}</Message></Error>"
    )
    return text_reply(status, body, "application/xml")


REASONS = {
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    416: "Range Not Satisfiable",
    429: "Too Many Requests",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}


def fault_status_reply(path: str, params: JSON) -> Reply:
    """The error a ``status`` fault answers, in the words of the side the path is on."""
    status = int(params.get("status", 500))
    retry_after = int(params.get("retry_after", 1))
    message = params.get("message")
    if path.startswith("/cdn/"):
        codes = {
            401: "Unauthorized",
            403: "AccessDenied",
            404: "NoSuchKey",
            429: "SlowDown",
            500: "InternalError",
            503: "SlowDown",
        }
        reply = cdn_error(
            status, codes.get(status, "InternalError"), message or REASONS.get(status, "Error")
        )
        if status in (429, 503):
            reply.headers.append(("Retry-After", str(retry_after)))
    elif path.startswith("/v2/"):
        if status == 401:
            reply = ollama_error(401, "UNAUTHORIZED", message or "authentication required")
            reply.headers.append(
                (
                    "WWW-Authenticate",
                    'Bearer realm="https://ollama.com:443/token",service="ollama.com"',
                )
            )
        elif status == 403:
            reply = ollama_error(
                403, "DENIED", message or "requested access to the resource is denied"
            )
        elif status == 404:
            if "/manifests/" in path:
                reply = ollama_error(404, "MANIFEST_UNKNOWN", message or "manifest unknown")
            elif "/blobs/" in path:
                reply = ollama_error(404, "BLOB_UNKNOWN", message or "blob unknown to registry")
            else:
                reply = ollama_error(
                    404, "NAME_UNKNOWN", message or "repository name not known to registry"
                )
        elif status == 429:
            reply = ollama_error(429, "TOOMANYREQUESTS", message or "too many requests")
            reply.headers.append(("Retry-After", str(retry_after)))
        else:
            reply = ollama_error(status, "UNKNOWN", message or REASONS.get(status, "unknown error"))
            if status == 503:
                reply.headers.append(("Retry-After", str(retry_after)))
    else:
        code = params.get("error_code")
        if status == 401:
            reply = hf_error(401, code or "RepoNotFound", message or "Repository not found")
        elif status == 403:
            reply = hf_error(403, code, message or "Forbidden")
        elif status == 404:
            reply = hf_error(404, code or "EntryNotFound", message or "Entry not found")
        elif status == 429:
            resource = "resolvers" if "/resolve/" in path else "api"
            reply = hf_error(
                429,
                code,
                message or "You have exceeded our hourly quotas for action: resolvers.",
                ratelimit_headers(resource, retry_after),
            )
        elif status == 500:
            reply = hf_error(
                500,
                code,
                message or "Internal Error - We're working hard to fix this as soon as possible!",
            )
        elif status >= 502:
            reply = text_reply(status, message or REASONS.get(status, "Error"))
            if code is not None:
                reply.headers.append(("X-Error-Code", code))
            if status == 503:
                reply.headers.append(("Retry-After", str(retry_after)))
        else:
            reply = hf_error(status, code, message or REASONS.get(status, "Error"))
    if "body" in params:
        reply.body = Blob(data=str(params["body"]).encode())
    reply.headers.extend((str(k), str(v)) for k, v in params.get("headers", {}).items())
    return reply


@dataclass
class Ctx:
    """One request, as the routes see it."""

    app: App
    method: str
    raw_path: str
    path: str
    query: dict[str, list[str]]
    raw_query: str
    headers: Mapping[str, str]  # names in lower case
    body: bytes
    token: str | None
    faults: dict[str, Fault]

    def param(self, name: str) -> str | None:
        values = self.query.get(name)
        return values[-1] if values else None

    def flag(self, name: str) -> bool:
        return (self.param(name) or "").lower() in ("1", "true", "yes")


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """(start, end exclusive) for a single satisfiable ``bytes=`` range; None to ignore the
    header (absent, malformed or several ranges: RFC 9110 lets a server answer 200).
    Raises ValueError when the range cannot be satisfied (416)."""
    if not header:
        return None
    unit, _, spec = header.strip().partition("=")
    if unit.strip().lower() != "bytes" or "," in spec:
        return None
    first, dash, last = spec.strip().partition("-")
    if not dash:
        return None
    first, last = first.strip(), last.strip()
    if not (first.isdigit() or first == "") or not (last.isdigit() or last == ""):
        return None
    if first == "":
        if last == "":
            return None
        suffix = int(last)
        if suffix == 0 or size == 0:
            raise ValueError("unsatisfiable")
        return max(0, size - suffix), size
    start = int(first)
    if last != "" and int(last) < start:
        return None
    if start >= size:
        raise ValueError("unsatisfiable")
    end = size if last == "" else min(int(last) + 1, size)
    return start, end


def content_reply(ctx: Ctx, blob: Blob, headers: list[tuple[str, str]], *, cdn: bool) -> Reply:
    """200 with the blob, or 206 / 416 for a Range header (unless ``ignore_range``)."""
    headers = [*headers, ("Accept-Ranges", "bytes")]
    requested = None if "ignore_range" in ctx.faults else ctx.headers.get("range")
    try:
        span = parse_range(requested, blob.size)
    except ValueError:
        reply = (
            cdn_error(416, "InvalidRange", "The requested range is not satisfiable")
            if cdn
            else Reply(416, [])
        )
        reply.headers.extend(headers)
        reply.headers.append(("Content-Range", f"bytes */{blob.size}"))
        return reply
    if span is None:
        return Reply(200, headers, blob, 0, blob.size)
    start, end = span
    headers.append(("Content-Range", f"bytes {start}-{end - 1}/{blob.size}"))
    return Reply(206, headers, blob, start, end)


def content_disposition(name: str) -> str:
    return f"inline; filename*=UTF-8''{quote(name)}; filename=\"{name}\";"


def sign(*parts: str) -> str:
    return hmac.new(SIGNING_KEY, "|".join(parts).encode(), hashlib.sha256).hexdigest()


# ---------------------------------------------------------------------------- HF routes


def split_segments(path: str) -> list[str]:
    """URL path segments, each still percent-encoded."""
    return [segment for segment in path.split("/") if segment != ""]


def find_repo(ctx: Ctx, segments: list[str]) -> tuple[str | None, int]:
    """The repo id at the start of ``segments`` (two segments, or a one-segment legacy
    id) and how many segments it took; (None, 2) when no repo there is known."""
    store = ctx.app.store
    for width in (2, 1):
        if len(segments) >= width:
            candidate = "/".join(unquote(segment) for segment in segments[:width])
            if candidate in store.repos or candidate in store.renames:
                return candidate, width
    return None, 2


def renamed(ctx: Ctx, old: str) -> Reply:
    new = ctx.app.store.renames[old]
    path = ctx.raw_path + "/"
    location = path.replace(f"/{quote(old)}/", f"/{quote(new)}/", 1)[:-1]
    if ctx.raw_query:
        location += "?" + ctx.raw_query
    return Reply(
        307,
        [("Location", location), ("Content-Type", "text/plain; charset=utf-8")],
        Blob(data=f"Temporary Redirect. Redirecting to {location}".encode()),
    )


def check_token(ctx: Ctx, repo: HfRepo) -> Reply | None:
    """401 for a token the hub does not know; RepoNotFound for a private repo not granted."""
    if ctx.token is not None and ctx.token not in ctx.app.store.tokens:
        return invalid_credentials()
    if repo.private and ctx.token not in repo.tokens:
        return repo_not_found()
    return None


def check_gate(ctx: Ctx, repo: HfRepo) -> Reply | None:
    if not repo.gated or ctx.token in repo.tokens:
        return None
    if ctx.token is None:
        message = (
            f"Access to model {repo.repo_id} is restricted. You must have access to it and "
            "be authenticated to access it. Please log in."
        )
        return hf_error(401, "GatedRepo", message)
    message = (
        f"Access to model {repo.repo_id} is restricted and you are not in the authorized "
        f"list. Visit https://huggingface.co/{repo.repo_id} to ask for access."
    )
    return hf_error(403, "GatedRepo", message)


def repo_files(ctx: Ctx, repo: HfRepo, *, listing: bool) -> dict[str, HfFile]:
    files = dict(repo.files)
    for item in ctx.app.faults.hostile(repo.repo_id, ctx.method, ctx.path, listing=listing):
        files[item.path] = item
    return files


def hf_api(ctx: Ctx, segments: list[str]) -> Reply:
    """/api/models/..."""
    repo_id, width = find_repo(ctx, segments)
    if repo_id is None:
        return repo_not_found()
    if repo_id in ctx.app.store.renames:
        return renamed(ctx, repo_id)
    repo = ctx.app.store.repos[repo_id]
    denied = check_token(ctx, repo)
    if denied is not None:
        return denied
    rest = segments[width:]
    if not rest:
        return model_info(ctx, repo, repo.commit)
    action = rest[0]
    if len(rest) < 2 or action not in ("revision", "tree", "paths-info"):
        return hf_error(404, None, "Sorry, we can't find the page you are looking for.")
    revision = unquote(rest[1])
    commit = repo.resolve(revision)
    if commit is None:
        return revision_not_found(revision)
    if action == "revision" and len(rest) == 2 and ctx.method in ("GET", "HEAD"):
        return model_info(ctx, repo, commit)
    if action == "tree" and ctx.method in ("GET", "HEAD"):
        return tree(ctx, repo, commit, "/".join(unquote(segment) for segment in rest[2:]))
    if action == "paths-info" and len(rest) == 2 and ctx.method == "POST":
        return paths_info(ctx, repo, commit)
    return hf_error(404, None, "Sorry, we can't find the page you are looking for.")


def model_info(ctx: Ctx, repo: HfRepo, commit: str) -> Reply:
    blobs = ctx.flag("blobs")
    files = repo_files(ctx, repo, listing=True)
    owner = repo.repo_id.split("/")[0] if "/" in repo.repo_id else None
    document: JSON = {
        "_id": hashlib.sha1(repo.repo_id.encode()).hexdigest()[:24],
        "id": repo.repo_id,
        "private": repo.private,
        "pipeline_tag": "text-generation",
        "library_name": "gguf",
        "tags": ["gguf", "text-generation"],
        "downloads": 0,
        "likes": 0,
        "modelId": repo.repo_id,
        "author": owner,
        "sha": commit,
        "lastModified": DATE,
        "gated": repo.gated,
        "disabled": False,
        "siblings": [item.sibling(blobs) for item in files.values()],
        "spaces": [],
        "createdAt": DATE,
        **repo.extra,
    }
    if blobs:
        document["usedStorage"] = sum(item.blob.size for item in files.values())
    return json_reply(200, document)


def tree(ctx: Ctx, repo: HfRepo, commit: str, base: str) -> Reply:
    recursive = ctx.flag("recursive")
    expand = ctx.flag("expand")
    base = base.strip("/")
    directories = repo.directories()
    if base and base not in directories:
        return entry_not_found(commit)
    files = repo_files(ctx, repo, listing=True)
    hostile = {path for path in files if path not in repo.files}
    prefix = f"{base}/" if base else ""

    def wanted(path: str) -> bool:
        if path in hostile:
            return not base  # listed at the root, whatever they claim to be
        if not path.startswith(prefix):
            return False
        return recursive or "/" not in path[len(prefix) :]

    entries: list[JSON] = []
    for path in sorted(directories):
        if wanted(path):
            entry: JSON = {"type": "directory", "oid": tree_oid(commit, path), "size": 0}
            entry["path"] = path
            if expand:
                entry["lastCommit"] = last_commit(commit)
            entries.append(entry)
    for path in sorted(files):
        if wanted(path):
            entries.append(files[path].entry(commit, expand))
    entries.sort(key=lambda entry: str(entry["path"]))

    offset = 0
    cursor = ctx.param("cursor")
    if cursor:
        try:
            offset = int(base64.urlsafe_b64decode(cursor.encode()).decode())
        except ValueError:
            return hf_error(400, None, "Invalid cursor")
    size = max(1, ctx.app.page_size)
    page = entries[offset : offset + size]
    headers: list[tuple[str, str]] = []
    if offset + size < len(entries):
        query = {key: values[-1] for key, values in ctx.query.items() if key != "cursor"}
        query["cursor"] = base64.urlsafe_b64encode(str(offset + size).encode()).decode()
        url = f"{ctx.app.hub_url}{ctx.raw_path}?{urlencode(query)}"
        headers.append(("Link", f'<{url}>; rel="next"'))
    return json_reply(200, page, headers)


def paths_info(ctx: Ctx, repo: HfRepo, commit: str) -> Reply:
    form = parse_qs(ctx.body.decode("utf-8", "replace"))
    expand = (form.get("expand", [""])[-1]).lower() == "true"
    files = repo_files(ctx, repo, listing=True)
    directories = repo.directories()
    found: list[JSON] = []
    for path in form.get("paths", []):
        path = path.strip("/")
        if path in files:
            found.append(files[path].entry(commit, expand))
        elif path in directories:
            entry: JSON = {"type": "directory", "oid": tree_oid(commit, path), "path": path}
            if expand:
                entry["lastCommit"] = last_commit(commit)
            found.append(entry)
    return json_reply(200, found)


def hf_resolve(ctx: Ctx, segments: list[str], at: int) -> Reply:
    """/{id}/resolve/{rev}/{path}; ``at`` is the index of the "resolve" segment."""
    repo_id = "/".join(unquote(segment) for segment in segments[:at])
    store = ctx.app.store
    if repo_id in store.renames:
        return renamed(ctx, repo_id)
    repo = store.repos.get(repo_id)
    if repo is None:
        return repo_not_found()
    denied = check_token(ctx, repo) or check_gate(ctx, repo)
    if denied is not None:
        return denied
    rest = segments[at + 1 :]
    if not rest:
        return entry_not_found(None)
    revision = unquote(rest[0])
    commit = repo.resolve(revision)
    if commit is None:
        return revision_not_found(revision)
    # From the raw path, empty segments kept: "resolve/main//abs.gguf" asks for "/abs.gguf".
    path = "/".join(unquote(part) for part in ctx.raw_path.split("/")[at + 3 :])
    item = repo_files(ctx, repo, listing=False).get(path)
    if item is None:
        return entry_not_found(commit)
    name = path.rsplit("/", 1)[-1]
    common = [("X-Repo-Commit", commit), ("Vary", "Origin, Accept")]
    if item.lfs:
        sha256 = item.blob.sha256
        expires = str(int(time.time()) + 3600)
        query = urlencode(
            {
                "response-content-disposition": content_disposition(name),
                "Expires": expires,
                "Policy": base64.urlsafe_b64encode(f"{sha256}:{expires}".encode()).decode(),
                "Signature": sign(sha256, expires),
                "Key-Pair-Id": "K3RPWS32NSSJCE",
            }
        )
        location = f"{ctx.app.cdn_url}/cdn/repos/{repo.repo_id}/{sha256}?{query}"
        body = f"Found. Redirecting to {location}".encode()
        return Reply(
            302,
            [
                ("Content-Type", "text/plain; charset=utf-8"),
                ("Location", location),
                *common,
                ("X-Linked-Size", str(item.blob.size)),
                ("X-Linked-Etag", f'"{sha256}"'),
                ("ETag", f'"{item.oid}"'),
                ("Accept-Ranges", "bytes"),
            ],
            Blob(data=body),
        )
    content_type = (
        "text/plain; charset=utf-8" if path.endswith(TEXT_SUFFIXES) else "application/octet-stream"
    )
    headers = [
        ("Content-Type", content_type),
        *common,
        ("ETag", f'"{item.oid}"'),
        ("Content-Disposition", content_disposition(name)),
        ("Last-Modified", LAST_MODIFIED_HTTP),
    ]
    return content_reply(ctx, item.blob, headers, cdn=False)


# ---------------------------------------------------------------------------- Ollama routes


def ollama(ctx: Ctx, segments: list[str]) -> Reply:
    """/v2/..."""
    store = ctx.app.store
    if segments == ["v2"]:
        return json_reply(200, {}, [("Docker-Distribution-Api-Version", "registry/2.0")])
    for kind in ("manifests", "blobs"):
        if kind in segments[2:]:
            at = len(segments) - 1 - segments[::-1].index(kind)
            break
    else:
        return ollama_error(404, "NAME_UNKNOWN", "repository name not known to registry")
    name = "/".join(unquote(segment) for segment in segments[1:at])
    reference = unquote("/".join(segments[at + 1 :]))
    tags = store.models.get(name)
    if tags is None:
        return ollama_error(
            404, "NAME_UNKNOWN", "repository name not known to registry", {"Name": name}
        )
    if kind == "manifests":
        model = tags.get(reference)
        if model is None:
            model = next(
                (
                    candidate
                    for candidate in tags.values()
                    if f"sha256:{hashlib.sha256(candidate.manifest).hexdigest()}" == reference
                ),
                None,
            )
        if model is None:
            return ollama_error(404, "MANIFEST_UNKNOWN", "manifest unknown", {"Tag": reference})
        manifest = model.manifest
        digest = f"sha256:{hashlib.sha256(manifest).hexdigest()}"
        return Reply(
            200,
            [
                ("Content-Type", MANIFEST_V2),
                ("Docker-Content-Digest", digest),
                ("Docker-Distribution-Api-Version", "registry/2.0"),
                ("ETag", f'"{digest}"'),
            ],
            Blob(data=manifest),
        )
    hex_digest = reference.removeprefix("sha256:")
    blob = next(
        (
            candidate
            for model in tags.values()
            for candidate in model.blobs()
            if reference.startswith("sha256:") and candidate.sha256 == hex_digest
        ),
        None,
    )
    if blob is None:
        return ollama_error(404, "BLOB_UNKNOWN", "blob unknown to registry", reference)
    date = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    query = urlencode(
        {
            "X-Amz-Algorithm": "AWS4-HMAC-SHA256",
            "X-Amz-Credential": f"66040c77ac1b787c3af820529859349a/{date[:8]}/auto/s3/aws4_request",
            "X-Amz-Date": date,
            "X-Amz-Expires": "86400",
            "X-Amz-SignedHeaders": "host",
            "X-Amz-Signature": sign(hex_digest, date),
        }
    )
    location = (
        f"{ctx.app.cdn_url}/cdn/ollama/docker/registry/v2/blobs/sha256/"
        f"{hex_digest[:2]}/{hex_digest}/data?{query}"
    )
    body = f'<a href="{location}">Temporary Redirect</a>.\n\n'.encode()
    return Reply(
        307,
        [
            ("Content-Type", "text/html; charset=utf-8"),
            ("Location", location),
            ("Docker-Distribution-Api-Version", "registry/2.0"),
        ],
        Blob(data=body),
    )


# ---------------------------------------------------------------------------- CDN routes


def cdn(ctx: Ctx, segments: list[str]) -> Reply:
    """/cdn/repos/{id}/{sha256}?... and /cdn/ollama/.../sha256/{xx}/{hex}/data?..."""
    if len(segments) >= 3 and segments[1] == "repos":
        sha256 = segments[-1]
        disposition = ctx.param("response-content-disposition")
        if disposition is None or ctx.param("Signature") != sign(
            sha256, ctx.param("Expires") or ""
        ):
            return cdn_error(403, "AccessDenied", "Access denied")
    elif len(segments) >= 4 and segments[1] == "ollama" and segments[-1] == "data":
        sha256 = segments[-2]
        disposition = None
    else:
        return cdn_error(404, "NoSuchKey", "The specified key does not exist.")
    hostile = [
        item.blob
        for repo_id in ctx.app.store.repos
        for item in ctx.app.faults.hostile(repo_id, ctx.method, ctx.path, listing=False)
    ]
    blob = ctx.app.store.blob_by_sha256(sha256, hostile)
    if blob is None:
        return cdn_error(404, "NoSuchKey", "The specified key does not exist.")
    headers = [
        ("Content-Type", "application/octet-stream"),
        ("ETag", f'"{sha256}"'),
        ("Last-Modified", LAST_MODIFIED_HTTP),
        ("Cache-Control", "public, max-age=604800, immutable, s-maxage=604800"),
    ]
    if disposition is not None:
        headers.append(("Content-Disposition", disposition))
    return content_reply(ctx, blob, headers, cdn=True)


def route(ctx: Ctx) -> Reply:
    segments = split_segments(ctx.path)
    if ctx.method not in ("GET", "HEAD", "POST"):
        return text_reply(405, "Method Not Allowed")
    if segments[:1] == ["cdn"]:
        if ctx.method == "POST":
            return cdn_error(405, "MethodNotAllowed", "Method not allowed")
        return cdn(ctx, segments)
    if segments[:1] == ["v2"]:
        if ctx.method == "POST":
            return ollama_error(405, "UNSUPPORTED", "The operation is unsupported.")
        return ollama(ctx, segments)
    if segments[:2] == ["api", "models"]:
        return hf_api(ctx, segments[2:])
    for at in (2, 1):
        if len(segments) > at and segments[at] == "resolve" and ctx.method != "POST":
            return hf_resolve(ctx, segments, at)
    return text_reply(404, "Not Found")


# ---------------------------------------------------------------------------- HTTP


class StandinServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], app: App, role: str) -> None:
        self.app = app
        self.role = role
        super().__init__(address, Handler)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "hub-standin"
    timeout = 60  # an idle keep-alive connection is closed after this

    @property
    def standin(self) -> StandinServer:
        return cast(StandinServer, self.server)

    def version_string(self) -> str:
        return self.server_version

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the request log is the record; stderr stays for real errors

    def do_GET(self) -> None:
        self.handle_request()

    def do_HEAD(self) -> None:
        self.handle_request()

    def do_POST(self) -> None:
        self.handle_request()

    def do_DELETE(self) -> None:
        self.handle_request()

    def do_PUT(self) -> None:
        self.handle_request()

    def handle_request(self) -> None:
        app = self.standin.app
        target = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length > 0 else b""
        if target.path.startswith("/_control/") and self.standin.role == "hub":
            self.send_reply(self.control(target.path, body), None, None)
            return
        authorization = self.headers.get("Authorization")
        token = None
        if authorization is not None:
            scheme, _, value = authorization.partition(" ")
            token = value.strip() if scheme.lower() == "bearer" else authorization
        record = app.log.start(
            {
                "server": self.standin.role,
                "method": self.command,
                "path": self.path,
                "range": self.headers.get("Range"),
                "accept": self.headers.get("Accept"),
                "authorization": authorization is not None,
                "token": token,
                "user_agent": self.headers.get("User-Agent"),
                "status": None,
                "content_length": None,
                "body_bytes": 0,
                "completed": False,
                "closed": False,
                "faults": [],
                "started": time.time(),
                "finished": None,
            }
        )
        faults = app.faults.take(self.command, target.path)
        app.log.update(record, faults=sorted(faults))
        ctx = Ctx(
            app=app,
            method=self.command,
            raw_path=target.path,
            path=unquote(target.path),
            query=parse_qs(target.query, keep_blank_values=True),
            raw_query=target.query,
            headers={name.lower(): value for name, value in self.headers.items()},
            body=body,
            token=token,
            faults=faults,
        )
        try:
            if "hold" in faults and not (
                faults["hold"].params.get("after_headers") or "after_bytes" in faults["hold"].params
            ):
                self.hold(record)
                return
            if "status" in faults:
                reply = fault_status_reply(target.path, faults["status"].params)
            elif "redirect" in faults:
                reply = self.redirect_reply(ctx, faults["redirect"].params)
            else:
                reply = route(ctx)
            self.send_reply(reply, ctx, record)
        except (Aborted, ConnectionError, TimeoutError):
            # A cut or a hold, a client gone, or one that stopped reading (Handler.timeout).
            self.close_connection = True
            app.log.update(record, closed=True, finished=time.time())

    def redirect_reply(self, ctx: Ctx, params: JSON) -> Reply:
        status = int(params.get("status", 307))
        if "replace" in params:
            old, new = params["replace"]
            location = ctx.raw_path.replace(str(old), str(new), 1)
            if ctx.raw_query:
                location += "?" + ctx.raw_query
        else:
            location = str(params["location"]).format(
                hub=ctx.app.hub_url, cdn=ctx.app.cdn_url, path=ctx.raw_path, query=ctx.raw_query
            )
        return Reply(
            status,
            [("Location", location), ("Content-Type", "text/plain; charset=utf-8")],
            Blob(data=f"Redirecting to {location}".encode()),
        )

    def hold(self, record: JSON) -> None:
        """Answer nothing until the client goes away or the stand-in stops."""
        app = self.standin.app
        self.close_connection = True
        while not app.stopping.is_set():
            readable, _, _ = select.select([self.connection], [], [], 0.1)
            if readable:
                try:
                    if not self.connection.recv(1, socket.MSG_PEEK):
                        break  # the client closed
                except OSError:
                    break
                app.stopping.wait(0.1)  # the client sent more: keep not answering
        app.log.update(record, closed=True, finished=time.time())
        raise Aborted

    def send_reply(self, reply: Reply, ctx: Ctx | None, record: JSON | None) -> None:
        app = self.standin.app
        faults = ctx.faults if ctx is not None else {}
        dropped: set[str] = set()
        if "headers" in faults:
            params = faults["headers"].params
            dropped = {str(name).lower() for name in params.get("drop", [])}
            replaced = {str(k).lower(): (str(k), str(v)) for k, v in params.get("set", {}).items()}
            reply.headers = [
                (k, v)
                for k, v in reply.headers
                if k.lower() not in dropped and k.lower() not in replaced
            ] + list(replaced.values())
        end = reply.body.size if reply.end is None else reply.end
        length = end - reply.start
        declared = reply.header("Content-Length")
        self.send_response(reply.status)
        for name, value in reply.headers:
            self.send_header(name, value)
        if "content-length" in dropped:
            # No length: the body ends when the connection does.
            self.send_header("Connection", "close")
            self.close_connection = True
        elif declared is None:
            self.send_header("Content-Length", str(length))
        if ctx is not None:
            request_id = ctx.headers.get("x-amzn-trace-id") or ctx.headers.get("x-request-id")
            if request_id:
                self.send_header("X-Request-Id", request_id)
        self.end_headers()
        if record is not None:
            app.log.update(record, status=reply.status, content_length=length)
        self.wfile.flush()
        sent = 0
        if self.command == "HEAD" and "hold" in faults and record is not None:
            self.hold(record)  # after_headers / after_bytes: the headers were the answer
        if self.command != "HEAD":
            sent = self.send_body(reply, reply.start, end, faults, record)
        if record is not None:
            app.log.update(record, body_bytes=sent, completed=True, finished=time.time())

    def send_body(
        self, reply: Reply, start: int, end: int, faults: dict[str, Fault], record: JSON | None
    ) -> int:
        app = self.standin.app
        cut = int(faults["cut_after"].params.get("bytes", 0)) if "cut_after" in faults else None
        corrupt = int(faults["corrupt"].params.get("offset", 0)) if "corrupt" in faults else None
        trickle = faults["trickle"].params if "trickle" in faults else None
        hold_after: int | None = None
        if "hold" in faults:
            hold_after = int(faults["hold"].params.get("after_bytes", 0))
        sent = 0
        position = start

        def write(piece: bytes) -> None:
            nonlocal sent
            self.wfile.write(piece)
            sent += len(piece)
            if record is not None:
                app.log.update(record, body_bytes=sent)

        for chunk in reply.body.chunks(start, end):
            if corrupt is not None and position <= corrupt < position + len(chunk):
                flipped = bytearray(chunk)
                flipped[corrupt - position] ^= 0xFF
                chunk = bytes(flipped)
            position += len(chunk)
            limits = [limit for limit in (cut, hold_after) if limit is not None]
            stop_at = min(limits) if limits else None
            if stop_at is not None and sent + len(chunk) >= stop_at:
                write(chunk[: stop_at - sent])
                if hold_after is not None and stop_at == hold_after:
                    self.wfile.flush()
                    assert record is not None
                    self.hold(record)
                self.cut(bool(faults["cut_after"].params.get("reset", False)), record)
            if trickle is not None:
                size = max(1, int(trickle.get("chunk", 1)))
                interval = float(trickle.get("interval", 0.5))
                for offset in range(0, len(chunk), size):
                    if app.stopping.wait(interval):
                        self.cut(False, record)
                    write(chunk[offset : offset + size])
            else:
                write(chunk)
        if hold_after is not None and record is not None:
            self.hold(record)  # after_headers, or after_bytes beyond the body
        return sent

    def cut(self, reset: bool, record: JSON | None) -> None:
        """Close the connection now: a FIN, or with ``reset`` an RST."""
        self.close_connection = True
        if reset:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
        else:
            self.connection.shutdown(socket.SHUT_RDWR)
        if record is not None:
            self.standin.app.log.update(record, closed=True, finished=time.time())
        raise Aborted

    # ------------------------------------------------------------------ control

    def control(self, path: str, body: bytes) -> Reply:
        app = self.standin.app
        try:
            payload = json.loads(body) if body else None
        except json.JSONDecodeError as exc:
            return json_reply(400, {"error": f"invalid JSON: {exc}"})
        if path == "/_control/health":
            return json_reply(200, {"pid": os.getpid(), **app.ports})
        if path == "/_control/requests" and self.command == "GET":
            return json_reply(200, app.log.snapshot())
        if path == "/_control/faults":
            if self.command == "GET":
                return json_reply(200, app.faults.listing())
            if self.command == "DELETE":
                app.faults.clear()
                return json_reply(200, [])
            if self.command == "POST":
                items = payload if isinstance(payload, list) else [payload]
                specs = [spec for spec in items if isinstance(spec, dict)]
                if len(specs) != len(items):
                    return json_reply(400, {"error": "a fault is a JSON object"})
                try:
                    return json_reply(200, app.faults.add(specs))
                except (ValueError, TypeError) as exc:
                    return json_reply(400, {"error": str(exc)})
        if path == "/_control/reset" and self.command == "POST":
            app.faults.clear()
            app.log.clear()
            app.page_size = app.store.page_size
            return json_reply(200, {})
        if path == "/_control/settings" and self.command == "POST":
            if not isinstance(payload, dict):
                return json_reply(400, {"error": "settings are a JSON object"})
            if "page_size" in payload:
                app.page_size = int(payload["page_size"])
            return json_reply(200, {"page_size": app.page_size})
        return json_reply(404, {"error": f"no control route {self.command} {path}"})


# ---------------------------------------------------------------------------- main


def bind_cdn(app: App, port: int) -> StandinServer:
    last: OSError | None = None
    for host in CDN_HOSTS:
        try:
            return StandinServer((host, port), app, "cdn")
        except OSError as exc:
            last = exc
    assert last is not None
    raise last


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fakes.hub_standin")
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--port-file", type=Path, required=True)
    parser.add_argument("--hub-port", type=int, default=0)
    parser.add_argument("--cdn-port", type=int, default=0)
    parser.add_argument("--parent-pid", type=int, help="exit when this process is gone")
    args = parser.parse_args(argv)

    app = App(json.loads(args.config.read_text(encoding="utf-8")))
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    hub = StandinServer((HUB_HOST, args.hub_port), app, "hub")
    try:
        cdn_server = bind_cdn(app, args.cdn_port)
    except OSError:
        hub.server_close()
        raise
    servers = (hub, cdn_server)
    hub_port = hub.server_address[1]
    cdn_host, cdn_port = str(cdn_server.server_address[0]), cdn_server.server_address[1]
    app.hub_url = f"http://{HUB_HOST}:{hub_port}"
    app.cdn_url = f"http://{cdn_host}:{cdn_port}"
    app.ports = {"hub": hub_port, "cdn": cdn_port, "cdn_host": cdn_host}
    threads = [
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
        for server in servers
    ]
    for thread in threads:
        thread.start()
    partial = args.port_file.with_name(args.port_file.name + ".partial")
    partial.write_text(json.dumps({**app.ports, "pid": os.getpid()}), encoding="utf-8")
    partial.replace(args.port_file)
    print(f"hub-standin listening: hub {app.hub_url}, cdn {app.cdn_url}", flush=True)
    try:
        while not stop.wait(0.25):
            if args.parent_pid is not None and os.getppid() != args.parent_pid:
                break
    finally:
        app.stopping.set()
        for server in servers:
            server.shutdown()
        for server in servers:
            server.server_close()
        for thread in threads:
            thread.join(timeout=5)
    print("hub-standin stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
