"""``python -m slm_server pull REF``: fetch with progress on stderr, then say where the
files are (``--add`` then goes on to ``slm_server.add``: the caller's)."""

from __future__ import annotations

from typing import TextIO

from slm_server.pull.errors import PullError
from slm_server.pull.progress_view import TerminalView, human_bytes, printable
from slm_server.pull.result import Pulled
from slm_server.pull.run import pull
from slm_server.settings import PullSettings


def pull_command(
    reference: str, settings: PullSettings, out: TextIO, err: TextIO
) -> tuple[int, Pulled | None]:
    """Run one pull for a person; (exit code, what was pulled)."""
    view = TerminalView(err, err.isatty())
    try:
        pulled = pull(reference, settings, view)
    except PullError as exc:
        view.end_line()
        print(f"error: {printable(str(exc))}", file=err)
        return 1, None
    except KeyboardInterrupt:
        view.end_line()
        print("interrupted: what arrived is kept, and pulling again resumes it", file=err)
        return 130, None
    fetched = human_bytes(pulled.fetched_bytes) if pulled.fetched_bytes else "nothing"
    print(f"{pulled.reference}: {fetched} fetched; the model is {pulled.model}", file=out)
    if pulled.projector is not None:
        print(f"  its vision projector: {pulled.projector}", file=out)
    for extra in pulled.extras:
        print(f"  with: {extra}", file=out)
    return 0, pulled


__all__ = ["pull_command"]
