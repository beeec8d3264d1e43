"""``scripts/toolchain.sh`` on a machine that never had uv: inside ``uv run`` the
``python3`` on PATH is the project's venv, with neither pip nor uv, and the home
directory is empty. ``find_uv`` must still come back with a working uv (installed into
the cache with the base interpreter's pip), and ``find_pip`` with a working pip."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.processes import ROOT


def _bare_env(home: Path) -> dict[str, str]:
    venv_bin = Path(sys.executable).parent
    # Only the venv (python3 without pip) and the system directories: no uv anywhere.
    path = os.pathsep.join([str(venv_bin), "/usr/bin", "/bin"])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UV", "VIRTUAL_ENV"))}
    env.update({"HOME": str(home), "PATH": path, "SLM_CACHE_DIR": str(home / "cache")})
    return env


def _run(script: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", f". scripts/toolchain.sh; {script}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def test_find_uv_installs_uv_into_the_cache_when_python3_is_a_venv_without_pip(
    tmp_path: Path,
) -> None:
    env = _bare_env(tmp_path)
    probe = subprocess.run(
        ["bash", "-c", "command -v uv; python3 -m pip --version; python3 -m uv --version"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert probe.returncode != 0  # the situation under test: no uv, no pip in python3
    assert shutil.which("uv", path=env["PATH"]) is None

    found = _run("find_uv", env)
    assert found.returncode == 0, found.stderr
    uv = found.stdout.strip().splitlines()[-1]
    assert uv.startswith(str(tmp_path / "cache" / "uv"))
    version = subprocess.run([uv, "--version"], capture_output=True, text=True, check=True)
    assert version.stdout.startswith("uv ")

    again = _run("find_uv", env)  # cached: no second install
    assert again.returncode == 0
    assert again.stdout.strip() == uv
    assert "installing uv" not in again.stderr

    pip = _run("find_pip", env)
    assert pip.returncode == 0, pip.stderr
    works = _run("$(find_pip) --version", env)
    assert works.returncode == 0, works.stderr
