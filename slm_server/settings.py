"""Process settings from the environment (``SLM_*``) and an optional ``.env`` file.

Settings are read once, at start, into a frozen value that is passed to whatever needs
it. ``.env`` never overrides a variable already present in the environment, so
``SLM_ROUTER_PORT=9000 python -m slm_server router`` beats the file.

    settings = Settings.from_env()            # reads os.environ and .env
    settings.router_port                       # 8000 unless SLM_ROUTER_PORT says otherwise
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from slm_server.memory.available import simulated_mb
from slm_server.memory.physical import default_budget_mb, default_floor_mb, physical_memory_mb

PROJECT_ROOT = Path(__file__).resolve().parent.parent


class SettingsError(ValueError):
    """An environment variable holds a value of the wrong shape."""


def read_dotenv(path: Path) -> dict[str, str]:
    """Parse a ``.env`` file: ``KEY=value`` lines, ``#`` comments, optional quotes,
    optional leading ``export``. A missing file yields an empty mapping."""
    values: dict[str, str] = {}
    if not path.is_file():
        return values
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        key = key.strip().removeprefix("export ").strip()
        value = value.strip()
        if value[:1] in ("'", '"') and value.find(value[0], 1) > 0:
            value = value[1 : value.find(value[0], 1)]
        elif " #" in value:
            value = value.split(" #", 1)[0].rstrip()
        values[key] = value
    return values


def load_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The effective environment: ``.env`` (``SLM_ENV_FILE`` or ``<project>/.env``)
    overlaid by the real environment."""
    env = dict(os.environ if environ is None else environ)
    dotenv_path = Path(env.get("SLM_ENV_FILE", str(PROJECT_ROOT / ".env"))).expanduser()
    if not dotenv_path.is_absolute():
        dotenv_path = PROJECT_ROOT / dotenv_path
    merged = read_dotenv(dotenv_path)
    merged.update(env)
    return merged


def _float(env: Mapping[str, str], name: str, default: float, *, minimum: float = 0.0) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not a number") from None
    if not math.isfinite(value):
        raise SettingsError(f"{name}={raw!r} must be a finite number")
    if value < minimum:
        raise SettingsError(f"{name}={raw!r} must be at least {minimum:g}")
    return value


def _kib(env: Mapping[str, str], name: str, default: float) -> int:
    """A size in KiB (fractions allowed), as bytes."""
    return int(_float(env, name, default, minimum=0.001) * 1024)


def _mib(env: Mapping[str, str], name: str, default: float) -> int:
    """A size in MiB (fractions allowed), as bytes."""
    return int(_float(env, name, default, minimum=0.001) * 1024 * 1024)


def _int(
    env: Mapping[str, str], name: str, default: int, *, minimum: int = 0, maximum: int | None = None
) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not an integer") from None
    if value < minimum:
        raise SettingsError(f"{name}={raw!r} must be at least {minimum}")
    if maximum is not None and value > maximum:
        raise SettingsError(f"{name}={raw!r} must be at most {maximum}")
    return value


def _path(env: Mapping[str, str], name: str, default: Path) -> Path:
    raw = env.get(name, "").strip()
    path = Path(raw).expanduser() if raw else default
    return path if path.is_absolute() else PROJECT_ROOT / path


def _bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise SettingsError(f"{name}={raw!r} is not a boolean (true/false)")


