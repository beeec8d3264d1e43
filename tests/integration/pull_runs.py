"""Running ``python -m slm_server pull`` as a person would, against the hub stand-in:
its environment (the stand-in's endpoints, a models folder of the test's own, no token
from the home folder), in a pipe, under a pseudo terminal, or on a small filesystem
mounted for it alone (a tmpfs in a mount namespace of its own)."""

from __future__ import annotations

import hashlib
import os
import pty
import select
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tests.fakes.hub_control import HubStandin
from tests.processes import ROOT

TIMEOUT = 120.0


@dataclass(frozen=True)
class Run:
    code: int
    out: str
    err: str


def pull_env(hub: HubStandin, home: Path, **extra: str) -> dict[str, str]:
    """The pull's environment: the stand-in as both hubs, everything else of its own."""
    home.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "SLM_"))}
    env.update(
        SLM_LLAMA_SERVER_BIN=str(ROOT / "tests" / "fakes" / "fake-llama-server"),
        HOME=str(home),
        HF_HOME=str(home / "hf"),
        HF_ENDPOINT=hub.hf_endpoint,
        HF_HUB_DOWNLOAD_TIMEOUT="2",
        HF_HUB_ETAG_TIMEOUT="2",
        HF_HUB_DISABLE_TELEMETRY="1",
        SLM_OLLAMA_REGISTRY=hub.ollama_registry,
        SLM_MODELS_DIR=str(home / "models"),
        SLM_CONFIG=str(home / "models.yaml"),
        SLM_BACKEND_LOG_DIR=str(home / "logs"),
        SLM_ENV_FILE=str(home / "none.env"),
        SLM_PULL_STALL_SECONDS="5",
        NO_PROXY="*",
    )
    env.update(extra)
    return env


def env_for(hub: HubStandin, tmp_path: Path, **extra: str) -> dict[str, str]:
    """:func:`pull_env` with the home under a test's ``tmp_path``."""
    return pull_env(hub, tmp_path / "home", **extra)


def models_dir(env: dict[str, str]) -> Path:
    """Where a pull run with ``env`` puts its files."""
    return Path(env["SLM_MODELS_DIR"])


def pull(env: dict[str, str], *args: str) -> Run:
    """``pull`` in pipes (not a terminal)."""
    done = subprocess.run(
        [sys.executable, "-m", "slm_server", "pull", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    return Run(done.returncode, done.stdout, done.stderr)


def pull_in_a_terminal(env: dict[str, str], *args: str, columns: int = 100) -> Run:
    """``pull`` with its stdout and stderr on a pseudo terminal; everything it wrote
    there, control characters included, as ``out``."""
    leader, follower = pty.openpty()
    env = {**env, "COLUMNS": str(columns), "LINES": "24", "TERM": "xterm"}
    process = subprocess.Popen(
        [sys.executable, "-m", "slm_server", "pull", *args],
        env=env,
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=follower,
        stderr=follower,
    )
    os.close(follower)
    screen = bytearray()
    deadline = time.monotonic() + TIMEOUT
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 0.5)
            if not ready:
                if process.poll() is not None:
                    break
                continue
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the terminal's last writer has gone
                break
            if not chunk:
                break
            screen += chunk
        code = process.wait(timeout=10)
    finally:
        os.close(leader)
        if process.poll() is None:
            process.kill()
            process.wait()
    return Run(code, screen.decode("utf-8", "replace"), "")


def mount_namespace() -> list[str]:
    """``unshare`` into a mount namespace of the pull's own (mapping this user to root
    when it is not root), so a tmpfs mounted there is gone when the pull ends."""
    unshare = shutil.which("unshare")
    assert unshare is not None, "unshare (util-linux) is needed for the small-disk tests"
    return [unshare, "-m"] if os.geteuid() == 0 else [unshare, "-rm"]


def pull_on_a_small_disk(
    env: dict[str, str], size_kib: int, *args: str, fill_after_start: bool = False
) -> Run:
    """``pull`` into a ``size_kib`` tmpfs mounted at ``SLM_MODELS_DIR``; with
    ``fill_after_start``, once a partial file appears, the rest of the disk is filled
    by another writer (the disk fills during the download). The shell prints the
    folder's files after the pull, one per line, after ``--- left:``."""
    models = env["SLM_MODELS_DIR"]
    Path(models).mkdir(parents=True, exist_ok=True)
    fill = (
        'while [ -z "$(find "$M/.pull" \\( -name "*.partial" -o -name "*.incomplete" \\)'
        ' -size +0 2>/dev/null)" ]; do\n'
        '  kill -0 "$pid" 2>/dev/null || break\n'
        "  sleep 0.02\n"
        "done\n"
        'dd if=/dev/zero of="$M/filler" bs=64k 2>/dev/null\n'
        if fill_after_start
        else ""
    )
    script = (
        'M="$1"; shift\n'
        f'mount -t tmpfs -o size={size_kib}k tmpfs "$M" || exit 97\n'
        '"$@" & pid=$!\n'
        f"{fill}"
        'wait "$pid"; code=$?\n'
        'echo "--- left:" >&2\n'
        'find "$M" -type f ! -name filler >&2\n'
        'exit "$code"\n'
    )
    command = [
        *mount_namespace(),
        "sh",
        "-c",
        script,
        "small-disk",
        models,
        sys.executable,
        "-m",
        "slm_server",
        "pull",
        *args,
    ]
    done = subprocess.run(
        command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT, check=False
    )
    return Run(done.returncode, done.stdout, done.stderr)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def files_under(root: Path) -> list[str]:
    """Every file under ``root``, relative, sorted."""
    if not root.exists():
        return []
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
