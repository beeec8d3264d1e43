"""The supervisor's fake process layer: a :class:`ProcessControl` in memory, with
children whose exit the test decides, health answers it chooses (one may hang
forever), signals recorded; a clock that moves on every reading; and a
:class:`Supervisor` built on them. No process is started and no port is opened.

Tests synchronise on the shell's own tasks and on turns of its loop (:func:`until`),
never on sleeps.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from slm_server.contracts.states import State
from slm_server.launch.plan import LaunchPlan, Toolchain
from slm_server.launch.process import PortHolder
from slm_server.launch.runtime import LlamaRuntime
from slm_server.registry.schema import ModelEntry, RegistryFile
from slm_server.settings import Settings
from slm_server.supervise.core.confirm import Evidence, Probe, ProcessStatus
from slm_server.supervise.core.confirm import Reply as ProbeReply
from slm_server.supervise.shell.evidence import ProbeError, Target
from slm_server.supervise.supervisor import Supervisor
from tests.registry_entries import model_spec

LLAMA = "/opt/llama/llama-server"
TOOLS = Toolchain(llama=LlamaRuntime("native", LLAMA, "test"), llama_error=None, mlx_server=None)
WALL = 1_700_000_000.0
STOP_TIMEOUT = 0.3
GENTLE = frozenset({signal.SIGTERM, signal.SIGKILL})
ONLY_SIGKILL = frozenset({signal.SIGKILL})
UNKILLABLE: frozenset[int] = frozenset()
HANG = None  # a health answer that never comes


class FakeChild:
    """A backend process: it ends when the test says, or on a signal it yields to."""

    def __init__(self, pid: int, role: str, ends_on: frozenset[int]) -> None:
        self._pid = pid
        self.role = role
        self.ends_on = ends_on
        self.status: int | None = None

    @property
    def pid(self) -> int:
        return self._pid

    @property
    def create_time(self) -> float:
        return 1000.0 + self._pid

    @property
    def started_at(self) -> float:
        return 0.0

    @property
    def exit_status(self) -> int | None:
        return self.status

    def poll(self) -> int | None:
        return self.status


HEALTHY = Probe(ProbeReply.OK, status=200)


class FakeControl:
    """:class:`ProcessControl` in memory."""

    def __init__(self) -> None:
        self.next_pid = 4000
        self.children: list[FakeChild] = []
        self.remote_probes: list[str] = []  # the remotes probed, by id
        self.remote_answers: list[tuple[Probe, Probe]] = []  # then healthy
        self.plans: list[LaunchPlan] = []
        self.ends_on: dict[str, frozenset[int]] = {}  # role -> signals its children obey
        self.health: dict[int, bool | None] = {}  # port -> answer (None: hang)
        self.probes: list[str] = []
        self.signals: list[tuple[int, int]] = []
        self.holders: dict[int, PortHolder] = {}
        self.strays_killed: list[int] = []
        self.trim_error: OSError | None = None
        self.trimmed: dict[Path, int] = {}  # log -> the bytes its trim reports
        self.leftovers: set[int] = set()  # pids of an earlier launcher's live backends
        self.leftovers_stopped: list[tuple[int, float]] = []
        self.spawn_error: OSError | None = None
        self.resident: dict[int, int] = {}  # pid -> resident MiB of its tree
        # The slot API, as llama-server with --slot-save-path: tokens each port's slot 0
        # holds, every POST made, and answers that replace the real ones (by action).
        self.slot_tokens: dict[int, int] = {}
        self.slot_posts: list[tuple[int, str]] = []  # port, path
        self.slot_failures: dict[str, tuple[int, bytes]] = {}
        self.slot_silent = False  # no answer to the slot API: it times out, as for real

    def child(self, role: str, index: int = -1) -> FakeChild:
        return [c for c in self.children if c.role == role][index]

    def signals_of(self, pid: int) -> list[int]:
        return [sig for target, sig in self.signals if target == pid]

    def spawn(self, plan: LaunchPlan) -> FakeChild:
        if self.spawn_error is not None:
            raise self.spawn_error
        self.next_pid += 1
        child = FakeChild(self.next_pid, plan.role, self.ends_on.get(plan.role, GENTLE))
        self.children.append(child)
        self.plans.append(plan)
        return child

    def signal_group(self, pid: int, sig: int) -> None:
        self.signals.append((pid, sig))
        for child in self.children:
            if child.pid == pid and child.status is None and sig in child.ends_on:
                child.status = -sig

    def port_holder(self, host: str, port: int) -> PortHolder | None:
        return self.holders.get(port)

    def kill_stray(self, pid: int, create_time: float | None, timeout: float) -> bool:
        self.strays_killed.append(pid)
        self.holders = {port: h for port, h in self.holders.items() if h.pid != pid}
        return True

    def port_free_within(self, host: str, port: int, timeout: float) -> bool:
        return port not in self.holders

    def stop_leftover(self, pid: int, create_time: float, timeout: float) -> bool:
        if pid not in self.leftovers:
            return False
        self.leftovers.discard(pid)
        self.leftovers_stopped.append((pid, create_time))
        return True

    async def post_json(
        self, base_url: str, path: str, payload: Any, timeout: float
    ) -> tuple[int, bytes]:
        port = int(base_url.rsplit(":", 1)[1])
        self.slot_posts.append((port, path))
        slot = int(path.split("/")[2].split("?")[0])
        action = path.rsplit("=", 1)[1]
        if self.slot_silent:
            await asyncio.sleep(timeout)
            raise ProbeError(ProbeReply.TIMED_OUT, f"{path}: no answer within {timeout:.3g}s")
        if action in self.slot_failures:
            return self.slot_failures[action]
        [plan] = [p for p in self.plans if p.port == port][-1:]
        folder = Path(plan.argv[plan.argv.index("--slot-save-path") + 1])
        file = folder / payload["filename"]
        if action == "save":
            tokens = self.slot_tokens.get(port, 0) if slot == 0 else 0
            file.write_text(json.dumps({"tokens": tokens}))
            answer = {"n_saved": tokens, "n_written": file.stat().st_size}
        else:
            tokens = json.loads(file.read_text())["tokens"]
            self.slot_tokens[port] = tokens
            answer = {"n_restored": tokens, "n_read": file.stat().st_size}
        return 200, json.dumps({"id_slot": slot, "filename": file.name, **answer}).encode()

    async def probe(self, base_url: str, path: str, timeout: float) -> bool:
        url = f"{base_url}{path}"
        self.probes.append(url)
        port = int(url.rsplit(":", 1)[1].split("/", 1)[0])
        answer = self.health.get(port, True)
        if answer is None:
            await asyncio.get_running_loop().create_future()  # never resolved
        return bool(answer)

    async def gather_evidence(
        self, base_url: str, target: Target, budget_seconds: float
    ) -> Evidence:
        return Evidence(process=ProcessStatus.STOPPED)

    async def probe_remote(self, entry: ModelEntry, budget_seconds: float) -> tuple[Probe, Probe]:
        self.remote_probes.append(entry.id)
        return self.remote_answers.pop(0) if self.remote_answers else (HEALTHY, HEALTHY)

    def trim_log(self, path: Path, max_bytes: int) -> int | None:
        if self.trim_error is not None:
            raise self.trim_error
        return self.trimmed.pop(path, None)

    def tail(self, path: Path, count: int) -> list[str]:
        return ["last line"]

    def resident_mb(self, pid: int) -> int | None:
        return self.resident.get(pid)

    async def aclose(self) -> None:
        pass


class StepClock:
    """Monotonic seconds that move ``step`` on every reading: waits bounded by the
    shell's clock (the 5 s after SIGKILL) pass in a few real polls."""

    def __init__(self, step: float) -> None:
        self.now = 500.0
        self.step = step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def port(index: int) -> int:
    return 8601 + index


