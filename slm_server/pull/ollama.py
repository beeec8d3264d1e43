"""Pulling from an Ollama registry (``registry.ollama.ai``, or ``SLM_OLLAMA_REGISTRY``).

Ollama publishes no client library for its registry, so this is the one hand-written
hub client: the Docker-distribution API it speaks. The manifest
(``/v2/<namespace>/<model>/manifests/<tag>``) lists layers by media type and SHA-256
digest; each blob (``/v2/<namespace>/<model>/blobs/sha256:<hex>``) redirects to a CDN,
which honours ``Range``. The model layer is a GGUF; the template, parameters and system
prompt are small text layers saved beside it (Ollama's template is a Go template, which
llama-server cannot use: the GGUF's own chat template serves the model).

A blob is downloaded into ``<models>/.pull/ollama/sha256-<hex>.partial``, hashed as it
arrives (a resumed one: its first part is hashed from the disk first), and moved to
``<models>/ollama/<model>-<tag>.gguf`` only when its digest and size are the manifest's.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import httpx

from slm_server.pull import files as disk
from slm_server.pull.errors import CUT_RETRIES, Cut, PullError
from slm_server.pull.events import FileReady, Planned, PlannedFile, Report
from slm_server.pull.reference import OllamaReference
from slm_server.pull.result import Pulled
from slm_server.pull.transfer import Transfer
from slm_server.settings import PullSettings

MANIFEST_TYPES: Final = (
    "application/vnd.docker.distribution.manifest.v2+json, "
    "application/vnd.oci.image.manifest.v1+json"
)
MODEL: Final = "application/vnd.ollama.image.model"
PROJECTOR: Final = "application/vnd.ollama.image.projector"
_TEXT_LAYERS: Final = {
    "application/vnd.ollama.image.template": "template",
    "application/vnd.ollama.image.params": "params.json",
    "application/vnd.ollama.image.system": "system",
}
_DIGEST: Final = re.compile(r"^sha256:(?P<hex>[0-9a-f]{64})$")
_CONTENT_RANGE: Final = re.compile(r"^\s*bytes\s+(?P<start>\d+)-\d+/(?:\d+|\*)\s*$")
_MAX_MANIFEST: Final = 1 << 20
_MAX_TEXT_LAYER: Final = 1 << 20
_MAX_ERROR: Final = 4096
_CHUNK: Final = 1 << 20
_RATE_LIMIT_TRIES: Final = 3
_RATE_LIMIT_MAX_WAIT: Final = 10.0


@dataclass(frozen=True)
class Layer:
    media_type: str
    digest: str  # the hex
    size: int


def _layer(raw: Any) -> Layer | None:
    if not isinstance(raw, dict):
        return None
    match = _DIGEST.match(str(raw.get("digest", "")))
    size = raw.get("size")
    if match is None or not isinstance(size, int) or isinstance(size, bool) or size < 0:
        return None
    return Layer(str(raw.get("mediaType", "")), match["hex"], size)


def _error_message(response: httpx.Response) -> str:
    """The registry's ``{"errors": [{"code", "message"}]}``, or its status."""
    try:
        raw = b""
        for chunk in response.iter_bytes():  # the first 4 KiB: an error body may be endless
            raw += chunk
            if len(raw) >= _MAX_ERROR:
                break
        body = json.loads(raw[:_MAX_ERROR])
        first = body["errors"][0]
        return f"{first.get('code', '')}: {first.get('message', '')}".strip(": ")
    except (ValueError, KeyError, IndexError, TypeError, httpx.HTTPError):
        return f"HTTP {response.status_code}"


def _refusal(response: httpx.Response, what: str) -> PullError:
    status = response.status_code
    message = _error_message(response)
    if status == 404:
        return PullError("not_found", f"{what}: not in the registry ({message})")
    if status in (401, 403):
        return PullError("unauthorized", f"{what}: the registry refused access ({message})")
    if status == 429:
        after = response.headers.get("Retry-After")
        wait = f" (it asks to wait {after} s)" if after else ""
        return PullError("rate_limited", f"{what}: the registry is rate limiting this client{wait}")
    return PullError("hub_error", f"{what}: the registry answered {status} ({message})")


