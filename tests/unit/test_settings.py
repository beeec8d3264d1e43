"""Settings from the environment and an optional .env file."""

from __future__ import annotations

from pathlib import Path

import pytest

from slm_server.memory.physical import default_floor_mb, physical_memory_mb
from slm_server.settings import (
    PROJECT_ROOT,
    HistorySettings,
    Settings,
    SettingsError,
    SlotCacheSettings,
    WatchdogSettings,
    load_environment,
    read_dotenv,
)

FLOAT_VARS = [
    ("SLM_READY_TIMEOUT_SECONDS", "ready_timeout_seconds"),
    ("SLM_STOP_TIMEOUT_SECONDS", "stop_timeout_seconds"),
    ("SLM_HEALTH_PROBE_TIMEOUT_SECONDS", "health_probe_timeout_seconds"),
    ("SLM_CONNECT_TIMEOUT_SECONDS", "connect_timeout_seconds"),
]


def dotenv(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "test.env"
    path.write_text(text, encoding="utf-8")
    return path


def settings(tmp_path: Path, **env: str) -> Settings:
    """Settings from ``env`` alone (the .env file points at nothing unless given)."""
    environ = {"SLM_ENV_FILE": str(tmp_path / "absent.env"), **env}
    return Settings.from_env(environ)


# --- read_dotenv ------------------------------------------------------------------------


def test_read_dotenv(tmp_path: Path) -> None:
    path = dotenv(
        tmp_path,
        "\n".join(
            [
                "# a comment",
                "",
                "   # an indented comment",
                "PLAIN=1",
                "export EXPORTED=two",
                'DOUBLE="quoted value"',
                "SINGLE='single # not a comment'",
                "INLINE=value # a comment",
                "HASH=value#kept",
                "EMPTY=",
                "  SPACED  =  padded  ",
                "no equals sign here",
                "EQUALS=a=b",
                'DQ_HASH="a # b"',
                'ONE_QUOTE="unbalanced',
                "URL=http://host:8000/path?x=1",
            ]
        ),
    )
    assert read_dotenv(path) == {
        "PLAIN": "1",
        "EXPORTED": "two",
        "DOUBLE": "quoted value",
        "SINGLE": "single # not a comment",
        "INLINE": "value",
        "HASH": "value#kept",
        "EMPTY": "",
        "SPACED": "padded",
        "EQUALS": "a=b",
        "DQ_HASH": "a # b",
        "ONE_QUOTE": '"unbalanced',
        "URL": "http://host:8000/path?x=1",
    }


def test_read_dotenv_later_line_wins(tmp_path: Path) -> None:
    assert read_dotenv(dotenv(tmp_path, "A=1\nA=2\n")) == {"A": "2"}


def test_read_dotenv_missing_file(tmp_path: Path) -> None:
    assert read_dotenv(tmp_path / "absent.env") == {}


def test_read_dotenv_directory(tmp_path: Path) -> None:
    assert read_dotenv(tmp_path) == {}


def test_read_dotenv_quoted_value_with_inline_comment(tmp_path: Path) -> None:
    path = dotenv(tmp_path, 'SLM_CONFIG="config/my models.yaml" # mine\n')
    assert read_dotenv(path) == {"SLM_CONFIG": "config/my models.yaml"}


# --- load_environment ---------------------------------------------------------------------


def test_environment_beats_dotenv(tmp_path: Path) -> None:
    path = dotenv(tmp_path, "SLM_ROUTER_PORT=9000\nSLM_ROUTER_HOST=0.0.0.0\n")
    merged = load_environment({"SLM_ENV_FILE": str(path), "SLM_ROUTER_PORT": "9100"})
    assert merged["SLM_ROUTER_PORT"] == "9100"
    assert merged["SLM_ROUTER_HOST"] == "0.0.0.0"
    assert merged["SLM_ENV_FILE"] == str(path)


def test_empty_environment_value_still_beats_dotenv(tmp_path: Path) -> None:
    path = dotenv(tmp_path, "SLM_ROUTER_HOST=0.0.0.0\n")
    merged = load_environment({"SLM_ENV_FILE": str(path), "SLM_ROUTER_HOST": ""})
    assert merged["SLM_ROUTER_HOST"] == ""


def test_load_environment_reads_os_environ(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = dotenv(tmp_path, "SLM_TEST_FROM_FILE=file\nSLM_TEST_BOTH=file\n")
    monkeypatch.setenv("SLM_ENV_FILE", str(path))
    monkeypatch.setenv("SLM_TEST_BOTH", "env")
    merged = load_environment()
    assert merged["SLM_TEST_FROM_FILE"] == "file"
    assert merged["SLM_TEST_BOTH"] == "env"


# --- Settings.from_env ----------------------------------------------------------------------


def test_defaults(tmp_path: Path) -> None:
    s = settings(tmp_path)
    assert s == Settings(
        config_path=PROJECT_ROOT / "config" / "models.yaml",
        log_dir=PROJECT_ROOT / "logs",
        llama_server_bin=None,
        router_host="127.0.0.1",
        router_port=8000,
        ready_timeout_seconds=600.0,
        stop_timeout_seconds=10.0,
        health_probe_timeout_seconds=2.0,
        connect_timeout_seconds=5.0,
        watchdog=WatchdogSettings(
            enabled=True,
            failure_threshold=2,
            stall_seconds=300.0,
            sweep_seconds=5.0,
            max_restarts=5,
            restart_window_seconds=600.0,
            restart_cooldown_seconds=10.0,
            startup_grace_seconds=180.0,
            request_dir=PROJECT_ROOT / "logs" / "watchdog-requests",
            log_path=PROJECT_ROOT / "logs" / "watchdog.jsonl",
            backend_log_max_mb=100.0,
            confirm_seconds=10.0,
        ),
    )
    assert s.pidfile_path == PROJECT_ROOT / "logs" / "backends.pids.json"
    assert s.state_path == PROJECT_ROOT / "logs" / "backends.state.json"


def test_slot_cache_settings(tmp_path: Path) -> None:
    home = Path.home() / ".cache" / "slm_server" / "slots"
    assert settings(tmp_path).slot_cache == SlotCacheSettings(home, True, 4096, 30.0)
    assert settings(tmp_path, SLM_CACHE_DIR=str(tmp_path / "c")).slot_cache.directory == (
        tmp_path / "c" / "slots"
    )
    chosen = settings(
        tmp_path,
        SLM_SLOT_CACHE="false",
        SLM_SLOT_CACHE_DIR=str(tmp_path / "s"),
        SLM_SLOT_CACHE_MB="10",
        SLM_SLOT_CACHE_TIMEOUT_SECONDS="2.5",
    ).slot_cache
    assert chosen == SlotCacheSettings(tmp_path / "s", False, 10, 2.5)
    with pytest.raises(SettingsError, match="SLM_SLOT_CACHE_MB"):
        settings(tmp_path, SLM_SLOT_CACHE_MB="-1")


def test_project_root_is_the_repository() -> None:
    assert (PROJECT_ROOT / "slm_server" / "settings.py").is_file()
    assert (PROJECT_ROOT / "pyproject.toml").is_file()


def test_every_setting_from_environment(tmp_path: Path) -> None:
    s = settings(
        tmp_path,
        SLM_CONFIG=str(tmp_path / "reg.yaml"),
        SLM_BACKEND_LOG_DIR=str(tmp_path / "logs"),
        SLM_LLAMA_SERVER_BIN="  /opt/llama/llama-server  ",
        SLM_ROUTER_HOST=" 0.0.0.0 ",
        SLM_ROUTER_PORT=" 9000 ",
        SLM_READY_TIMEOUT_SECONDS="30",
        SLM_STOP_TIMEOUT_SECONDS="2.5",
        SLM_HEALTH_PROBE_TIMEOUT_SECONDS="0.5",
        SLM_CONNECT_TIMEOUT_SECONDS="1e1",
    )
    assert s.config_path == tmp_path / "reg.yaml"
    assert s.log_dir == tmp_path / "logs"
    assert s.pidfile_path == tmp_path / "logs" / "backends.pids.json"
    assert s.state_path == tmp_path / "logs" / "backends.state.json"
    assert s.llama_server_bin == "/opt/llama/llama-server"
    assert s.router_host == "0.0.0.0"
    assert s.router_port == 9000
    assert s.ready_timeout_seconds == 30.0
    assert s.stop_timeout_seconds == 2.5
    assert s.health_probe_timeout_seconds == 0.5
    assert s.connect_timeout_seconds == 10.0


def test_dotenv_supplies_settings_and_environment_wins(tmp_path: Path) -> None:
    path = dotenv(
        tmp_path,
        "SLM_ROUTER_PORT=9000\nexport SLM_ROUTER_HOST=0.0.0.0\nSLM_STOP_TIMEOUT_SECONDS=3\n",
    )
    s = Settings.from_env({"SLM_ENV_FILE": str(path), "SLM_ROUTER_PORT": "9100"})
    assert s.router_port == 9100
    assert s.router_host == "0.0.0.0"
    assert s.stop_timeout_seconds == 3.0


def test_from_env_reads_os_environ(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = dotenv(tmp_path, "SLM_ROUTER_PORT=9000\n")
    monkeypatch.setenv("SLM_ENV_FILE", str(path))
    monkeypatch.delenv("SLM_ROUTER_PORT", raising=False)
    assert Settings.from_env().router_port == 9000
    monkeypatch.setenv("SLM_ROUTER_PORT", "9200")
    assert Settings.from_env().router_port == 9200


@pytest.mark.parametrize(
    "name",
    ["SLM_ROUTER_HOST", "SLM_ROUTER_PORT", "SLM_LLAMA_SERVER_BIN", "SLM_CONFIG"]
    + [var for var, _ in FLOAT_VARS],
)
def test_blank_values_fall_back_to_defaults(tmp_path: Path, name: str) -> None:
    assert settings(tmp_path, **{name: "   "}) == settings(tmp_path)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("abc", "SLM_ROUTER_PORT='abc' is not an integer"),
        ("80.5", "SLM_ROUTER_PORT='80.5' is not an integer"),
        ("0", "SLM_ROUTER_PORT='0' must be at least 1"),
        ("-8000", "SLM_ROUTER_PORT='-8000' must be at least 1"),
    ],
)
def test_invalid_router_port(tmp_path: Path, raw: str, message: str) -> None:
    with pytest.raises(SettingsError) as caught:
        settings(tmp_path, SLM_ROUTER_PORT=raw)
    assert str(caught.value) == message
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize(("name", "attribute"), FLOAT_VARS)
def test_invalid_timeouts(tmp_path: Path, name: str, attribute: str) -> None:
    with pytest.raises(SettingsError, match=f"^{name}='soon' is not a number$"):
        settings(tmp_path, **{name: "soon"})
    with pytest.raises(SettingsError, match=f"^{name}='-1' must be at least 0$"):
        settings(tmp_path, **{name: "-1"})
    assert getattr(settings(tmp_path, **{name: "0"}), attribute) == 0.0


def test_invalid_number_in_dotenv(tmp_path: Path) -> None:
    path = dotenv(tmp_path, "SLM_READY_TIMEOUT_SECONDS=ten\n")
    with pytest.raises(SettingsError, match="SLM_READY_TIMEOUT_SECONDS='ten' is not a number"):
        Settings.from_env({"SLM_ENV_FILE": str(path)})


def test_router_port_above_65535_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(SettingsError):
        settings(tmp_path, SLM_ROUTER_PORT="70000")


def test_nan_timeout_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(SettingsError):
        settings(tmp_path, SLM_STOP_TIMEOUT_SECONDS="nan")


@pytest.mark.parametrize(
    ("name", "attribute"), [("SLM_CONFIG", "config_path"), ("SLM_BACKEND_LOG_DIR", "log_dir")]
)
def test_relative_paths_from_project_root(tmp_path: Path, name: str, attribute: str) -> None:
    s = settings(tmp_path, **{name: "some/where"})
    assert getattr(s, attribute) == PROJECT_ROOT / "some" / "where"


def test_home_expanded_in_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    s = settings(tmp_path, SLM_CONFIG="~/reg.yaml")
    assert s.config_path == tmp_path / "reg.yaml"


def test_relative_path_in_dotenv_is_from_project_root(tmp_path: Path) -> None:
    path = dotenv(tmp_path, "SLM_BACKEND_LOG_DIR=var/logs\n")
    s = Settings.from_env({"SLM_ENV_FILE": str(path)})
    assert s.log_dir == PROJECT_ROOT / "var" / "logs"


def test_llama_server_bin_is_not_resolved(tmp_path: Path) -> None:
    assert settings(tmp_path, SLM_LLAMA_SERVER_BIN="bin/llama").llama_server_bin == "bin/llama"


# --- watchdog confirmation ------------------------------------------------------------------


def test_confirm_seconds_from_environment_and_in_the_tunables(tmp_path: Path) -> None:
    assert settings(tmp_path).watchdog.confirm_seconds == 10.0
    watchdog = settings(tmp_path, SLM_WATCHDOG_CONFIRM_SECONDS="2.5").watchdog
    assert watchdog.confirm_seconds == 2.5
    assert watchdog.tunables()["confirm_seconds"] == 2.5


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("0", "SLM_WATCHDOG_CONFIRM_SECONDS='0' must be at least 0.001"),
        ("-1", "SLM_WATCHDOG_CONFIRM_SECONDS='-1' must be at least 0.001"),
        ("soon", "SLM_WATCHDOG_CONFIRM_SECONDS='soon' is not a number"),
        ("inf", "SLM_WATCHDOG_CONFIRM_SECONDS='inf' must be a finite number"),
    ],
)
def test_confirm_seconds_must_be_positive(tmp_path: Path, raw: str, message: str) -> None:
    with pytest.raises(SettingsError) as caught:
        settings(tmp_path, SLM_WATCHDOG_CONFIRM_SECONDS=raw)
    assert str(caught.value) == message


