"""How the command line reaches the running router: the address the settings give, and
the key."""

from __future__ import annotations

from slm_server.cli.launch.gateway import router_url, settings_key
from slm_server.settings import Settings


def settings(**env: str) -> Settings:
    return Settings.from_env({"SLM_ENV_FILE": "/nonexistent.env", **env})


def test_the_router_is_reached_where_the_settings_say() -> None:
    assert router_url(settings()) == "http://127.0.0.1:8000"
    assert router_url(settings(SLM_ROUTER_HOST="10.1.2.3", SLM_ROUTER_PORT="9000")) == (
        "http://10.1.2.3:9000"
    )
    assert router_url(settings(SLM_ROUTER_HOST="::1")) == "http://[::1]:8000"


def test_a_wildcard_bind_is_reached_on_loopback() -> None:
    for host in ("0.0.0.0", "::"):
        assert router_url(settings(SLM_ROUTER_HOST=host)) == "http://127.0.0.1:8000"


def test_the_key_is_the_first_the_router_checks() -> None:
    assert settings_key(settings()) is None
    assert settings_key(settings(SLM_API_KEYS="first, second")) == "first"