@dataclass(frozen=True)
class WatchdogSettings:
    """The watchdog's tunables (``SLM_WATCHDOG_*``), all in seconds unless named."""

    enabled: bool
    failure_threshold: int
    stall_seconds: float
    sweep_seconds: float
    max_restarts: int
    restart_window_seconds: float
    restart_cooldown_seconds: float
    startup_grace_seconds: float
    request_dir: Path
    log_path: Path
    backend_log_max_mb: float
    confirm_seconds: float = 10.0
    # The silence that trips a stream of an engine that reports its prompt progress
    # (native llama-server): no byte, no progress report and no token for this long.
    silence_seconds: float = 30.0
    # Remotes (``backend: remote``) are ejected, not restarted: the first ejection's
    # length, the longest (each repeated one doubles), and the confirmed trips in a
    # row that eject.
    remote_eject_base_seconds: float = 30.0
    remote_eject_max_seconds: float = 300.0
    remote_eject_after: int = 1

    @classmethod
    def from_env(cls, env: Mapping[str, str], log_dir: Path) -> WatchdogSettings:
        return cls(
            enabled=_bool(env, "SLM_WATCHDOG_ENABLED", True),
            failure_threshold=_int(env, "SLM_WATCHDOG_FAILURE_THRESHOLD", 2, minimum=1),
            stall_seconds=_float(env, "SLM_WATCHDOG_STALL_SECONDS", 300.0, minimum=0.001),
            sweep_seconds=_float(env, "SLM_WATCHDOG_SWEEP_SECONDS", 5.0, minimum=0.01),
            max_restarts=_int(env, "SLM_WATCHDOG_MAX_RESTARTS", 5, minimum=0),
            restart_window_seconds=_float(env, "SLM_WATCHDOG_RESTART_WINDOW_SECONDS", 600.0),
            restart_cooldown_seconds=_float(env, "SLM_WATCHDOG_RESTART_COOLDOWN_SECONDS", 10.0),
            startup_grace_seconds=_float(env, "SLM_WATCHDOG_STARTUP_GRACE_SECONDS", 180.0),
            request_dir=_path(env, "SLM_WATCHDOG_REQUEST_DIR", log_dir / "watchdog-requests"),
            log_path=_path(env, "SLM_WATCHDOG_LOG_PATH", log_dir / "watchdog.jsonl"),
            backend_log_max_mb=_float(env, "SLM_BACKEND_LOG_MAX_MB", 100.0),
            confirm_seconds=_float(env, "SLM_WATCHDOG_CONFIRM_SECONDS", 10.0, minimum=0.001),
            silence_seconds=_float(env, "SLM_WATCHDOG_SILENCE_SECONDS", 30.0, minimum=0.001),
            remote_eject_base_seconds=_float(
                env, "SLM_REMOTE_EJECT_BASE_SECONDS", 30.0, minimum=0.001
            ),
            remote_eject_max_seconds=_float(
                env, "SLM_REMOTE_EJECT_MAX_SECONDS", 300.0, minimum=0.001
            ),
            remote_eject_after=_int(env, "SLM_REMOTE_EJECT_AFTER", 1, minimum=1),
        )

    def tunables(self) -> dict[str, object]:
        """Every tunable in effect, for ``supervisor_started``."""
        return {
            "enabled": self.enabled,
            "failure_threshold": self.failure_threshold,
            "stall_seconds": self.stall_seconds,
            "sweep_seconds": self.sweep_seconds,
            "max_restarts": self.max_restarts,
            "restart_window_seconds": self.restart_window_seconds,
            "restart_cooldown_seconds": self.restart_cooldown_seconds,
            "startup_grace_seconds": self.startup_grace_seconds,
            "request_dir": str(self.request_dir),
            "log_path": str(self.log_path),
            "backend_log_max_mb": self.backend_log_max_mb,
            "confirm_seconds": self.confirm_seconds,
            "silence_seconds": self.silence_seconds,
            "remote_eject_base_seconds": self.remote_eject_base_seconds,
            "remote_eject_max_seconds": self.remote_eject_max_seconds,
            "remote_eject_after": self.remote_eject_after,
        }


@dataclass(frozen=True)
class TelemetrySettings:
    """OpenTelemetry export and log format (``SLM_OTLP_ENDPOINT`` and friends)."""

    enabled: bool
    otlp_endpoint: str
    service_name: str
    log_json: bool

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> TelemetrySettings:
        endpoint = env.get("SLM_OTLP_ENDPOINT", "").strip() or "http://localhost:4318"
        return cls(
            enabled=_bool(env, "SLM_OTEL_ENABLED", True),
            otlp_endpoint=endpoint.rstrip("/"),
            service_name=env.get("SLM_OTEL_SERVICE_NAME", "").strip() or "slm-server",
            log_json=_bool(env, "SLM_LOG_JSON", False),
        )


@dataclass(frozen=True)
class DoorLimits:
    """What a client may send before the router reads a body (``SLM_MAX_URL_KB`` and
    friends); enforced by :mod:`slm_server.router.edge.http_protocol`."""

    max_url_bytes: int = 8 * 1024
    max_header_bytes: int = 32 * 1024
    max_headers: int = 100
    header_timeout_seconds: float = 10.0
    idle_timeout_seconds: float = 75.0
    body_stall_seconds: float = 10.0
    write_stall_seconds: float = 60.0


