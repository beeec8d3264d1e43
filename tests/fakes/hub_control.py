"""Test-side helper that runs ``tests.fakes.hub_standin`` (a local Hugging Face Hub and
Ollama registry) as a real process and scripts it.

    with HubStandin.start(tmp_path, hf=DEFAULT_HF_REPOS, ollama=DEFAULT_OLLAMA_MODELS) as hub:
        api = HfApi(endpoint=hub.hf_endpoint)           # or HF_ENDPOINT=hub.hf_endpoint
        hub.fault("cut_after", "/cdn/*", times=1, bytes=4096)
        ...
        hub.wait_for(lambda reqs: any(r["path"].startswith("/cdn/") for r in reqs))

Repos and models are described with ``HfRepo`` / ``HfFile`` and ``OllamaModel`` /
``OllamaLayer``: a file is a real file on disk (``source``) or bytes (``data``). The
default models (``DEFAULT_HF_REPOS``, ``DEFAULT_OLLAMA_MODELS``) are the project's own
GGUF files under ``models/`` plus small synthetic ones; ``tiny_gguf`` makes small GGUF
files for fast tests. See ``tests.fakes.hub_standin`` for the routes, the faults and the
request log's fields.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from tests.fakes.hub_standin import git_blob_oid, lfs_pointer
from tests.fakes.process_group import StopsOnExit, signal_group, stop_group

__all__ = [
    "DEFAULT_HF_REPOS",
    "DEFAULT_OLLAMA_MODELS",
    "GEMMA3_GGUF",
    "MODELS_DIR",
    "SMOLLM2_GGUF",
    "HfFile",
    "HfRepo",
    "HubStandin",
    "HubStandinError",
    "OllamaLayer",
    "OllamaModel",
    "cdn_gets",
    "git_blob_oid",
    "lfs_pointer",
    "tiny_gguf",
]

JSON = dict[str, Any]
REPO_ROOT = Path(__file__).resolve().parents[2]
MODELS_DIR = REPO_ROOT / "models"
SMOLLM2_GGUF = MODELS_DIR / "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3_GGUF = MODELS_DIR / "gemma-3-270m-q4_k_m.gguf"
POLL_INTERVAL = 0.02

MEDIA_MODEL = "application/vnd.ollama.image.model"
MEDIA_PROJECTOR = "application/vnd.ollama.image.projector"
MEDIA_TEMPLATE = "application/vnd.ollama.image.template"
MEDIA_PARAMS = "application/vnd.ollama.image.params"
MEDIA_LICENSE = "application/vnd.ollama.image.license"
MEDIA_SYSTEM = "application/vnd.ollama.image.system"


# ---------------------------------------------------------------------------- descriptions


def _content(what: str, source: Path | None, data: bytes | None) -> JSON:
    """A file's content as the stand-in's configuration names it: a path, or bytes."""
    if (source is None) == (data is None):
        raise ValueError(f"{what}: give source or data, not both or neither")
    if source is not None:
        return {"source": str(source)}
    return {"data_b64": base64.b64encode(data or b"").decode()}


@dataclass(frozen=True)
class HfFile:
    """A file of a Hugging Face repo: ``source`` (a file on disk) or ``data``. ``lfs``:
    stored with Git LFS (served through the CDN redirect); by default every file but
    text ones (.md, .json, .txt, ...) is."""

    path: str
    source: Path | None = None
    data: bytes | None = None
    lfs: bool | None = None

    def config(self) -> JSON:
        return {"path": self.path, "lfs": self.lfs, **_content(self.path, self.source, self.data)}


@dataclass(frozen=True)
class HfRepo:
    """A model repo. ``gated``: False, "auto" or "manual" (True means "manual"): its
    files need a token in ``tokens``; its metadata is public, as on the hub. ``private``:
    everything answers RepoNotFound without a token in ``tokens``. ``branches``: by default
    {"main": commit}. ``extra``: more fields for model_info (e.g. "gguf": {...}).
    ``gitattributes``: list a ``.gitattributes`` as real repos do."""

    files: tuple[HfFile, ...]
    commit: str | None = None
    branches: Mapping[str, str] | None = None
    gated: bool | str = False
    private: bool = False
    tokens: tuple[str, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict)
    gitattributes: bool = True

    def config(self) -> JSON:
        return {
            "files": [item.config() for item in self.files],
            "commit": self.commit,
            "branches": dict(self.branches) if self.branches is not None else None,
            "gated": self.gated,
            "private": self.private,
            "tokens": list(self.tokens),
            "extra": dict(self.extra),
            "gitattributes": self.gitattributes,
        }


@dataclass(frozen=True)
class OllamaLayer:
    media_type: str
    source: Path | None = None
    data: bytes | None = None

    def config(self) -> JSON:
        return {"mediaType": self.media_type, **_content(self.media_type, self.source, self.data)}


@dataclass(frozen=True)
class OllamaModel:
    """A tag of an Ollama model: its layers in manifest order, and the config blob's
    fields (the stand-in adds ``rootfs.diff_ids`` from the layers unless given)."""

    layers: tuple[OllamaLayer, ...]
    config: Mapping[str, Any] = field(default_factory=dict)

    def to_config(self) -> JSON:
        return {"layers": [layer.config() for layer in self.layers], "config": dict(self.config)}


# ---------------------------------------------------------------------------- tiny GGUF

_GGUF_UINT16, _GGUF_UINT32, _GGUF_INT32, _GGUF_STRING = 2, 4, 5, 8
_U16_KEYS = ("split.no", "split.count")
_I32_KEYS = ("split.tensors.count",)


def tiny_gguf(metadata: Mapping[str, str | int], *, size: int = 0) -> bytes:
    """A GGUF v3 file with no tensors and these metadata keys (strings; integers as
    uint32, but ``split.no``/``split.count`` uint16 and ``split.tensors.count`` int32 as
    llama.cpp's gguf-split writes them), padded with zeros to ``size`` bytes if larger."""
    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, 0, len(metadata)))
    for key, value in metadata.items():
        encoded = key.encode()
        out += struct.pack("<Q", len(encoded)) + encoded
        if isinstance(value, str):
            text = value.encode()
            out += struct.pack("<IQ", _GGUF_STRING, len(text)) + text
        elif key in _U16_KEYS:
            out += struct.pack("<IH", _GGUF_UINT16, value)
        elif key in _I32_KEYS:
            out += struct.pack("<Ii", _GGUF_INT32, value)
        else:
            out += struct.pack("<II", _GGUF_UINT32, value)
    if len(out) < size:
        out += bytes(size - len(out))
    return bytes(out)


