"""Command line: ``python -m slm_server backends|router|check|status|models|launch|...``.

Argument parsing and wiring only; the work lives in the modules each command calls.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from slm_server import logging_setup
from slm_server.cli.launch import gateway
from slm_server.contracts.records import (
    HOLDING_STATES,
    BackendState,
    budget_view,
    pid_alive,
    read_state,
    read_state_file,
)
from slm_server.launch.footprint import NoEstimate, estimate_entry
from slm_server.launch.plan import Toolchain, plan_registry
from slm_server.registry import remote
from slm_server.registry.infill import infill_summary
from slm_server.registry.schema import (
    ConfigError,
    ModelEntry,
    Problem,
    RegistryFile,
    inspect_registry,
    parse_registry,
    read_registry_text,
)
from slm_server.settings import Settings, SettingsError, load_environment

if TYPE_CHECKING:
    from slm_server.add.command import Request as AddRequest
    from slm_server.contracts.commands import Reply


def _setup_logging(name: str, settings: Settings) -> None:
    """One line per record: ``2026-11-30T09:14:02.117Z [router] INFO message`` (UTC, like
    the watchdog log, so ``slm-logs.sh all`` can interleave them), or one JSON object
    per line with ``SLM_LOG_JSON=true`` (see ``slm_server.logging_setup``)."""
    logging_setup.configure(name, settings.telemetry.log_json)


_TOOL_MODES = {
    "native": "left to the chat template",
    "render": "written into the prompt by the router",
    "auto": "the template's where llama-server says it takes tools (GET /props), "
    "else written into the prompt by the router",
}


def _tools_lines(entry: ModelEntry) -> list[str]:
    """What ``check`` says of an entry's tool policy, and of each alias's own."""
    lines = []
    for name in (None, *entry.alias_names):
        if name is not None and entry.alias_tools(name) is None:
            continue
        policy = entry.tool_policy(name)
        repair = "calls checked and mended" if policy.repair else "calls passed as written"
        who = "tools" if name is None else f"tools as {name}"
        lines.append(f"{who}: {policy.mode}, {_TOOL_MODES[policy.mode]}; {repair}")
    return lines


def cmd_check(settings: Settings) -> int:
    """Validate the registry and print each model's launch command; start nothing."""
    path = settings.config_path
    registry = inspect_registry(read_registry_text(path), path)
    tools = Toolchain.discover(settings.llama_server_bin)
    budget = settings.memory.budget_mb
    slots = settings.slot_cache
    plans, failures = plan_registry(
        registry,
        tools,
        settings.log_dir,
        budget_mb=budget,
        slot_dir=slots.directory if slots.enabled else None,
    )
    for warning in registry.warnings:
        print(warning)
    for spec in registry.models:
        if not spec.entry.enabled:
            print(f"{spec.role} ({spec.entry.id}): disabled, skipped")
        elif spec.entry.remote:
            name = remote.missing_key(spec.entry, load_environment())
            key = f"; {name} is not set, no key will be sent" if name is not None else ""
            print(f"{spec.role} ({spec.entry.id}) -> remote {remote.shown_url(spec.entry)}{key}")
    memory_problems: list[Problem] = []
    always_mb = 0
    by_role = {spec.role: spec for spec in registry.models}
    for plan in plans:
        print(f"{plan.role} ({plan.model_id}) -> {plan.host}:{plan.port}, log {plan.log_path}")
        print("  " + " ".join(_quote(arg) for arg in plan.argv))
        spec = by_role[plan.role]
        needed, shown = _footprint(spec.entry, plan.prompt_cache_mb)
        print(f"  memory: {shown}; load: {spec.entry.load}")
        if spec.entry.model_type in ("lm", "multimodal"):
            for line in _tools_lines(spec.entry):
                print("  " + line)
            print("  " + infill_summary(spec.entry))
        if plan.slot_cache_key is not None:
            print(f"  prompt cache kept across unloads (key {plan.slot_cache_key})")
        elif spec.entry.backend == "llamacpp" and spec.entry.model_type in ("lm", "multimodal"):
            print(f"  prompt cache not kept across unloads: {plan.slot_cache_skip}")
        if needed is not None and needed > budget:
            memory_problems.append(
                Problem(
                    str(path),
                    spec.label,
                    "memory_mb" if spec.entry.memory_mb is not None else None,
                    f"needs {needed} MiB, more than the whole memory budget of {budget} MiB "
                    "(SLM_MEMORY_BUDGET_MB): it cannot be loaded even alone",
                )
            )
        if spec.entry.load == "always" and needed is not None:
            always_mb += needed
    if always_mb > budget:
        print(
            f"warning: the load: always models need {always_mb} MiB together, more than the "
            f"memory budget of {budget} MiB: no on-demand model will fit beside them"
        )
    problems = list(registry.problems)
    problems += [p for _spec, error in failures for p in error.problems]
    problems += memory_problems
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        return 1
    runtime = tools.llama
    if runtime is not None:
        print(f"llama.cpp server: {runtime.program} ({runtime.kind}, from {runtime.origin})")
    print(f"{registry.path}: {len(plans)} model(s) ready to launch")
    return 0


