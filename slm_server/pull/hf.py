"""Pulling from the Hugging Face Hub through its own client library,
``huggingface_hub``: it reads ``HF_ENDPOINT``, ``HF_TOKEN`` (or the token ``hf auth
login`` saved) and the proxy settings, follows the hub's redirects to its CDN without
sending the token there, and resumes a download from its ``.incomplete`` file.

What is ours: the files are listed once at one commit (so every part of a split model
comes from the same revision), chosen (:mod:`slm_server.pull.choose`), downloaded into
``<models>/.pull/hf/<owner>/<repo>/``, checked against the hub's size and SHA-256, and
only then moved to ``<models>/<owner>/<repo>/<file>``.
"""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from slm_server.pull import files as disk
from slm_server.pull import hf_client
from slm_server.pull.choose import RemoteFile, choose
from slm_server.pull.errors import CUT_RETRIES, Cut, PullError
from slm_server.pull.events import FileReady, Planned, PlannedFile, Report
from slm_server.pull.reference import HfReference
from slm_server.pull.result import Pulled
from slm_server.pull.transfer import Transfer
from slm_server.settings import PullSettings


def _hub_error(exc: Exception, what: str) -> PullError:
    """A ``huggingface_hub`` or ``httpx`` error as a :class:`PullError`."""
    from huggingface_hub import errors

    if isinstance(exc, errors.GatedRepoError):
        return PullError(
            "unauthorized",
            f"{what} is gated: accept its terms on the hub, then set HF_TOKEN to a token "
            "of that account",
        )
    if isinstance(exc, errors.RepositoryNotFoundError):
        return PullError(
            "not_found",
            f"{what}: no such repository on the hub (or it is private: set HF_TOKEN)",
        )
    if isinstance(exc, errors.RevisionNotFoundError):
        return PullError("not_found", f"{what}: no such revision on the hub")
    if isinstance(exc, errors.EntryNotFoundError):
        return PullError("not_found", f"{what}: no such file on the hub")
    if isinstance(exc, errors.HfHubHTTPError):
        status = exc.response.status_code if exc.response is not None else None
        if status in (401, 403):
            return PullError(
                "unauthorized", f"{what}: the hub refused access ({status}); check HF_TOKEN"
            )
        if status == 429:
            after = exc.response.headers.get("Retry-After") if exc.response is not None else None
            wait = f" (it asks to wait {after} s)" if after else ""
            return PullError("rate_limited", f"{what}: the hub is rate limiting this client{wait}")
        return PullError("hub_error", f"{what}: the hub answered {status}: {_first_line(exc)}")
    if isinstance(exc, errors.LocalEntryNotFoundError):
        cause = exc.__cause__ or exc
        return PullError(
            "hub_error", f"{what}: the hub could not be reached ({_first_line(cause)})"
        )
    if isinstance(exc, httpx.ConnectError):
        from huggingface_hub import constants

        return PullError(
            "hub_error",
            f"{what}: cannot reach the hub at {constants.ENDPOINT} ({_first_line(exc)})",
        )
    if isinstance(exc, httpx.TimeoutException):
        return PullError("stalled", f"{what}: the hub stopped answering ({type(exc).__name__})")
    if isinstance(exc, (httpx.HTTPError, errors.FileMetadataError)):
        return PullError("hub_error", f"{what}: {_first_line(exc)}")
    if isinstance(exc, json.JSONDecodeError):  # over hf_client.MAX_API_BODY, or garbage
        return PullError("hub_error", f"{what}: the hub's answer is not JSON ({_first_line(exc)})")
    return PullError("hub_error", f"{what}: {type(exc).__name__}: {_first_line(exc)}")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


def _listing(ref: HfReference, timeout: float) -> tuple[str, list[RemoteFile]]:
    """The commit ``ref`` resolves to and the files it holds, with sizes and SHA-256
    (within ``timeout`` a read: the library sets none for this call)."""
    from huggingface_hub import HfApi

    try:
        info = HfApi().model_info(
            ref.repo_id, revision=ref.revision, files_metadata=True, timeout=timeout
        )
    except Exception as exc:  # the library's errors, mapped; anything else is the hub's
        raise _hub_error(exc, ref.repo_id) from exc
    if not info.sha:
        raise PullError(
            "hub_error", f"{ref.repo_id}: the hub gave no commit for {ref.revision or 'main'}"
        )
    listed = []
    for sibling in info.siblings or ():
        sha = sibling.lfs.sha256 if sibling.lfs is not None else None
        listed.append(RemoteFile(sibling.rfilename, int(sibling.size or 0), sha))
    return info.sha, listed


Start = Callable[[int | None, int], Transfer]