@dataclass(frozen=True)
class SlotCacheSettings:
    """Keeping each model's prompt cache across an unload and a load
    (``SLM_SLOT_CACHE*``, see ``slm_server.slotcache``): on or off, where the saved
    slots go, how much disk they may take together, and how long one save or restore
    may take before it is given up."""

    directory: Path
    enabled: bool = True
    budget_mb: int = 4096
    timeout_seconds: float = 30.0

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> SlotCacheSettings:
        cache = env.get("SLM_CACHE_DIR", "").strip()
        base = Path(cache).expanduser() if cache else Path.home() / ".cache" / "slm_server"
        return cls(
            enabled=_bool(env, "SLM_SLOT_CACHE", True),
            directory=_path(env, "SLM_SLOT_CACHE_DIR", base / "slots"),
            budget_mb=_int(env, "SLM_SLOT_CACHE_MB", 4096, minimum=0),
            timeout_seconds=_float(env, "SLM_SLOT_CACHE_TIMEOUT_SECONDS", 30.0, minimum=0.1),
        )


@dataclass(frozen=True)
class ServingSettings:
    """The router's serving policy: body size, API keys, drain (``SLM_*``)."""

    max_body_bytes: int
    api_keys: tuple[str, ...]
    drain_timeout_seconds: float
    allowed_hosts: tuple[str, ...] = ()
    metrics_need_key: bool = True
    door: DoorLimits = DoorLimits()
    max_bodies_in_flight_bytes: int = 256 * 1024 * 1024
    max_answer_bytes: int = 128 * 1024 * 1024
    max_sse_event_bytes: int = 4 * 1024 * 1024
    # Whether GET /v1/models lists each alias as a model of its own.
    list_aliases: bool = True
    # A streamed answer's client waiting this long with nothing sent is sent a
    # keep-alive (0: never).
    keepalive_seconds: float = 10.0

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ServingSettings:
        keys = [k.strip() for k in env.get("SLM_API_KEYS", "").split(",") if k.strip()]
        keys_file = env.get("SLM_API_KEYS_FILE", "").strip()
        if keys_file:
            path = Path(keys_file).expanduser()
            path = path if path.is_absolute() else PROJECT_ROOT / path
            try:
                text = path.read_text(encoding="utf-8")
            except OSError as exc:
                raise SettingsError(f"SLM_API_KEYS_FILE={keys_file}: {exc.strerror}") from None
            keys += [
                line.strip()
                for line in text.splitlines()
                if line.strip() and not line.strip().startswith("#")
            ]
        return cls(
            max_body_bytes=_mib(env, "SLM_MAX_BODY_MB", 32.0),
            api_keys=tuple(dict.fromkeys(keys)),
            drain_timeout_seconds=_float(env, "SLM_DRAIN_TIMEOUT_SECONDS", 30.0),
            door=DoorLimits(
                max_url_bytes=_kib(env, "SLM_MAX_URL_KB", 8.0),
                max_header_bytes=_kib(env, "SLM_MAX_HEADERS_KB", 32.0),
                max_headers=_int(env, "SLM_MAX_HEADERS", 100, minimum=1),
                header_timeout_seconds=_float(
                    env, "SLM_HEADER_TIMEOUT_SECONDS", 10.0, minimum=0.001
                ),
                idle_timeout_seconds=_float(env, "SLM_IDLE_TIMEOUT_SECONDS", 75.0, minimum=0.001),
                body_stall_seconds=_float(env, "SLM_BODY_STALL_SECONDS", 10.0, minimum=0.001),
                write_stall_seconds=_float(env, "SLM_WRITE_STALL_SECONDS", 60.0, minimum=0.001),
            ),
            metrics_need_key=_bool(env, "SLM_METRICS_NEED_KEY", True),
            allowed_hosts=tuple(
                h.strip() for h in env.get("SLM_ALLOWED_HOSTS", "").split(",") if h.strip()
            ),
            max_bodies_in_flight_bytes=_mib(env, "SLM_MAX_BODIES_IN_FLIGHT_MB", 256.0),
            max_answer_bytes=_mib(env, "SLM_MAX_ANSWER_MB", 128.0),
            max_sse_event_bytes=_mib(env, "SLM_MAX_SSE_EVENT_MB", 4.0),
            list_aliases=_bool(env, "SLM_LIST_ALIASES", True),
            keepalive_seconds=_float(env, "SLM_KEEPALIVE_SECONDS", 10.0),
        )