# --- aliases in the model list -------------------------------------------------------------


def test_aliases_are_listed_unless_turned_off(tmp_path: Path) -> None:
    assert settings(tmp_path).serving.list_aliases is True
    assert settings(tmp_path, SLM_LIST_ALIASES="false").serving.list_aliases is False
    with pytest.raises(SettingsError) as caught:
        settings(tmp_path, SLM_LIST_ALIASES="hidden")
    assert str(caught.value) == "SLM_LIST_ALIASES='hidden' is not a boolean (true/false)"


# --- memory pressure -------------------------------------------------------------------------


def test_memory_floor_defaults_to_a_gib_or_an_eighth_of_a_small_machine(tmp_path: Path) -> None:
    memory = settings(tmp_path).memory
    assert memory.floor_mb == default_floor_mb(physical_memory_mb())
    assert memory.poll_seconds == 1.0 and memory.simulated_file is None
    assert default_floor_mb(65536) == 1024
    assert default_floor_mb(8192) == 1024
    assert default_floor_mb(4096) == 512
    assert default_floor_mb(0) == 0


def test_memory_floor_and_poll_are_read(tmp_path: Path) -> None:
    memory = settings(tmp_path, SLM_MEMORY_FLOOR_MB="2048", SLM_MEMORY_POLL_SECONDS="0.2").memory
    assert (memory.floor_mb, memory.poll_seconds) == (2048, 0.2)
    assert settings(tmp_path, SLM_MEMORY_FLOOR_MB="0").memory.floor_mb == 0


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"SLM_MEMORY_FLOOR_MB": "-1"}, "SLM_MEMORY_FLOOR_MB='-1' must be at least 0"),
        ({"SLM_MEMORY_FLOOR_MB": "1g"}, "SLM_MEMORY_FLOOR_MB='1g' is not an integer"),
        ({"SLM_MEMORY_POLL_SECONDS": "0"}, "SLM_MEMORY_POLL_SECONDS='0' must be at least 0.05"),
    ],
)
def test_memory_pressure_settings_are_validated(
    tmp_path: Path, env: dict[str, str], message: str
) -> None:
    with pytest.raises(SettingsError) as caught:
        settings(tmp_path, **env)
    assert str(caught.value) == message