# ---------------------------------------------------------------------------- default models

GEMMA3_TEMPLATE = """{{- range $i, $_ := .Messages }}
{{- $last := eq (len (slice $.Messages $i)) 1 }}
{{- if or (eq .Role "user") (eq .Role "system") }}<start_of_turn>user
{{ .Content }}<end_of_turn>
{{ if $last }}<start_of_turn>model
{{ end }}
{{- else if eq .Role "assistant" }}<start_of_turn>model
{{ .Content }}{{ if not $last }}<end_of_turn>
{{ end }}
{{- end }}
{{- end }}"""
GEMMA3_PARAMS = json.dumps(
    {"stop": ["<end_of_turn>"], "temperature": 1, "top_k": 64, "top_p": 0.95}, indent=4
)
GEMMA_LICENSE = (
    "Gemma Terms of Use\n\nLast modified: March 24, 2025\n\n"
    "By using, reproducing, modifying, distributing, performing or displaying any portion "
    "or element of Gemma, Model Derivatives including via any Hosted Service, you agree "
    "to be bound by this Agreement.\n"
)
SMOLLM2_README = (
    "---\nlicense: apache-2.0\nbase_model: HuggingFaceTB/SmolLM2-135M-Instruct\n"
    "tags:\n- gguf\n---\n\n# SmolLM2-135M-Instruct GGUF\n"
)
GEMMA3_README = (
    "---\nlicense: gemma\nbase_model: google/gemma-3-270m-it\ntags:\n- gguf\n---\n\n"
    "# gemma-3-270m GGUF\n"
)
GEMMA3_MMPROJ = tiny_gguf(
    {"general.architecture": "clip", "general.type": "mmproj", "general.name": "gemma-3-270m"},
    size=4096,
)
GEMMA3_SPLITS = tuple(
    tiny_gguf(
        {
            "general.architecture": "gemma3",
            "split.no": index,
            "split.count": 2,
            "split.tensors.count": 0,
        },
        size=2048 + index,
    )
    for index in range(2)
)