def _retry_after(response: httpx.Response) -> float | None:
    try:
        wait = float(response.headers.get("Retry-After", ""))
    except ValueError:
        return None
    return wait if 0 <= wait <= _RATE_LIMIT_MAX_WAIT else None


def _range_start(response: httpx.Response) -> int | None:
    """Where a 206's ``Content-Range: bytes START-END/SIZE`` starts; None without one."""
    found = _CONTENT_RANGE.match(response.headers.get("Content-Range", ""))
    return int(found["start"]) if found else None


class _Registry:
    def __init__(self, base: str, ref: OllamaReference, settings: PullSettings) -> None:
        self.base = f"{base}/v2/{ref.namespace}/{ref.model}"
        self.ref = ref
        timeout = httpx.Timeout(10.0, read=settings.stall_seconds)
        self.client = httpx.Client(timeout=timeout, follow_redirects=True, trust_env=True)

    def get(self, url: str, headers: dict[str, str], what: str) -> httpx.Response:
        """A GET streamed open, retried a few times on a short ``Retry-After``; the
        caller closes it. Raises :class:`PullError` for any refusal."""
        for attempt in range(_RATE_LIMIT_TRIES):
            try:
                response = self.client.send(
                    self.client.build_request("GET", url, headers=headers), stream=True
                )
            except httpx.TimeoutException as exc:
                raise PullError("stalled", f"{what}: the registry stopped answering") from exc
            except (httpx.HTTPError, httpx.InvalidURL) as exc:  # InvalidURL: a bad redirect
                raise PullError(
                    "hub_error", f"{what}: cannot reach the registry at {url} ({exc})"
                ) from exc
            if response.status_code in (200, 206, 416):
                return response
            try:
                wait = _retry_after(response) if response.status_code == 429 else None
                if wait is None or attempt == _RATE_LIMIT_TRIES - 1:
                    raise _refusal(response, what)
            finally:
                response.close()
            time.sleep(wait)
        raise AssertionError("unreachable")

    def manifest(self) -> list[Layer]:
        what = str(self.ref)
        response = self.get(
            f"{self.base}/manifests/{self.ref.tag}", {"Accept": MANIFEST_TYPES}, what
        )
        try:
            raw = b""
            for chunk in response.iter_bytes():
                raw += chunk
                if len(raw) > _MAX_MANIFEST:
                    raise PullError("hub_error", f"{what}: the manifest is over 1 MiB")
        except httpx.HTTPError as exc:
            raise PullError("hub_error", f"{what}: the manifest was cut ({exc})") from exc
        finally:
            response.close()
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise PullError("hub_error", f"{what}: the manifest is not JSON") from exc
        layers = data.get("layers") if isinstance(data, dict) else None
        if not isinstance(layers, list):
            raise PullError("hub_error", f"{what}: the manifest lists no layers")
        found = [layer for raw_layer in layers if (layer := _layer(raw_layer)) is not None]
        if len(found) != len(layers):
            raise PullError("hub_error", f"{what}: a layer of the manifest has no valid digest")
        return found

    def text_layer(self, layer: Layer) -> bytes:
        what = f"{self.ref} ({layer.media_type})"
        if layer.size > _MAX_TEXT_LAYER:
            raise PullError("hub_error", f"{what}: {layer.size} bytes, over 1 MiB")
        response = self.get(f"{self.base}/blobs/sha256:{layer.digest}", {}, what)
        try:
            body = b""
            for chunk in response.iter_bytes():
                body += chunk
                if len(body) > layer.size:
                    break
        except httpx.HTTPError as exc:
            raise PullError("hub_error", f"{what}: cut ({exc})") from exc
        finally:
            response.close()
        if len(body) != layer.size or hashlib.sha256(body).hexdigest() != layer.digest:
            raise PullError("checksum", f"{what}: the bytes are not the manifest's digest")
        return body

    def blob(
        self, layer: Layer, partial: Path, transfer: Callable[[int], Transfer], folder: Path
    ) -> None:
        """Download ``layer`` into ``partial`` (resuming what is there) and check it."""
        what = f"{self.ref} (sha256:{layer.digest[:12]})"
        digest = hashlib.sha256()
        have = partial.stat().st_size if partial.exists() else 0
        if have > layer.size:
            partial.unlink()
            have = 0
        if have:
            with partial.open("rb") as handle:
                while chunk := handle.read(_CHUNK):
                    digest.update(chunk)
        headers = {"Range": f"bytes={have}-"} if have else {}
        response = self.get(f"{self.base}/blobs/sha256:{layer.digest}", headers, what)
        try:
            if response.status_code == 416 and have == layer.size:
                pass  # all of it arrived before
            elif response.status_code == 416:
                partial.unlink()
                raise PullError("hub_error", f"{what}: the registry refused to resume; start again")
            else:
                if have and response.status_code == 200:  # the Range was ignored
                    have = 0
                    digest = hashlib.sha256()
                if response.status_code == 206 and _range_start(response) != have:
                    raise PullError(
                        "hub_error",
                        f"{what}: asked for the bytes from {have}, the registry sent others "
                        f"(Content-Range {response.headers.get('Content-Range')!r}); nothing "
                        "was written",
                    )
                moving = transfer(have)
                with partial.open("r+b" if have else "wb") as out:
                    out.seek(have)
                    out.truncate()
                    try:
                        for chunk in response.iter_bytes():
                            if out.tell() + len(chunk) > layer.size:
                                raise PullError(
                                    "hub_error",
                                    f"{what}: more bytes than the manifest's {layer.size}",
                                )
                            out.write(chunk)
                            digest.update(chunk)
                            moving.advance(len(chunk))
                    except httpx.TimeoutException as exc:
                        raise PullError(
                            "stalled",
                            f"{what}: the registry stopped sending; the next pull resumes",
                        ) from exc
                    except httpx.HTTPError as exc:
                        raise Cut(
                            f"{what}: the download was cut ({exc}); a new pull resumes"
                        ) from exc
                    except OSError as exc:
                        full = disk.no_space(exc, folder)
                        if full is not None:
                            out.close()
                            partial.unlink(missing_ok=True)
                            raise full from exc
                        raise
                moving.finish()
        finally:
            response.close()
        size = partial.stat().st_size
        if size != layer.size or digest.hexdigest() != layer.digest:
            partial.unlink(missing_ok=True)
            raise PullError(
                "checksum",
                f"{what}: {size} bytes with SHA-256 {digest.hexdigest()}, not the manifest's; "
                "not kept, nothing was put under its name",
            )

    def close(self) -> None:
        self.client.close()


