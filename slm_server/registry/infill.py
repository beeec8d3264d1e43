"""Whether a registry entry's model fills in the middle (llama-server's ``/infill``,
completions' ``suffix``): as its ``infill`` field says (true or false: for a model whose
file the gateway cannot read, a remote or an MLX model, or to override what was found),
else as its GGUF file's vocabulary says (:mod:`slm_server.memory.fill_in`); for the
router, :class:`InfillCache` reads each file once, off the event loop."""

from __future__ import annotations

import asyncio
from pathlib import Path

from slm_server.memory.fill_in import Infill, gguf_infill
from slm_server.registry.model_path import ModelPathError, resolve_model_path
from slm_server.registry.schema import ModelEntry
from slm_server.settings import PROJECT_ROOT


def _said(entry: ModelEntry) -> Infill | None:
    """What the entry itself says (its ``infill`` field; a model with no GGUF file the
    gateway reads cannot tell); None when its GGUF file is to be read."""
    if entry.infill is not None:
        said = "takes" if entry.infill else "does not take"
        return Infill(entry.infill, f"its registry entry says it {said} infill (infill: ...)")
    if entry.backend != "llamacpp":
        return Infill(
            None,
            f"a {entry.backend} model has no GGUF file the gateway reads; "
            "set infill: true in its entry if it fills in the middle",
        )
    return None


def _model_file(entry: ModelEntry, root: Path) -> Path | Infill:
    """The GGUF file of a llama.cpp entry, or why it cannot be read."""
    try:
        return Path(resolve_model_path(entry, root))
    except ModelPathError as exc:
        return Infill(None, f"its model file cannot be found ({exc.message})")


def entry_infill(entry: ModelEntry, root: Path = PROJECT_ROOT) -> Infill:
    """Whether the model of ``entry`` takes infill: as its ``infill`` field says, else
    as its GGUF file says (a llama.cpp entry); None for any other model."""
    said = _said(entry)
    if said is not None:
        return said
    path = _model_file(entry, root)
    return path if isinstance(path, Infill) else gguf_infill(path)


# A GGUF file as read: its path, size and modification time (a changed file is read
# again).
_FileKey = tuple[Path, int, int]


class InfillCache:
    """What each entry's model says of infill, for the router: its GGUF file read once
    (off the event loop) and kept while the file is unchanged."""

    def __init__(self, root: Path = PROJECT_ROOT) -> None:
        self.root = root
        self._known: dict[Path, tuple[_FileKey, Infill]] = {}
        self._reading: dict[_FileKey, asyncio.Future[Infill]] = {}

    def _key(self, entry: ModelEntry) -> _FileKey | Infill:
        """The file key of ``entry``'s GGUF, or the answer that needs no file read."""
        said = _said(entry)
        if said is not None:
            return said
        path = _model_file(entry, self.root)
        if isinstance(path, Infill):
            return path
        try:
            info = path.stat()
        except OSError as exc:
            return Infill(None, f"its GGUF file cannot be read ({exc.strerror or exc})")
        return (path, info.st_size, info.st_mtime_ns)

    def known(self, entry: ModelEntry) -> Infill | None:
        """What is known without reading the file (None: it is still to be read)."""
        key = self._key(entry)
        if isinstance(key, Infill):
            return key
        kept = self._known.get(key[0])
        return kept[1] if kept is not None and kept[0] == key else None

    async def of(self, entry: ModelEntry) -> Infill:
        """Whether ``entry``'s model takes infill, its file read if need be (once for
        any number of callers asking at the same time)."""
        key = self._key(entry)
        if isinstance(key, Infill):
            return key
        kept = self._known.get(key[0])
        if kept is not None and kept[0] == key:
            return kept[1]
        return await asyncio.shield(self._read(key))

    def start(self, entry: ModelEntry) -> None:
        """Begin reading ``entry``'s file, if it is still to be read (call from the
        event loop): a request refused for want of the tokens is then refused before
        it waits for a slot or a load, once the read is done."""
        key = self._key(entry)
        if not isinstance(key, Infill) and self.known(entry) is None:
            self._read(key)

    def _read(self, key: _FileKey) -> asyncio.Future[Infill]:
        reading = self._reading.get(key)
        if reading is None:
            reading = asyncio.ensure_future(asyncio.to_thread(gguf_infill, key[0]))
            self._reading[key] = reading
            reading.add_done_callback(lambda done: self._keep(key, done))
        return reading

    def _keep(self, key: _FileKey, done: asyncio.Future[Infill]) -> None:
        self._reading.pop(key, None)
        if not done.cancelled() and done.exception() is None:
            self._known[key[0]] = (key, done.result())


def infill_summary(entry: ModelEntry, root: Path = PROJECT_ROOT) -> str:
    """One line for ``check``: whether the model takes ``/infill`` and completions'
    ``suffix``, and why."""
    found = entry_infill(entry, root)
    verdict = {True: "yes", False: "no", None: "unknown (refused)"}[found.takes]
    return f"infill (/infill, suffix): {verdict}: {found.why}"


__all__ = ["InfillCache", "entry_infill", "infill_summary"]