def _footprint(entry: ModelEntry, prompt_cache_mb: int | None) -> tuple[int | None, str]:
    """The footprint ``check`` judges an entry by (its ``memory_mb``, else the
    estimate and what its prompt cache may hold), and how to show it."""
    if entry.memory_mb is not None:
        return entry.memory_mb, f"{entry.memory_mb} MiB (memory_mb)"
    if prompt_cache_mb is None:
        cache = "; prompt cache unbounded (cache_ram: -1), not within the memory budget"
    elif prompt_cache_mb:
        cache = f" + prompt cache {prompt_cache_mb} MiB (--cache-ram)"
    else:
        cache = ""
    try:
        estimate = estimate_entry(entry)
    except NoEstimate as exc:
        return None, f"no estimate ({exc}){cache}"
    needed = estimate.mb + (prompt_cache_mb or 0)
    return needed, f"~{needed} MiB: ~{estimate.mb} MiB estimated ({estimate.detail}){cache}"


def _quote(arg: str) -> str:
    if arg and all(c.isalnum() or c in "-_./:=,@+" for c in arg):
        return arg
    return "'" + arg.replace("'", "'\\''") + "'"


def cmd_backends(settings: Settings) -> int:
    from slm_server.supervise.supervisor import Supervisor

    _setup_logging("backends", settings)
    text = read_registry_text(settings.config_path)
    registry = parse_registry(text, settings.config_path)
    return Supervisor(settings, registry, load_environment(), registry_text=text).run()


def _send_reload(settings: Settings) -> Reply:
    """The running supervisor's answer to a reload; ``CommandError`` when none answers."""
    import asyncio

    from slm_server.contracts import commands

    path = commands.socket_path(settings.log_dir)
    return asyncio.run(commands.send(path, commands.Command("reload")))


def _report_reload(reply: Reply) -> int:
    """Print what a reload changed, or every problem that kept it from changing anything."""
    from slm_server.add.reload import Reloaded

    out, err = Reloaded(reply).lines()
    for line in out:
        print(line)
    for line in err:
        print(line, file=sys.stderr)
    return 0 if reply.ok else 1


def cmd_reload(settings: Settings) -> int:
    """Ask the running supervisor to reload the registry; print what changed, or every
    problem that kept it from changing anything."""
    from slm_server.contracts import commands

    try:
        reply = _send_reload(settings)
    except commands.CommandError as exc:
        print(f"error: {exc}: is `backends` running?", file=sys.stderr)
        return 1
    return _report_reload(reply)


def cmd_add(settings: Settings, args: argparse.Namespace) -> int:
    """Add one registry entry for a local GGUF file (``slm_server.add``), then, unless
    told not to, reload the running gateway; with none running, say when it applies."""
    from slm_server.add.command import Request

    request = Request(args.model, args.id, args.load, args.port, args.dry_run)
    return _add_and_reload(settings, request, args.no_reload)


def _add_and_reload(settings: Settings, request: AddRequest, no_reload: bool) -> int:
    import asyncio
    import os

    from slm_server.add.command import add_model
    from slm_server.add.reload import reload_running

    code = add_model(settings, request, os.environ)
    if code or request.dry_run or no_reload:
        return code
    reloaded = asyncio.run(reload_running(settings.log_dir))
    if reloaded.reply is None:
        print(reloaded.skipped)
        return 0
    print("reloading the running gateway:")
    return _report_reload(reloaded.reply)


def cmd_pull(settings: Settings, args: argparse.Namespace) -> int:
    """Fetch a model from a hub (``slm_server.pull``); with ``--add``, then add it."""
    from slm_server.add.command import Request
    from slm_server.pull.command import pull_command

    code, pulled = pull_command(args.reference, settings.pull, sys.stdout, sys.stderr)
    if code or pulled is None or not args.add:
        return code
    request = Request(str(pulled.model), args.id, args.load, args.port)
    return _add_and_reload(settings, request, args.no_reload)


