"""One entry appended to the registry file as text: the user's comments, order and
formatting stay byte for byte, the entry goes after the last line, indented as the
file's own entries are; the file is replaced atomically (a temporary file beside it,
then a rename), so a reader sees the old file or the new one, never half of it."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import yaml

NEW_FILE: Final = "models:\n"
DEFAULT_INDENT: Final = 2


class Unappendable(Exception):
    """The file's ``models`` cannot take an appended entry; the message says why."""


def entries_of(text: str) -> dict[str, Any]:
    """The ``models`` mapping of registry ``text`` as read (empty when it has none);
    raises :class:`Unappendable` when ``models`` is not a mapping."""
    data = yaml.safe_load(text)
    models = data.get("models") if isinstance(data, dict) else None
    if models is None:
        return {}
    if not isinstance(models, dict):
        raise Unappendable("its 'models' is not a mapping of roles: add the entry by hand")
    return models


def _indent(text: str) -> int:
    """The column of the file's first role under ``models:`` (two when it has none)."""
    root = yaml.compose(text)
    if not isinstance(root, yaml.MappingNode):
        return DEFAULT_INDENT
    for key, value in root.value:
        if key.value != "models":
            continue
        if isinstance(value, yaml.MappingNode) and value.value:
            if value.flow_style:
                raise Unappendable("its 'models' is written inline ({...}): add the entry by hand")
            column: int = value.value[0][0].start_mark.column
            return column
    return DEFAULT_INDENT


def appended(text: str, role: str, fields: Mapping[str, Any], comment: str) -> str:
    """``text`` with the entry ``role`` after its last line, a comment line above it;
    raises :class:`Unappendable` when the result does not read back as the old entries
    and the new one."""
    base = text if text.strip() else NEW_FILE
    before = entries_of(base)
    indent = max(_indent(base), 1)
    dumped = yaml.safe_dump(
        {role: dict(fields)}, sort_keys=False, width=1_000_000, indent=max(indent, 2)
    )
    lines = [f"# {comment}", *dumped.splitlines()]
    block = "".join(" " * indent + line + "\n" for line in lines)
    gap = "" if base.endswith("\n") else "\n"
    result = base + gap + ("\n" if base != NEW_FILE else "") + block
    try:
        after = entries_of(result)
    except yaml.YAMLError:
        after = {}
    if after != {**before, role: dict(fields)} or list(after) != [*before, role]:
        raise Unappendable("the entry does not read back when appended: add it by hand")
    return result


def write_atomically(path: Path, text: str) -> None:
    """Replace ``path``'s content with ``text`` (a symlinked registry: the file it
    names), keeping its permissions; a new file is created with its folder."""
    target = path.resolve() if path.is_symlink() else path
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = target.stat().st_mode & 0o777
    except FileNotFoundError:
        mode = 0o644
    fd, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


__all__ = ["NEW_FILE", "Unappendable", "appended", "entries_of", "write_atomically"]