# The memory budget of every supervisor made here: a model file that is not GGUF has no
# estimate, so its prompt cache is the budget's share alone (PROMPT_CACHE_MB).
BUDGET_MB = 8000
PROMPT_CACHE_MB = BUDGET_MB // 8


def make(
    tmp_path: Path,
    roles: tuple[str, ...] = ("a",),
    clock: Callable[[], float] = time.monotonic,
    fields: dict[str, Any] | None = None,
    **env: str,
) -> tuple[Supervisor, FakeControl]:
    model = tmp_path / "model.gguf"
    if not model.exists():
        model.write_bytes(b"")
    environ = {
        "SLM_ENV_FILE": str(tmp_path / "no.env"),
        "SLM_BACKEND_LOG_DIR": str(tmp_path / "logs"),
        "SLM_CONFIG": str(tmp_path / "models.yaml"),
        "SLM_STOP_TIMEOUT_SECONDS": str(STOP_TIMEOUT),
        "SLM_HEALTH_PROBE_TIMEOUT_SECONDS": "0.1",
        "SLM_WATCHDOG_RESTART_COOLDOWN_SECONDS": "0",
        "SLM_WATCHDOG_STARTUP_GRACE_SECONDS": "0",
        "SLM_WATCHDOG_SWEEP_SECONDS": "0.05",
        "SLM_MEMORY_BUDGET_MB": str(BUDGET_MB),
        "SLM_SLOT_CACHE_DIR": str(tmp_path / "slots"),
        **env,
    }
    specs = tuple(
        model_spec(
            role, f"m-{role}", port(index), index=index, model_path=str(model), **(fields or {})
        )
        for index, role in enumerate(roles)
    )
    registry = RegistryFile(path=tmp_path / "models.yaml", models=specs)
    control = FakeControl()
    supervisor = Supervisor(
        Settings.from_env(environ),
        registry,
        environ,
        clock=clock,
        wall=lambda: WALL,
        control=control,
        tools=TOOLS,
    )
    return supervisor, control


def events(supervisor: Supervisor, name: str | None = None) -> list[dict[str, Any]]:
    path = supervisor.settings.watchdog.log_path
    if not path.exists():
        return []
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    return [e for e in lines if name is None or e["event"] == name]


def state(supervisor: Supervisor, role: str = "a") -> State:
    return supervisor.backends[role].life.state


async def until(supervisor: Supervisor, condition: Callable[[], bool], what: str) -> int:
    """Turn the loop, waiting on its tasks in between, until ``condition``; the turns it
    took. Fails after a deadline rather than hanging."""
    deadline = time.monotonic() + 10.0
    turns = 0
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        await asyncio.sleep(0)  # let tasks spawned by the last turn start
        pending = set(supervisor.tasks.running)
        if pending:
            await asyncio.wait(pending, timeout=0.05, return_when=asyncio.FIRST_COMPLETED)
        supervisor.turn()
        turns += 1
    return turns


async def serving(supervisor: Supervisor, *roles: str) -> None:
    supervisor.start()
    wanted = roles or tuple(supervisor.backends)
    await until(
        supervisor, lambda: all(state(supervisor, r) is State.READY for r in wanted), "ready"
    )