class _Bar:
    """The progress object ``huggingface_hub`` drives (its ``tqdm_class``): each
    update goes to our :class:`Transfer`, which may stop the download by raising."""

    start: Start

    def __init__(self, **kwargs: Any) -> None:
        total = kwargs.get("total")
        initial = int(kwargs.get("initial") or 0)
        self.transfer = type(self).start(int(total) if total is not None else None, initial)
        self._metering = hf_client.metering(self.transfer)
        self._metering.__enter__()

    def update(self, n: float | None = 1) -> None:
        if n is None:
            return
        if n < 0:
            self.transfer.restart()
        elif n:
            self.transfer.advance(int(n))

    def close(self) -> None:
        self._metering.__exit__(None, None, None)

    def __enter__(self) -> _Bar:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
        if kind is None:
            self.transfer.finish()


def _partial_bytes(staging: Path, name: str) -> int:
    """Bytes already in ``huggingface_hub``'s unfinished downloads of ``name``."""
    download = staging / ".cache" / "huggingface" / "download"
    parent = download / Path(name).parent
    try:
        return sum(p.stat().st_size for p in parent.glob(f"{Path(name).name}.*.incomplete"))
    except OSError:
        return 0


def _download(
    ref: HfReference, path: str, commit: str, staging: Path, bar: type[_Bar], root: Path
) -> Path:
    """``huggingface_hub``'s download of one file into ``staging``, tried again from
    where it stopped when the connection is cut (it retries timeouts itself)."""
    from huggingface_hub import hf_hub_download

    what = f"{ref.repo_id}/{path}"
    for attempt in range(CUT_RETRIES + 1):
        try:
            return Path(
                hf_hub_download(
                    ref.repo_id, path, revision=commit, local_dir=staging, tqdm_class=bar
                )
            )
        except PullError:
            raise
        except (httpx.RemoteProtocolError, httpx.ReadError) as exc:
            if attempt == CUT_RETRIES:
                raise Cut(f"{what}: the download was cut ({exc}); a new pull resumes") from exc
        except OSError as exc:
            full = disk.no_space(exc, root)
            if full is not None:
                shutil.rmtree(staging, ignore_errors=True)
                raise full from exc
            raise _hub_error(exc, what) from exc
        except Exception as exc:
            raise _hub_error(exc, what) from exc
    raise AssertionError("unreachable")


def pull_hf(
    ref: HfReference,
    settings: PullSettings,
    report: Report,
    cancel: threading.Event | None,
    clock: Callable[[], float],
) -> Pulled:
    from huggingface_hub import constants

    if constants.is_offline_mode():
        raise PullError("hub_error", "HF_HUB_OFFLINE is set: the hub may not be asked")
    hf_client.install()
    commit, listed = _listing(ref, settings.stall_seconds)
    choice = choose(ref.repo_id, listed, ref.quant, ref.file)
    root = settings.models_dir
    root.mkdir(parents=True, exist_ok=True)
    staging = disk.within(root, f"{disk.STAGING}/hf/{ref.repo_id}")  # no planted symlink out
    plan = [(f, f"{ref.repo_id}/{f.path}") for f in choice.files]
    finals = {name: disk.within(root, name) for _, name in plan}
    present = {name: disk.already_there(finals[name], f.size, f.sha256) for f, name in plan}
    need = sum(
        max(0, f.size - _partial_bytes(staging, f.path)) for f, name in plan if not present[name]
    )
    free = disk.check_space(root, need)
    report(
        Planned(
            str(ref),
            tuple(PlannedFile(name, f.size, f.sha256, present[name]) for f, name in plan),
            need,
            free,
        )
    )
    fetched = 0
    for f, name in plan:
        final = finals[name]
        if present[name]:
            report(FileReady(name, final, False))
            continue

        def start(
            total: int | None, initial: int, shown: str = name, size: int = f.size
        ) -> Transfer:
            if total is not None and total != size:  # nothing read yet: nothing to keep
                raise PullError(
                    "checksum",
                    f"{shown}: the hub serves {total} bytes, its listing says {size}; not fetched",
                )
            return Transfer(shown, size, initial, settings, report, cancel, clock, limit=size)

        bar = type("Bar", (_Bar,), {"start": staticmethod(start)})

        if cancel is not None and cancel.is_set():
            raise PullError("cancelled", f"{name}: cancelled")
        staged = _download(ref, f.path, commit, staging, bar, root)
        disk.verify(staged, f.size, f.sha256, name)
        disk.move_into_place(staged, final)
        fetched += f.size
        report(FileReady(name, final, True))
    disk.tidy(staging, root)
    parts = tuple(finals[f"{ref.repo_id}/{f.path}"] for f in choice.parts)
    projector = finals[f"{ref.repo_id}/{choice.projector.path}"] if choice.projector else None
    return Pulled(str(ref), parts, projector, (), fetched)


__all__ = ["pull_hf"]
