"""Only a process verifiably ours may be killed for holding a backend's port."""

from __future__ import annotations

from slm_server.supervise.core.strays import verifiably_ours

LAUNCH = ["/opt/llama-server", "--model", "/m.gguf", "--port", "8501", "--alias", "m"]


def test_a_recorded_pid_with_its_create_time_is_ours() -> None:
    assert verifiably_ours(42, 1000.0, ["x"], [(42, 1000.004)], LAUNCH)


def test_a_reused_pid_is_not_ours() -> None:
    assert not verifiably_ours(42, 2000.0, ["x"], [(42, 1000.0)], LAUNCH)


def test_unknown_create_time_never_matches_a_record() -> None:
    assert not verifiably_ours(42, None, ["x"], [(42, 1000.0)], LAUNCH)


def test_our_exact_arguments_are_ours_even_behind_a_wrapper() -> None:
    wrapped = ["python3", "-m", "shim", *LAUNCH[1:]]
    assert verifiably_ours(7, 5.0, wrapped, [], LAUNCH)
    assert verifiably_ours(7, 5.0, LAUNCH, [], LAUNCH)


def test_other_arguments_are_not_ours() -> None:
    other_port = [*LAUNCH[:4], "8502", *LAUNCH[5:]]
    assert not verifiably_ours(7, 5.0, other_port, [], LAUNCH)
    assert not verifiably_ours(7, 5.0, ["python3", "-m", "http.server", "8501"], [], LAUNCH)
    assert not verifiably_ours(None, None, LAUNCH, [], LAUNCH)
    assert not verifiably_ours(7, 5.0, LAUNCH, [], ["llama-server"])