def _stem(ref: OllamaReference) -> str:
    prefix = "" if ref.namespace == "library" else f"{ref.namespace}/"
    return f"ollama/{prefix}{ref.model}-{ref.tag}"


def pull_ollama(
    ref: OllamaReference,
    settings: PullSettings,
    report: Report,
    cancel: threading.Event | None,
    clock: Callable[[], float],
) -> Pulled:
    registry = _Registry(settings.ollama_registry, ref, settings)
    try:
        return _pull(registry, ref, settings, report, cancel, clock)
    finally:
        registry.close()


@dataclass(frozen=True)
class _Plan:
    """The manifest's big layers (the model, its projector), where each goes, and
    which are already there."""

    layers: list[Layer]
    big: list[tuple[Layer, str]]
    finals: dict[str, Path]
    present: dict[str, bool]
    staging: Path


def _plan(layers: list[Layer], ref: OllamaReference, root: Path) -> _Plan:
    models = [layer for layer in layers if layer.media_type == MODEL]
    if len(models) != 1:
        raise PullError("hub_error", f"{ref}: the manifest has {len(models)} model layers, not one")
    projectors = [layer for layer in layers if layer.media_type == PROJECTOR][:1]
    stem = _stem(ref)
    folder, _, base = stem.rpartition("/")
    big = [(models[0], f"{stem}.gguf")]
    if projectors:
        big.append((projectors[0], f"{folder}/mmproj-{base}.gguf"))
    finals = {name: disk.within(root, name) for _, name in big}
    present = {
        name: disk.already_there(finals[name], layer.size, layer.digest) for layer, name in big
    }
    staging = disk.within(root, f"{disk.STAGING}/ollama")  # no planted symlink out
    return _Plan(layers, big, finals, present, staging)


