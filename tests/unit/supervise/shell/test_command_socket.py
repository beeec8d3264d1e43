"""The router's commands (:mod:`slm_server.supervise.shell.command_socket`) in process: the
observation each becomes, the reply its answer becomes, and the socket itself, served
by a supervisor on the fake process layer."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from slm_server.contracts import commands
from slm_server.contracts.commands import Command, Reply
from slm_server.supervise.core.actions import Action, Answer, Emit, Launch
from slm_server.supervise.core.observations import LoadRequested, UnloadRequested
from slm_server.supervise.shell import command_socket
from slm_server.supervise.shell.command_socket import CommandSocket
from tests.unit.supervise.fakes import make, until


def test_each_command_is_an_observation() -> None:
    assert command_socket.observation(Command("load", "a")) == LoadRequested("a")
    evicted = Command("unload", "a", "evicted", "m-b")
    assert command_socket.observation(evicted) == UnloadRequested("a", "evicted", "m-b")
    assert command_socket.observation(Command("unload", "a")) == UnloadRequested("a", "api")


def test_the_reply_is_the_answer_among_the_actions() -> None:
    actions: list[Action] = [Emit("backend_loading", {}), Launch("a"), Answer(True, "loading")]
    assert command_socket.reply(actions) == Reply(True, "loading")
    refused = [Answer(False, "ready", "load: always models are loaded at launch and kept")]
    assert command_socket.reply(refused) == Reply(False, "ready", refused[0].error)


def test_the_socket_answers_through_the_supervisor_and_goes_away(tmp_path: Path) -> None:
    supervisor, control = make(tmp_path, ("a", "b"), fields={"load": "on_demand"})
    socket = CommandSocket(supervisor.settings.log_dir)

    async def scenario() -> list[Reply]:
        supervisor.start()
        assert await socket.open(supervisor.command)
        replies = [
            await commands.send(socket.path, Command("load", "a")),
            await commands.send(socket.path, Command("unload", "b", "idle_ttl")),
            await commands.send(socket.path, Command("load", "zzz")),
        ]
        await until(supervisor, lambda: bool(control.children), "spawned")
        socket.close()
        await supervisor.stop_all()
        return replies

    assert asyncio.run(scenario()) == [
        Reply(True, "loading"),
        Reply(True, "unloaded"),  # unloaded already
        Reply(False, error="no model with role 'zzz'"),
    ]
    assert not socket.path.exists()
    assert [c.role for c in control.children] == ["a"]


def test_a_socket_that_cannot_be_had_is_logged_and_supervision_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "logs"
    blocker.write_text("a file where the directory goes")
    socket = CommandSocket(blocker)

    async def scenario() -> bool:
        return await socket.open(lambda command: Reply(True))

    with caplog.at_level(logging.ERROR, logger="slm_server.supervisor"):
        assert not asyncio.run(scenario())
    assert "cannot listen for the router's commands" in caplog.text
    socket.close()  # nothing to close: fine
