"""Fresh servers for every benchmark run, each a real process on a free port, stopped
(its whole process group) when the run ends.

    with fast_fake(workdir) as backend, slm_router(workdir, backend) as router:
        ...  # drive router.url; router.pid is the process to measure

``fast_fake`` is :mod:`benchmarks.fastfake`; ``slm_router`` is ``python -m slm_server
router`` in front of one backend; ``litellm_proxy`` is LiteLLM's proxy from its own
virtual environment (made once by :func:`litellm_venv`, under
``~/.cache/slm_server/bench``); ``slm_router_watched`` is the router with the dashboard
open in a headless chromium; ``launcher`` is ``python -m slm_server backends`` on
registry entries, waited on until every backend is ready.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import httpx
import psutil
import yaml

from tests import one_shot
from tests.processes import ROOT, Command, free_port, pid_alive, poll, running_router, start_command
from tests.registry_entries import registry_entry

CACHE: Final = Path.home() / ".cache" / "slm_server" / "bench"
LITELLM_VENV: Final = CACHE / "litellm-venv"
LITELLM_REQUIREMENT: Final = "litellm[proxy]"
BENCH_MODEL: Final = "bench"
# Admission never refuses in the overhead runs.
WIDE_OPEN: Final = 256


@dataclass(frozen=True)
class Server:
    """A running server: the process to measure, its base URL, the model it serves."""

    name: str
    pid: int
    url: str
    model: str
    # A process tree running beside the server and measured with it (the dashboard's
    # browser), or None.
    companion: int | None = None

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])


def _healthy(url: str) -> bool:
    try:
        return one_shot.get(url, timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def _stop(popen: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """SIGTERM to the process group, SIGKILL after ``timeout``; always reaps."""
    if popen.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(popen.pid, signal.SIGTERM)
        try:
            popen.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(popen.pid, signal.SIGKILL)
            popen.wait()


@contextlib.contextmanager
def _process(
    argv: list[str],
    output: Path,
    health_url: str,
    startup_timeout: float,
    env: Mapping[str, str] | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    with output.open("wb") as log:
        popen = subprocess.Popen(  # noqa: S603 - argv built here from fixed parts
            argv,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
    try:
        poll(
            lambda: popen.poll() is not None or _healthy(health_url),
            startup_timeout,
            f"{argv[0]} to answer {health_url}",
            interval=0.1,
        )
        if popen.poll() is not None:
            raise RuntimeError(f"{' '.join(argv)} exited:\n{output.read_text()[-3000:]}")
        yield popen
    finally:
        _stop(popen)


@contextlib.contextmanager
def fast_fake(
    workdir: Path,
    chunks: int = 64,
    interval: float = 0.0,
    model: str = BENCH_MODEL,
    record: Path | None = None,
) -> Iterator[Server]:
    """:mod:`benchmarks.fastfake` on a free port, to be registered as ``model``; with
    ``record``, every request it gets is appended to that file."""
    port = free_port()
    argv = [sys.executable, "-m", "benchmarks.fastfake", "--port", str(port)]
    argv += ["--chunks", str(chunks), "--chunk-interval", str(interval)]
    if record is not None:
        argv += ["--record", str(record)]
    url = f"http://127.0.0.1:{port}"
    with _process(argv, workdir / f"fastfake-{port}.out", f"{url}/health", 30) as popen:
        yield Server("fastfake", popen.pid, url, model)


@contextlib.contextmanager
def bare_relay(workdir: Path, backends: Sequence[Server]) -> Iterator[Server]:
    """:mod:`benchmarks.bare_relay` in front of ``backends`` (each chosen by its
    ``model``; the first by default): the floor any proxy in Python pays here."""
    port = free_port()
    argv = [sys.executable, "-m", "benchmarks.bare_relay", "--port", str(port)]
    for backend in backends:
        argv += ["--upstream", f"{backend.model}={backend.port}"]
    url = f"http://127.0.0.1:{port}"
    with _process(argv, workdir / f"bare-relay-{port}.out", f"{url}/health", 30) as popen:
        yield Server("bare_relay", popen.pid, url, "")


def bench_entry(model: str, port: int) -> dict[str, Any]:
    """A registry entry for a backend that is already running on ``port``."""
    return registry_entry(
        model,
        port,
        model_path="unused.gguf",
        default_timeout=120,
        max_concurrency=WIDE_OPEN,
        max_queue=WIDE_OPEN,
    )


def router_env(workdir: Path, telemetry: bool, collector: str | None = None) -> dict[str, str]:
    """The router's environment; with ``telemetry``, OTLP export goes to ``collector``,
    else to a port where no collector listens."""
    env = {
        "SLM_CONFIG": str(workdir / "models.yaml"),
        "SLM_BACKEND_LOG_DIR": str(workdir / "logs"),
        "SLM_OTEL_ENABLED": "true" if telemetry else "false",
        "SLM_LLAMA_SERVER_BIN": "",
        "SLM_ENV_FILE": str(workdir / "no.env"),
    }
    if telemetry:
        env["SLM_OTLP_ENDPOINT"] = collector or f"http://127.0.0.1:{free_port()}"
    return env


@contextlib.contextmanager
def otlp_sink(workdir: Path) -> Iterator[str]:
    """:mod:`benchmarks.otlp_sink` on a free port, answering 200; yields its URL."""
    port = free_port()
    log = (workdir / "otlp-sink.out").open("wb")
    sink = subprocess.Popen(  # noqa: S603 - fixed arguments
        [sys.executable, "-m", "benchmarks.otlp_sink", "--port", str(port)],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        poll(lambda: port_open(port), 15, "the OTLP sink to listen")
        yield f"http://127.0.0.1:{port}"
    finally:
        sink.terminate()
        sink.wait(10)
        log.close()


def port_open(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
        return True
    return False


@contextlib.contextmanager
def slm_router(
    workdir: Path,
    backends: Sequence[Server],
    telemetry: bool = False,
    collector: bool = False,
    tree: Path = ROOT,
    entries: Mapping[str, Mapping[str, Any]] | None = None,
) -> Iterator[Server]:
    """``python -m slm_server router`` in front of ``backends``, each registered under
    its ``model``; with ``collector``, spans go to a local OTLP sink answering 200 (the
    defaults a user gets: telemetry exporting, metrics, the INFO access log). ``tree``:
    the checkout whose ``slm_server`` runs (another commit's, to compare). ``entries``
    adds fields to a model's registry entry (its aliases and preset), by model."""
    workdir.mkdir(parents=True, exist_ok=True)
    more = entries or {}
    registry = {
        "models": {
            b.model: bench_entry(b.model, b.port) | dict(more.get(b.model, {})) for b in backends
        }
    }
    (workdir / "models.yaml").write_text(yaml.safe_dump(registry, sort_keys=False))
    with contextlib.ExitStack() as stack:
        sink = stack.enter_context(otlp_sink(workdir)) if collector else None
        env = router_env(workdir, telemetry, sink)
        router, url = stack.enter_context(running_router(env, workdir, cwd=tree))
        yield Server("slm_server", router.pid, url, "")


@contextlib.contextmanager
def slm_router_watched(
    workdir: Path, backends: Sequence[Server], tree: Path = ROOT
) -> Iterator[Server]:
    """:func:`slm_router` with the dashboard open in a headless chromium the whole time
    (its polling, its charts and its event stream), the page shown once before anything is
    measured."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from tests.integration.browser import headless_chromium

    with slm_router(workdir, backends, tree=tree) as router, headless_chromium() as driver:
        driver.get(f"{router.url}/ui")
        WebDriverWait(driver, 30, poll_frequency=0.1).until(
            lambda d: (
                len(d.find_elements(By.CSS_SELECTOR, "#models tbody tr")) == len(backends)
                and d.find_elements(By.CSS_SELECTOR, 'svg.chart[data-chart="requests"]')
            )
        )
        browser = driver.service.process.pid
        with pinned(router, backends, browser):
            yield dataclasses.replace(router, companion=browser)


@contextlib.contextmanager
def slm_router_pinned(
    workdir: Path, backends: Sequence[Server], tree: Path = ROOT
) -> Iterator[Server]:
    """:func:`slm_router`, :func:`pinned` as beside the dashboard."""
    with slm_router(workdir, backends, tree=tree) as router, pinned(router, backends):
        yield router


def _pin(pid: int, cpus: Sequence[int]) -> None:
    """Every thread of ``pid`` and of its descendants onto ``cpus``."""
    with contextlib.suppress(psutil.Error):
        root = psutil.Process(pid)
        for member in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error, OSError):
                for thread in member.threads():
                    with contextlib.suppress(OSError):
                        os.sched_setaffinity(thread.id, cpus)


@contextlib.contextmanager
def pinned(
    router: Server, backends: Sequence[Server], browser: int | None = None
) -> Iterator[None]:
    """The router alone on the first CPU, everything else on the others: the load
    generator (this process), the backends and the browser. On a machine with two
    cores a browser competes with the router for CPU time and, worse, for the moments
    it is woken; kept off the router's CPU, what is left to measure is what serving
    the page costs the router. Nothing is pinned on a single CPU."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        yield
        return
    first, rest = cpus[:1], cpus[1:]
    _pin(router.pid, first)
    for pid in [*(b.pid for b in backends), *([browser] if browser is not None else [])]:
        _pin(pid, rest)
    mine = {t.id for t in psutil.Process().threads()}
    for tid in mine:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(tid, rest)
    try:
        yield
    finally:
        for tid in mine:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(tid, cpus)


def litellm_venv(report: Any = print) -> Path:
    """LiteLLM's proxy in its own virtual environment, installed on first use."""
    python = LITELLM_VENV / "bin" / "python"
    marker = LITELLM_VENV / ".bench-installed"
    if marker.exists() and python.exists():
        return LITELLM_VENV
    report(f"installing {LITELLM_REQUIREMENT} into {LITELLM_VENV} (once)")
    CACHE.mkdir(parents=True, exist_ok=True)
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    venv = ["uv", "venv", "--python", version, str(LITELLM_VENV)]
    subprocess.run(venv, check=True)  # noqa: S603 - fixed arguments
    install = ["uv", "pip", "install", "--python", str(python), LITELLM_REQUIREMENT]
    subprocess.run(install, check=True)  # noqa: S603 - fixed arguments
    marker.write_text(litellm_version() + "\n")
    return LITELLM_VENV


def litellm_version() -> str:
    done = subprocess.run(  # noqa: S603 - the virtual environment litellm_venv() made
        [
            str(LITELLM_VENV / "bin" / "python"),
            "-c",
            "import importlib.metadata as m; print(m.version('litellm'))",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip() or "unknown"


@contextlib.contextmanager
def litellm_proxy(workdir: Path, backends: Sequence[Server]) -> Iterator[Server]:
    """LiteLLM's proxy (one uvicorn worker) routing each backend's ``model`` to it."""
    venv = litellm_venv()
    workdir.mkdir(parents=True, exist_ok=True)
    config = {
        "model_list": [
            {
                "model_name": backend.model,
                "litellm_params": {
                    "model": f"openai/{backend.model}",
                    "api_base": f"{backend.url}/v1",
                    "api_key": "unused",
                },
            }
            for backend in backends
        ],
    }
    path = workdir / "litellm.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    port = free_port()
    argv = [str(venv / "bin" / "litellm"), "--config", str(path)]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"]
    # No network here: keep LiteLLM from fetching its price list and phoning home.
    # No keys either, as the router runs here: both gateways accept every request.
    env = {
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_TELEMETRY": "False",
        "LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY": "true",
    }
    url = f"http://127.0.0.1:{port}"
    output = workdir / f"litellm-{port}.out"
    with _process(argv, output, f"{url}/health/liveliness", 180, env) as popen:
        yield Server("litellm", popen.pid, url, "")


@dataclass
class Launched:
    """A running launcher (``python -m slm_server backends``) and its backends."""

    workdir: Path
    env: dict[str, str]
    command: Command

    @property
    def log_dir(self) -> Path:
        return self.workdir / "logs"

    def states(self) -> dict[str, dict[str, Any]]:
        try:
            data = json.loads((self.log_dir / "backends.state.json").read_text())
        except (OSError, ValueError):
            return {}
        return {b["role"]: b for b in data.get("backends", [])}

    def events(self, name: str) -> list[dict[str, Any]]:
        try:
            lines = (self.log_dir / "watchdog.jsonl").read_text().splitlines()
        except OSError:
            return []
        records = [json.loads(line) for line in lines if line.strip()]
        return [r for r in records if r.get("event") == name]


@contextlib.contextmanager
def launcher(
    workdir: Path, models: dict[str, dict[str, Any]], env: Mapping[str, str], tree: Path = ROOT
) -> Iterator[Launched]:
    """``python -m slm_server backends`` on ``models``, run from ``tree`` (another
    commit's checkout, to compare); yields once every backend is ready, stops it
    afterwards and waits until no backend it started is left."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "models.yaml").write_text(yaml.safe_dump({"models": models}, sort_keys=False))
    full_env = {
        "SLM_CONFIG": str(workdir / "models.yaml"),
        "SLM_BACKEND_LOG_DIR": str(workdir / "logs"),
        "SLM_ENV_FILE": str(workdir / "no.env"),
        "SLM_OTEL_ENABLED": "false",
        **env,
    }
    command = start_command("backends", full_env, workdir / "backends.out", cwd=tree)
    launched = Launched(workdir, full_env, command)
    pids: set[int] = set()
    try:
        poll(
            lambda: (
                command.popen.poll() is not None
                or (
                    # One state per replica.
                    len(launched.states())
                    == sum(int(m.get("replicas", 1)) for m in models.values())
                    # An on-demand model waits unloaded for its first request.
                    and all(
                        s.get("state") in ("ready", "unloaded") for s in launched.states().values()
                    )
                )
            ),
            180,
            "every backend to be ready",
            interval=0.1,
        )
        if command.popen.poll() is not None:
            raise RuntimeError(f"launcher exited:\n{command.text()[-3000:]}")
        yield launched
    finally:
        pids |= {s["pid"] for s in launched.states().values() if s.get("pid")}
        pids |= {e["new_pid"] for e in launched.events("restart_succeeded") if e.get("new_pid")}
        command.stop()
        deadline = time.monotonic() + 15
        while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)


@contextlib.contextmanager
def router_for(workdir: Path, env: Mapping[str, str], tree: Path = ROOT) -> Iterator[Server]:
    """The router on the launcher's registry and environment, run from ``tree``."""
    with running_router(env, workdir, cwd=tree) as (router, url):
        yield Server("slm_server", router.pid, url, "")


def scripted_fake_entry(workdir: Path, model_id: str, script: dict[str, Any]) -> dict[str, Any]:
    """A registry entry the launcher serves with the scriptable fake llama-server
    (``tests/fakes/fake-llama-server``): its "model file" is the fake's ``script``."""
    behaviour = workdir / f"{model_id}.gguf"  # its content scripts the fake
    behaviour.write_text(json.dumps({"script": script}))
    return {
        "id": model_id,
        "backend": "llamacpp",
        "port": free_port(),
        "model_path": str(behaviour),
        "default_timeout": 60,
        "quantization": "Q4_0",
    }


__all__ = [
    "BENCH_MODEL",
    "Launched",
    "Server",
    "bare_relay",
    "bench_entry",
    "fast_fake",
    "free_port",
    "launcher",
    "litellm_proxy",
    "litellm_venv",
    "router_for",
    "scripted_fake_entry",
    "slm_router",
]