def _partial(plan: _Plan, layer: Layer) -> Path:
    return plan.staging / f"sha256-{layer.digest}.partial"


def _announce(plan: _Plan, ref: OllamaReference, root: Path, report: Report) -> None:
    """Check the free space for what is still to fetch, and report the plan."""
    need = 0
    for layer, name in plan.big:
        if not plan.present[name]:
            partial = _partial(plan, layer)
            have = partial.stat().st_size if partial.exists() else 0
            need += max(0, layer.size - have)
    free = disk.check_space(root, need)
    files = tuple(
        PlannedFile(name, layer.size, layer.digest, plan.present[name]) for layer, name in plan.big
    )
    report(Planned(str(ref), files, need, free))


def _text_layers(registry: _Registry, plan: _Plan, ref: OllamaReference, root: Path) -> list[Path]:
    """Ollama's template, parameters and system prompt, beside the model."""
    extras = []
    for layer in plan.layers:
        suffix = _TEXT_LAYERS.get(layer.media_type)
        if suffix is None:
            continue
        path = disk.within(root, f"{_stem(ref)}.ollama-{suffix}")
        if path in extras:  # the first of each kind: a manifest listing more is not followed
            continue
        extras.append(path)
        if disk.already_there(path, layer.size, layer.digest):
            continue
        body = registry.text_layer(layer)
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = plan.staging / f"sha256-{layer.digest}.{os.getpid()}.{threading.get_ident()}"
        temporary.write_bytes(body)
        disk.move_into_place(temporary, path)
    return extras


def _pull(
    registry: _Registry,
    ref: OllamaReference,
    settings: PullSettings,
    report: Report,
    cancel: threading.Event | None,
    clock: Callable[[], float],
) -> Pulled:
    root = settings.models_dir
    root.mkdir(parents=True, exist_ok=True)
    plan = _plan(registry.manifest(), ref, root)
    _announce(plan, ref, root, report)
    plan.staging.mkdir(parents=True, exist_ok=True)
    fetched = 0
    for layer, name in plan.big:
        final = plan.finals[name]
        if plan.present[name]:
            report(FileReady(name, final, False))
            continue
        if cancel is not None and cancel.is_set():
            raise PullError("cancelled", f"{name}: cancelled")

        def start(resumed: int, shown: str = name, size: int = layer.size) -> Transfer:
            return Transfer(shown, size, resumed, settings, report, cancel, clock)

        partial = _partial(plan, layer)
        with disk.exclusive(partial, name):
            for attempt in range(CUT_RETRIES + 1):
                try:
                    registry.blob(layer, partial, start, root)
                    break
                except Cut:
                    if attempt == CUT_RETRIES:
                        raise
            disk.move_into_place(partial, final)
        fetched += layer.size
        report(FileReady(name, final, True))
    extras = _text_layers(registry, plan, ref, root)
    disk.tidy(plan.staging, root)
    projector = plan.finals[plan.big[1][1]] if len(plan.big) > 1 else None
    return Pulled(str(ref), (plan.finals[plan.big[0][1]],), projector, tuple(extras), fetched)


__all__ = ["pull_ollama"]