@dataclass(frozen=True)
class MemorySettings:
    """Loading on demand (``SLM_MEMORY_BUDGET_MB`` and friends): how much memory the
    models may hold together, how many may be loaded, and the rule against swapping
    back and forth — a model that served a request within ``hold_seconds`` is not
    evicted for another, unless that other has waited ``aging_seconds``, when the models
    in its way stop admitting, finish what they hold, and make room.

    And memory pressure (``SLM_MEMORY_FLOOR_MB`` and friends): the least free memory
    the machine keeps (``floor_mb``, 0: no floor), read every ``poll_seconds``; below it
    idle on-demand models are unloaded and loads refused. ``simulated_file``, for tests
    and diagnosis only, names a file read instead of the machine's memory."""

    budget_mb: int
    max_loaded: int | None = None
    hold_seconds: float = 2.0
    aging_seconds: float = 20.0
    floor_mb: int = 0
    poll_seconds: float = 1.0
    simulated_file: Path | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> MemorySettings:
        raw_budget = env.get("SLM_MEMORY_BUDGET_MB", "").strip()
        total = physical_memory_mb()
        budget = (
            _int(env, "SLM_MEMORY_BUDGET_MB", 0, minimum=1)
            if raw_budget
            else default_budget_mb(total)
        )
        max_loaded = _int(env, "SLM_MAX_LOADED", 0, minimum=0)
        floor = _int(env, "SLM_MEMORY_FLOOR_MB", default_floor_mb(total), minimum=0)
        simulated = _simulated_file(env)
        if floor >= total and simulated is None:
            raise SettingsError(
                f"SLM_MEMORY_FLOOR_MB={floor} must be less than the machine's physical "
                f"memory ({total} MiB), or 0 for no floor"
            )
        return cls(
            budget_mb=budget,
            max_loaded=max_loaded or None,
            hold_seconds=_float(env, "SLM_SWAP_HOLD_SECONDS", 2.0),
            aging_seconds=_float(env, "SLM_SWAP_AGING_SECONDS", 20.0),
            floor_mb=floor,
            poll_seconds=_float(env, "SLM_MEMORY_POLL_SECONDS", 1.0, minimum=0.05),
            simulated_file=simulated,
        )


@dataclass(frozen=True)
class HistorySettings:
    """The dashboard's history (``SLM_HISTORY_*``): the router samples its own tallies
    every ``interval_seconds`` and keeps ``keep_seconds`` of samples (at least an hour),
    at most ``MAX_SAMPLES`` of them, so that its memory stays bounded however the two
    are set."""

    interval_seconds: float = 5.0
    keep_seconds: float = 3600.0

    MAX_SAMPLES: ClassVar[int] = 20_000  # a day at the default interval

    @property
    def samples(self) -> int:
        """How many samples are kept."""
        return max(1, math.ceil(self.keep_seconds / self.interval_seconds))

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> HistorySettings:
        made = cls(
            interval_seconds=_float(env, "SLM_HISTORY_INTERVAL_SECONDS", 5.0, minimum=0.2),
            keep_seconds=_float(env, "SLM_HISTORY_KEEP_SECONDS", 3600.0, minimum=3600.0),
        )
        if made.samples > cls.MAX_SAMPLES:
            raise SettingsError(
                f"SLM_HISTORY_KEEP_SECONDS / SLM_HISTORY_INTERVAL_SECONDS is "
                f"{made.samples} samples: at most {cls.MAX_SAMPLES} are kept"
            )
        return made


@dataclass(frozen=True)
class PullSettings:
    """Fetching models from a hub (``python -m slm_server pull``, ``POST
    /v1/models/pull``): where the files go, Ollama's registry, when a download counts as
    stalled (less than ``min_bytes_per_second`` on average over ``stall_seconds``, or
    nothing at all for that long), and whether the API may pull (off: it writes to the
    disk). Hugging Face's own settings (``HF_ENDPOINT``, ``HF_TOKEN``,
    ``HF_HUB_DOWNLOAD_TIMEOUT``) are its client library's."""

    models_dir: Path = PROJECT_ROOT / "models"
    ollama_registry: str = "https://registry.ollama.ai"
    stall_seconds: float = 30.0
    min_bytes_per_second: int = 1024
    api_enabled: bool = False

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> PullSettings:
        registry = env.get("SLM_OLLAMA_REGISTRY", "").strip().rstrip("/")
        return cls(
            models_dir=_path(env, "SLM_MODELS_DIR", PROJECT_ROOT / "models"),
            ollama_registry=registry or "https://registry.ollama.ai",
            stall_seconds=_float(env, "SLM_PULL_STALL_SECONDS", 30.0, minimum=0.1),
            min_bytes_per_second=_int(env, "SLM_PULL_MIN_BYTES_PER_SECOND", 1024, minimum=0),
            api_enabled=_bool(env, "SLM_PULL_API", False),
        )