def _add_pull_arguments(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "reference",
        metavar="REF",
        help="owner/repo[:QUANT], owner/repo/file.gguf, or ollama:model[:tag]",
    )
    command.add_argument("--add", action="store_true", help="then add it to the registry")
    _entry_arguments(command, "with --add: ")


def _entry_arguments(command: argparse.ArgumentParser, when: str = "") -> None:
    """The options of the entry ``add`` writes (``pull --add`` takes them too)."""
    command.add_argument("--id", help=f"{when}the model id (default: from the file's name)")
    command.add_argument(
        "--load",
        choices=("always", "on_demand"),
        default="on_demand",
        help=f"{when}start it at launch, or on its first request (default: %(default)s)",
    )
    command.add_argument(
        "--port", type=_port, metavar="N", help=f"{when}its port (default: the next free one)"
    )
    command.add_argument(
        "--no-reload", action="store_true", help=f"{when}do not reload the running gateway"
    )


def _add_add_arguments(command: argparse.ArgumentParser) -> None:
    command.add_argument("model", metavar="PATH|NAME", help="a GGUF file, or a name `models` lists")
    _entry_arguments(command)
    command.add_argument("--dry-run", action="store_true", help="print the entry, write nothing")


def cmd_clear_slots(settings: Settings) -> int:
    """Delete every saved slot of ours (a running gateway saves again at its next unload)."""
    from slm_server.slotcache.store import SlotStore

    store = SlotStore(settings.slot_cache.directory, settings.slot_cache.budget_mb)
    removed = store.clear()
    print(f"{store.directory}: {removed} file(s) removed")
    return 0


def cmd_models(settings: Settings, as_json: bool) -> int:
    """List the GGUF models found in the usual places and the registry ids serving them;
    exit 0 even when none is found."""
    import os

    from slm_server.discover import listing
    from slm_server.discover.places import places

    path = settings.config_path
    try:
        registry: RegistryFile | None = inspect_registry(read_registry_text(path), path)
    except ConfigError as exc:
        registry = None
        for problem in exc.problems:
            print(f"registry not read, SERVED AS left empty: {problem}", file=sys.stderr)
    looked_in = places(os.environ, settings.pull.models_dir)
    listed = listing.discover(looked_in, listing.served_files(registry))
    print(listing.render_json(listed) if as_json else listing.render_table(listed, looked_in))
    return 0


def cmd_router(settings: Settings) -> int:
    import uvicorn

    from slm_server.cli.gc_tuning import tune_for_serving
    from slm_server.contracts.applied_registry import version_of
    from slm_server.router.app import production_app
    from slm_server.router.call.drain import Drain, DrainingServer
    from slm_server.router.edge.http_protocol import door_protocol

    _setup_logging("router", settings)
    text = read_registry_text(settings.config_path)
    registry = parse_registry(text, settings.config_path)
    drain = Drain(settings.serving.drain_timeout_seconds)
    app = production_app(settings, registry, drain, version=version_of(text))
    logging.getLogger("slm_server.router").info(
        "routing %d model(s) on http://%s:%d",
        len(registry.enabled),
        settings.router_host,
        settings.router_port,
    )
    config = uvicorn.Config(
        app,
        host=settings.router_host,
        port=settings.router_port,
        log_config=None,
        access_log=False,
        # Longer than clients' own keep-alive expiry (httpx: 5 s), so the router never
        # closes an idle connection just as a client reuses it.
        timeout_keep_alive=math.ceil(settings.serving.door.idle_timeout_seconds),
        http=door_protocol(settings.serving.door),
        # No proxy in front: X-Forwarded-* from a local client is not to be believed
        # (and checking it costs every request).
        proxy_headers=False,
        # No API here speaks WebSocket: an upgrade request is answered as plain HTTP,
        # and uvicorn loads no websockets library.
        ws="none",
        # uvicorn's own limit comes after ours, so our streams end with a clean error.
        timeout_graceful_shutdown=math.ceil(settings.serving.drain_timeout_seconds) + 5,
    )
    tune_for_serving()
    DrainingServer(config, drain).run()
    return 0