def test_a_floor_the_machine_cannot_keep_is_refused(tmp_path: Path) -> None:
    total = physical_memory_mb()
    with pytest.raises(SettingsError) as caught:
        settings(tmp_path, SLM_MEMORY_FLOOR_MB=str(total))
    assert "less than the machine's physical memory" in str(caught.value)


def test_the_simulated_memory_file_cannot_be_turned_on_by_accident(tmp_path: Path) -> None:
    """The diagnostic source must name a file that exists and says what it is."""
    path = tmp_path / "free"
    with pytest.raises(SettingsError) as caught:
        settings(tmp_path, SLM_MEMORY_SIMULATED_FILE=str(path))
    assert "cannot be read" in str(caught.value)
    path.write_text("800\n")
    with pytest.raises(SettingsError) as caught:
        settings(tmp_path, SLM_MEMORY_SIMULATED_FILE=str(path))
    assert "simulated_available_mb <MiB>" in str(caught.value)
    path.write_text("simulated_available_mb 800\n")
    assert settings(tmp_path, SLM_MEMORY_SIMULATED_FILE=str(path)).memory.simulated_file == path


def test_the_history_samples_every_5_s_for_an_hour_unless_told_otherwise(tmp_path: Path) -> None:
    assert settings(tmp_path).history == HistorySettings(5.0, 3600.0)
    assert HistorySettings().samples == 720
    chosen = settings(
        tmp_path, SLM_HISTORY_INTERVAL_SECONDS="0.5", SLM_HISTORY_KEEP_SECONDS="7200"
    ).history
    assert (chosen.interval_seconds, chosen.keep_seconds, chosen.samples) == (0.5, 7200.0, 14400)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"SLM_HISTORY_INTERVAL_SECONDS": "0.1"},
            "SLM_HISTORY_INTERVAL_SECONDS='0.1' must be at least 0.2",
        ),
        (
            {"SLM_HISTORY_KEEP_SECONDS": "600"},
            "SLM_HISTORY_KEEP_SECONDS='600' must be at least 3600",
        ),
        (
            {"SLM_HISTORY_INTERVAL_SECONDS": "1", "SLM_HISTORY_KEEP_SECONDS": "86400"},
            "SLM_HISTORY_KEEP_SECONDS / SLM_HISTORY_INTERVAL_SECONDS is 86400 samples: "
            "at most 20000 are kept",
        ),
    ],
)
def test_the_history_settings_are_validated(
    tmp_path: Path, env: dict[str, str], message: str
) -> None:
    with pytest.raises(SettingsError) as caught:
        settings(tmp_path, **env)
    assert str(caught.value) == message