DEFAULT_HF_REPOS: dict[str, HfRepo] = {
    "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF": HfRepo(
        files=(
            HfFile("SmolLM2-135M-Instruct.Q4_1.gguf", source=SMOLLM2_GGUF),
            HfFile("README.md", data=SMOLLM2_README.encode()),
        ),
        commit="5f1c4d2b8a7e6f3c9d0b1a2e3f4c5d6e7f8a9b0c",
        extra={"gguf": {"architecture": "llama", "context_length": 8192}},
    ),
    "ggml-org/gemma-3-270m-GGUF": HfRepo(
        files=(
            HfFile("gemma-3-270m-Q4_K_M.gguf", source=GEMMA3_GGUF),
            HfFile("mmproj-gemma-3-270m-f16.gguf", data=GEMMA3_MMPROJ),
            HfFile("Q8_0/gemma-3-270m-Q8_0-00001-of-00002.gguf", data=GEMMA3_SPLITS[0]),
            HfFile("Q8_0/gemma-3-270m-Q8_0-00002-of-00002.gguf", data=GEMMA3_SPLITS[1]),
            HfFile("README.md", data=GEMMA3_README.encode()),
        ),
        commit="9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b",
        extra={"gguf": {"architecture": "gemma3", "context_length": 32768}},
    ),
}

DEFAULT_OLLAMA_MODELS: dict[str, OllamaModel] = {
    "library/gemma3:270m": OllamaModel(
        layers=(
            OllamaLayer(MEDIA_MODEL, source=GEMMA3_GGUF),
            OllamaLayer(MEDIA_TEMPLATE, data=GEMMA3_TEMPLATE.encode()),
            OllamaLayer(MEDIA_LICENSE, data=GEMMA_LICENSE.encode()),
            OllamaLayer(MEDIA_PARAMS, data=GEMMA3_PARAMS.encode()),
        ),
        config={
            "model_format": "gguf",
            "model_family": "gemma3",
            "model_families": ["gemma3"],
            "model_type": "268.10M",
            "file_type": "Q4_K_M",
            "architecture": "amd64",
            "os": "linux",
        },
    ),
}


# ---------------------------------------------------------------------------- the process


def cdn_gets(records: list[JSON]) -> list[JSON]:
    """The downloads among a request log's ``records``: its GETs of the CDN."""
    return [r for r in records if r["method"] == "GET" and r["path"].startswith("/cdn/")]


class HubStandinError(RuntimeError):
    """The stand-in could not be started, or refused a control request."""