def _router_view(settings: Settings) -> dict[str, dict[str, Any]]:
    """Each model's ``status`` object as the running router sees it (idle TTL left),
    by id; empty when the router does not answer within a second."""
    url = f"{gateway.router_url(settings)}/v1/models"
    try:
        answer = gateway.get_json(url, gateway.settings_key(settings), timeout=1.0)
    except gateway.Unreachable:
        return {}
    body = answer.body if answer.status == 200 else None
    data = body.get("data", []) if isinstance(body, dict) else []
    if not isinstance(data, list):
        return {}
    return {
        str(m.get("id")): m["status"]
        for m in data
        if isinstance(m, dict) and isinstance(m.get("status"), dict)
    }


# Why a backend's slots are not kept, worth a line in ``status`` (the others are plain
# from the model's kind).
KEPT_NOT_SAID = ("sliding-window", "turned off", "cache_prompt")


def _memory(b: BackendState) -> str:
    """The footprint a backend is admitted by (its prompt cache's allowance included):
    measured, or ``~`` an estimate."""
    if b.footprint_mb is None:
        return "-"
    measured = b.memory_measured_mb
    estimated = measured is None or b.footprint_mb != measured + (b.prompt_cache_mb or 0)
    return f"{'~' if estimated else ''}{b.footprint_mb}M"


def _resident(b: BackendState) -> str:
    """Its resident memory at the last measure; ``!`` when above its footprint."""
    if b.memory_resident_mb is None:
        return "-"
    above = b.footprint_mb is not None and b.memory_resident_mb > b.footprint_mb
    return f"{b.memory_resident_mb}M{'!' if above else ''}"


def _print_table(
    launcher_pid: int | None,
    running: bool,
    backends: list[BackendState],
    budget_mb: int,
    router: dict[str, dict[str, Any]],
) -> None:
    held = sum(b.footprint_mb or 0 for b in backends if b.state in HOLDING_STATES)
    print(f"launcher pid {launcher_pid}: {'running' if running else 'not running'}")
    print(f"memory: {held} of {budget_mb} MiB held (SLM_MEMORY_BUDGET_MB)")
    columns = (
        "ROLE",
        "MODEL",
        "PORT",
        "STATE",
        "PID",
        "UPTIME",
        "MEMORY",
        "RESIDENT",
        "SAVED",
        "LOAD",
        "TTL LEFT",
        "RESTARTS",
        "BUDGET",
        "FREES IN",
        "LAST EXIT",
    )
    rows: list[tuple[str, ...]] = [columns]
    notes: list[str] = []
    now = time.time()
    for b in backends:
        alive = b.pid is not None and pid_alive(b.pid)
        state = b.state
        far = b.backend == "remote"  # no process here: no pid, uptime or budget
        if b.state in ("starting", "loading", "ready") and not (running and (alive or far)):
            state = "dead"
        uptime = _duration(now - b.started_at) if b.started_at and alive else "-"
        left = router.get(b.model_id, {}).get("idle_ttl_remaining")
        budget = budget_view(b, now)
        rows.append(
            (
                b.role,
                b.model_id,
                (b.url or "-") if far else str(b.port),
                state,
                str(b.pid) if b.pid is not None and alive else "-",
                uptime,
                _memory(b),
                _resident(b),
                "-" if b.slot_cache_tokens is None else str(b.slot_cache_tokens),
                b.load,
                _duration(left) if isinstance(left, int | float) else "-",
                str(b.restarts),
                "-" if far else f"{budget.remaining}/{budget.max_restarts}",
                _frees_in(b, budget.frees_at, now),
                b.last_exit or "-",
            )
        )
        if b.reason or b.last_restart_reason:
            why = b.reason or ""
            if b.last_restart_reason:
                why = f"{why} (last restart: {b.last_restart_reason})".strip()
            notes.append(f"  {b.role}: {why}")
        if b.slot_cache_skip is not None and b.slot_cache_skip.startswith(KEPT_NOT_SAID):
            notes.append(f"  {b.role}: prompt cache not kept across unloads: {b.slot_cache_skip}")
        if b.prompt_cache_mb is None:
            notes.append(f"  {b.role}: prompt cache unbounded (cache_ram: -1)")
        if _resident(b).endswith("!"):
            notes.append(
                f"  {b.role}: resident {b.memory_resident_mb} MiB, above the "
                f"{b.footprint_mb} MiB it is admitted by"
            )
    widths = [max(len(row[i]) for row in rows) for i in range(len(columns))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))
    for note in notes:
        print(note)