SIMULATED_FILE_VAR = "SLM_MEMORY_SIMULATED_FILE"


def _simulated_file(env: Mapping[str, str]) -> Path | None:
    """``SLM_MEMORY_SIMULATED_FILE``: for tests and diagnosis only. So that it never
    stands in for the machine by accident, the file must exist when the setting is read
    and hold ``simulated_available_mb <N>``; anything else stops the process."""
    raw = env.get(SIMULATED_FILE_VAR, "").strip()
    if not raw:
        return None
    path = _path(env, SIMULATED_FILE_VAR, PROJECT_ROOT)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SettingsError(f"{SIMULATED_FILE_VAR}={raw}: cannot be read ({exc})") from None
    if simulated_mb(text) is None:
        raise SettingsError(
            f"{SIMULATED_FILE_VAR}={raw}: the file must hold 'simulated_available_mb <MiB>' "
            "(a diagnostic source of the machine's free memory, for tests only)"
        )
    return path


@dataclass(frozen=True)
class Settings:
    """Everything tunable by environment, with its default."""

    config_path: Path
    log_dir: Path
    llama_server_bin: str | None
    router_host: str
    router_port: int
    ready_timeout_seconds: float
    stop_timeout_seconds: float
    health_probe_timeout_seconds: float
    connect_timeout_seconds: float
    watchdog: WatchdogSettings
    telemetry: TelemetrySettings = field(default_factory=lambda: TelemetrySettings.from_env({}))
    serving: ServingSettings = field(default_factory=lambda: ServingSettings.from_env({}))
    memory: MemorySettings = field(default_factory=lambda: MemorySettings.from_env({}))
    # Reload the registry when its file changes (``SLM_CONFIG_WATCH``), once the file
    # has been left unchanged for ``config_watch_settle_seconds``.
    config_watch: bool = False
    config_watch_settle_seconds: float = 1.0
    slot_cache: SlotCacheSettings = field(default_factory=lambda: SlotCacheSettings.from_env({}))
    history: HistorySettings = field(default_factory=HistorySettings)
    pull: PullSettings = field(default_factory=PullSettings)

    @property
    def pidfile_path(self) -> Path:
        """Where the launcher records the processes it started."""
        return self.log_dir / "backends.pids.json"

    @property
    def footprints_path(self) -> Path:
        """Where the footprints measured at each load are remembered across runs."""
        return self.log_dir / "footprints.json"

    @property
    def state_path(self) -> Path:
        """Where the launcher publishes each backend's state for ``status``."""
        return self.log_dir / "backends.state.json"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = load_environment(environ)
        bin_raw = env.get("SLM_LLAMA_SERVER_BIN", "").strip()
        log_dir = _path(env, "SLM_BACKEND_LOG_DIR", PROJECT_ROOT / "logs")
        return cls(
            config_path=_path(env, "SLM_CONFIG", PROJECT_ROOT / "config" / "models.yaml"),
            log_dir=log_dir,
            llama_server_bin=bin_raw or None,
            router_host=env.get("SLM_ROUTER_HOST", "").strip() or "127.0.0.1",
            router_port=_int(env, "SLM_ROUTER_PORT", 8000, minimum=1, maximum=65535),
            ready_timeout_seconds=_float(env, "SLM_READY_TIMEOUT_SECONDS", 600.0),
            stop_timeout_seconds=_float(env, "SLM_STOP_TIMEOUT_SECONDS", 10.0),
            health_probe_timeout_seconds=_float(env, "SLM_HEALTH_PROBE_TIMEOUT_SECONDS", 2.0),
            connect_timeout_seconds=_float(env, "SLM_CONNECT_TIMEOUT_SECONDS", 5.0),
            watchdog=WatchdogSettings.from_env(env, log_dir),
            telemetry=TelemetrySettings.from_env(env),
            serving=ServingSettings.from_env(env),
            memory=MemorySettings.from_env(env),
            config_watch=_bool(env, "SLM_CONFIG_WATCH", False),
            config_watch_settle_seconds=_float(
                env, "SLM_CONFIG_WATCH_SETTLE_SECONDS", 1.0, minimum=0.05
            ),
            slot_cache=SlotCacheSettings.from_env(env),
            history=HistorySettings.from_env(env),
            pull=PullSettings.from_env(env),
        )