class HubStandin(StopsOnExit):
    """A running ``tests.fakes.hub_standin`` process; create it with ``HubStandin.start()``."""

    def __init__(self, process: subprocess.Popen[bytes], directory: Path) -> None:
        self.process = process
        self.directory = directory
        self.log_path = directory / "output.log"
        self.hub_port = 0
        self.cdn_port = 0
        self.cdn_host = "127.0.0.1"
        self._client: httpx.Client | None = None
        self._final_output: str | None = None

    # ------------------------------------------------------------------ lifecycle

    @classmethod
    def start(
        cls,
        directory: Path,
        *,
        hf: Mapping[str, HfRepo] | None = None,
        ollama: Mapping[str, OllamaModel] | None = None,
        tokens: Iterable[str] = (),
        renames: Mapping[str, str] | None = None,
        page_size: int = 1000,
        startup_timeout: float = 15.0,
    ) -> HubStandin:
        """Write the configuration under ``directory``, spawn the stand-in (own process
        group) and wait until it answers. ``tokens``: tokens the hub knows beyond the
        repos' own (a known token without a repo's grant gets 403 on a gated repo).
        ``renames``: {old id: new id}, answered with the hub's relative 307."""
        directory.mkdir(parents=True, exist_ok=True)
        workdir = Path(tempfile.mkdtemp(prefix="hub-standin-", dir=directory))
        config = {
            "hf": {repo_id: repo.config() for repo_id, repo in (hf or {}).items()},
            "ollama": {name: model.to_config() for name, model in (ollama or {}).items()},
            "tokens": list(tokens),
            "renames": dict(renames or {}),
            "page_size": page_size,
        }
        config_path = workdir / "config.json"
        config_path.write_text(json.dumps(config), encoding="utf-8")
        port_file = workdir / "ports.json"
        command = [
            sys.executable,
            "-m",
            "tests.fakes.hub_standin",
            "--config",
            str(config_path),
            "--port-file",
            str(port_file),
            "--parent-pid",
            str(os.getpid()),
        ]
        with (workdir / "output.log").open("wb") as log:
            process = subprocess.Popen(
                command,
                cwd=REPO_ROOT,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        standin = cls(process, workdir)
        try:
            standin._wait_ready(port_file, startup_timeout)
        except BaseException:
            output = standin.stop()
            raise HubStandinError(f"hub stand-in did not start\n--- output ---\n{output}") from None
        return standin

    def _wait_ready(self, port_file: Path, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not port_file.exists():
            if self.process.poll() is not None:
                raise HubStandinError(f"exited with code {self.process.returncode}")
            if time.monotonic() > deadline:
                raise HubStandinError(f"no port file after {timeout}s")
            time.sleep(POLL_INTERVAL)
        ports = json.loads(port_file.read_text(encoding="utf-8"))
        self.hub_port, self.cdn_port = int(ports["hub"]), int(ports["cdn"])
        self.cdn_host = str(ports["cdn_host"])
        self._client = httpx.Client(base_url=self.hub_url, timeout=10.0, trust_env=False)
        health = self._client.get("/_control/health")
        if health.status_code != 200 or health.json().get("pid") != self.process.pid:
            raise HubStandinError(f"port {self.hub_port} is not this stand-in: {health.text}")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to the stand-in's process group."""
        signal_group(self.process, sig)

    def stop(self, timeout: float = 5.0) -> str:
        """SIGTERM, then SIGKILL after ``timeout``; always reaps. Returns the output."""
        if self._client is not None:
            self._client.close()
            self._client = None
        stop_group(self.process, timeout)
        if self._final_output is None:
            self._final_output = self.output()
        return self._final_output

    # ------------------------------------------------------------------ properties

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        return self.process.poll()

    @property
    def hub_url(self) -> str:
        return f"http://127.0.0.1:{self.hub_port}"

    @property
    def hf_endpoint(self) -> str:
        """What to give huggingface_hub as ``endpoint=`` or ``HF_ENDPOINT``."""
        return self.hub_url

    @property
    def ollama_registry(self) -> str:
        """The registry's base URL (what https://registry.ollama.ai is for the real one)."""
        return self.hub_url

    @property
    def cdn_url(self) -> str:
        """The CDN's base URL: another host (127.0.0.2 where it can be bound) and port."""
        return f"http://{self.cdn_host}:{self.cdn_port}"

    def resolve_url(self, repo_id: str, path: str, revision: str = "main") -> str:
        """The file's /resolve/ URL, as huggingface_hub's ``hf_hub_url`` builds it."""
        return f"{self.hub_url}/{repo_id}/resolve/{quote(revision, safe='')}/{quote(path)}"

    def output(self) -> str:
        """Everything the process wrote to stdout/stderr so far."""
        if self._final_output is not None:
            return self._final_output
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    # ------------------------------------------------------------------ control API

    def _control(self, method: str, path: str, payload: Any = None) -> Any:
        if self._client is None:
            raise HubStandinError("the stand-in is stopped")
        response = self._client.request(method, f"/_control/{path}", json=payload)
        if response.status_code != 200:
            raise ValueError(f"stand-in refused {method} {path}: {response.text}")
        return response.json()

    def fault(
        self,
        kind: str,
        path: str = "*",
        *,
        method: str | None = None,
        times: int | None = None,
        **params: Any,
    ) -> JSON:
        """Install a fault (see ``tests.fakes.hub_standin``): ``path`` is an fnmatch
        pattern on the URL path, ``times`` how many matching requests it applies to
        (None: all). Returns the fault as installed, with its id."""
        spec = {"kind": kind, "path": path, "method": method, "times": times, **params}
        [installed] = self._control("POST", "faults", [spec])
        result: JSON = installed
        return result

    def faults(self) -> list[JSON]:
        """The faults installed, each with its ``hits`` so far."""
        result: list[JSON] = self._control("GET", "faults")
        return result

    def clear_faults(self) -> None:
        self._control("DELETE", "faults")

    def reset(self) -> None:
        """Remove the faults, forget the requests, restore the page size."""
        self._control("POST", "reset", {})

    def set_page_size(self, page_size: int) -> None:
        """Entries per page of a tree listing (the hub's is 1000)."""
        self._control("POST", "settings", {"page_size": page_size})

    def requests(self) -> list[JSON]:
        """The request log (see ``tests.fakes.hub_standin.RequestLog``)."""
        result: list[JSON] = self._control("GET", "requests")
        return result

    def wait_for(self, predicate: Callable[[list[JSON]], bool], timeout: float = 5.0) -> list[JSON]:
        """Poll ``requests()`` until ``predicate`` holds; AssertionError after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            records = self.requests()
            if predicate(records):
                return records
            if time.monotonic() >= deadline:
                raise AssertionError(f"condition not met within {timeout}s; requests: {records!r}")
            time.sleep(POLL_INTERVAL)