def _frees_in(b: BackendState, frees_at: float | None, now: float) -> str:
    """When the restart budget frees up; for an ejected remote, when its ejection ends."""
    if b.ejected_until is not None:
        return _duration(max(0.0, b.ejected_until - now))
    return _duration(frees_at - now) if frees_at is not None else "-"


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _ready_count(running: bool, backends: list[BackendState]) -> int:
    """Backends that are ready *and* whose process and launcher are alive, and
    on-demand models waiting unloaded (no failure: they load on their first request)."""
    if not running:
        return 0
    ready = sum(
        1 for b in backends if b.state == "ready" and (b.backend == "remote" or pid_alive(b.pid))
    )
    return ready + sum(1 for b in backends if b.state == "unloaded")


def _wait_for_backends(settings: Settings, timeout: float, launcher_pid: int | None) -> None:
    """Print state changes until no backend is starting, the launcher is gone, or
    ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    seen: dict[str, str] = {}
    while time.monotonic() < deadline:
        pid, backends = read_state(settings.state_path)
        if launcher_pid is not None and pid != launcher_pid:
            backends = []
        for b in backends:
            if seen.get(b.role) != b.state:
                seen[b.role] = b.state
                suffix = f" ({b.reason})" if b.reason else ""
                print(f"  {b.role} ({b.model_id}) on port {b.port}: {b.state}{suffix}", flush=True)
        probe_pid = launcher_pid if launcher_pid is not None else pid
        if backends and not any(b.state == "starting" for b in backends):
            return
        if probe_pid is not None and not pid_alive(probe_pid):
            return
        time.sleep(0.5)


def cmd_status(settings: Settings, wait: float | None = None, launcher: int | None = None) -> int:
    """Print each backend's state as the launcher published it; with ``wait``, first
    follow the launcher until every backend has left ``starting``."""
    if wait is not None:
        _wait_for_backends(settings, wait, launcher)
    state = read_state_file(settings.state_path)
    launcher_pid, backends = state.launcher_pid, state.backends
    if not backends or (launcher is not None and launcher_pid != launcher):
        print(f"no launcher state at {settings.state_path}: is `backends` running?")
        return 1
    # The launcher is the one that wrote the file only if its create time matches too.
    running = state.launcher_running()
    router = _router_view(settings) if running else {}
    _print_table(launcher_pid, running, backends, settings.memory.budget_mb, router)
    stamp = state.registry
    if stamp is not None:
        loaded = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stamp.loaded_at))
        print(
            f"registry: {stamp.path}, version {stamp.version} "
            f"(generation {stamp.generation}, loaded {loaded})"
        )
    for r in state.retiring:
        left = _duration(max(0.0, r.deadline - time.time()))
        print(
            f"  retiring: {r.role} ({r.model_id}) port {r.port} pid {r.pid}, "
            f"{r.reason}; stopped within {left}"
        )
    return 0 if _ready_count(running, backends) else 1


def cmd_settings(settings: Settings, names: Sequence[str]) -> int:
    """Print the named settings as resolved (``.env`` under the environment), space
    separated, for shell scripts."""
    values = []
    for name in names:
        if name.startswith("_") or not hasattr(settings, name):
            print(f"error: no setting named {name!r}", file=sys.stderr)
            return 1
        values.append(str(getattr(settings, name)))
    print(" ".join(values))
    return 0


def _port(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be 1-65535 (got {value})")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 (got {value})")
    return value


def _add_mlx_rerank_arguments(command: argparse.ArgumentParser) -> None:
    from slm_server.mlx_rerank import scoring

    command.add_argument(
        "--model-path", required=True, help="local model directory or Hugging Face model id"
    )
    command.add_argument("--host", default="127.0.0.1")
    command.add_argument("--port", type=int, required=True)
    command.add_argument("--model-id", help="the id /v1/models lists (default: the model path)")
    command.add_argument(
        "--max-length",
        type=_positive_int,
        default=scoring.DEFAULT_MAX_LENGTH,
        metavar="TOKENS",
        help="truncate each prompt to this many tokens (default: %(default)s)",
    )
    command.add_argument(
        "--batch-size",
        type=_positive_int,
        default=scoring.DEFAULT_BATCH_SIZE,
        metavar="N",
        help="score at most this many documents per forward pass (default: %(default)s)",
    )
    command.add_argument(
        "--max-batch-tokens",
        type=_positive_int,
        default=scoring.DEFAULT_BATCH_TOKENS,
        metavar="TOKENS",
        help="and at most this many padded tokens per forward pass (default: %(default)s)",
    )


def cmd_mlx_rerank(settings: Settings, args: argparse.Namespace) -> int:
    from slm_server.mlx_rerank.scoring import Limits
    from slm_server.mlx_rerank.server import Options, serve

    _setup_logging("mlx-rerank", settings)
    limits = Limits(
        max_length=args.max_length,
        batch_size=args.batch_size,
        batch_tokens=args.max_batch_tokens,
    )
    options = Options(
        model_path=args.model_path,
        host=args.host,
        port=args.port,
        model_id=args.model_id or args.model_path,
        limits=limits,
    )
    return serve(options)


def _add_logs_arguments(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "mode",
        nargs="?",
        default="server",
        choices=("server", "watchdog", "all", "raw"),
        help="server: start.out (default); watchdog: the watchdog events as a "
        "timeline; all: both merged by time; raw: both files unformatted",
    )
    command.add_argument("-f", "--follow", action="store_true", help="keep printing appended lines")


COMMANDS: dict[str, str] = {
    "backends": "start one server process per enabled model and supervise them",
    "router": "serve the OpenAI-compatible router",
    "check": "validate the registry and print each launch command",
    "status": "print each backend's state",
    "reload": "reload the registry into the running gateway (only what changed restarts)",
    "settings": "print resolved settings by name, for scripts",
    "clear-slots": "delete every saved prompt cache (SLM_SLOT_CACHE_DIR)",
    "logs": "show start.out and the watchdog log (server, watchdog, all or raw)",
    "mlx-rerank": "serve one Qwen3-Reranker-style model with MLX (started by `backends`)",
    "models": "list the GGUF models found on this machine and which the registry serves",
    "add": "add a registry entry for a GGUF file or a model `models` lists, then reload",
    "pull": "fetch a model from Hugging Face or Ollama's registry (with --add: then add it)",
    "launch": "start a coding agent (claude, codex, opencode) against the running gateway",
}


def split_agent_args(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """The command's own arguments, and for ``launch`` the agent's: everything after
    the first ``--``."""
    args = list(argv)
    if args[:1] == ["launch"] and "--" in args:
        cut = args.index("--")
        return args[:cut], args[cut + 1 :]
    return args, []


def _command_arguments(name: str, command: argparse.ArgumentParser, own: list[str]) -> None:
    """The arguments of the command ``name``."""
    if name == "settings":
        command.add_argument("names", nargs="+", metavar="NAME")
    if name == "mlx-rerank":
        _add_mlx_rerank_arguments(command)
    if name == "launch" and own[:1] == ["launch"]:  # the other commands never import it
        from slm_server.cli.launch.command import add_arguments

        add_arguments(command)
    if name == "status":
        command.add_argument(
            "--wait",
            type=float,
            metavar="SECONDS",
            help="first follow the launcher until no backend is starting",
        )
        command.add_argument(
            "--launcher",
            type=int,
            metavar="PID",
            help="only accept state published by this launcher process",
        )
    if name == "models":
        command.add_argument("--json", action="store_true", help="a JSON list of objects")
    if name == "logs":
        _add_logs_arguments(command)
    if name == "add":
        _add_add_arguments(command)
    if name == "pull":
        _add_pull_arguments(command)


def main(argv: Sequence[str] | None = None) -> int:
    own, agent_args = split_agent_args(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="python -m slm_server",
        description="slm_server: one registry, one server process per model, one router.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text in COMMANDS.items():
        command = sub.add_parser(name, help=help_text, description=help_text)
        _command_arguments(name, command, own)
    args = parser.parse_args(own)
    try:
        settings = Settings.from_env()
        if args.command == "launch":
            from slm_server.cli.launch.command import cmd_launch

            return cmd_launch(settings, args, agent_args)
        if args.command == "status":
            return cmd_status(settings, args.wait, args.launcher)
        if args.command == "settings":
            return cmd_settings(settings, args.names)
        if args.command == "backends":
            return cmd_backends(settings)
        if args.command == "reload":
            return cmd_reload(settings)
        if args.command == "models":
            return cmd_models(settings, args.json)
        if args.command == "add":
            return cmd_add(settings, args)
        if args.command == "pull":
            return cmd_pull(settings, args)
        if args.command == "clear-slots":
            return cmd_clear_slots(settings)
        if args.command == "router":
            return cmd_router(settings)
        if args.command == "mlx-rerank":
            return cmd_mlx_rerank(settings, args)
        if args.command == "logs":
            from slm_server.cli import logview

            return logview.main(
                args.mode, settings.log_dir, settings.watchdog.log_path, args.follow
            )
        return cmd_check(settings)
    except SettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except ConfigError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
