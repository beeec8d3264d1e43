"""The router-to-supervisor command channel over a real Unix socket: round trips, the
socket's mode, bad and overlong lines, an absent supervisor, a path too long for a
socket."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

import pytest

from slm_server.contracts.commands import (
    MAX_LINE_BYTES,
    Command,
    CommandError,
    Reply,
    parse_command,
    send,
    serve,
    socket_path,
)


def short_dir(tmp_path: Path) -> Path:
    """A directory whose socket path fits (pytest's tmp paths can be long)."""
    return Path(socket_path(tmp_path)).parent


def test_a_command_round_trips_and_the_socket_is_private(tmp_path: Path) -> None:
    seen: list[Command] = []

    def handle(command: Command) -> Reply:
        seen.append(command)
        return Reply(True, "loading")

    async def scenario() -> None:
        path = socket_path(tmp_path)
        server = await serve(path, handle)
        try:
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
            reply = await send(path, Command("unload", "coder", "evicted", "big-model"))
            assert reply == Reply(True, "loading")
            assert await send(path, Command("load", "coder")) == Reply(True, "loading")
        finally:
            server.close()
            await server.wait_closed()

    asyncio.run(scenario())
    assert seen == [Command("unload", "coder", "evicted", "big-model"), Command("load", "coder")]


@pytest.mark.parametrize(
    "line",
    [
        b"not json\n",
        b"[1]\n",
        b'{"op": "restart", "role": "a"}\n',
        b'{"op": "load"}\n',
        b'{"op": "load", "role": ""}\n',
        b'{"op": "unload", "role": "a", "reason": "because"}\n',
        b'{"op": "load", "role": "' + b"x" * 300 + b'"}\n',
    ],
)
def test_lines_that_are_no_command_are_refused(line: bytes) -> None:
    with pytest.raises(CommandError):
        parse_command(line)


def test_a_bad_line_gets_an_error_reply_and_an_overlong_one_is_cut_off(tmp_path: Path) -> None:
    async def scenario() -> None:
        path = socket_path(tmp_path)
        server = await serve(path, lambda _command: Reply(True, "ready"))
        try:
            reader, writer = await asyncio.open_unix_connection(path)
            writer.write(b'{"op": "explode", "role": "a"}\n')
            line = await reader.readline()
            assert b'"ok":false' in line
            writer.write(b"x" * (MAX_LINE_BYTES * 4) + b"\n")
            assert await asyncio.wait_for(reader.read(), 5) == b""  # closed, no reply
            writer.close()
        finally:
            server.close()
            await server.wait_closed()

    asyncio.run(scenario())


def test_no_supervisor_is_a_command_error(tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="cannot be reached"):
        asyncio.run(send(socket_path(tmp_path), Command("load", "a")))


def test_a_silent_supervisor_is_a_command_error_within_the_timeout(tmp_path: Path) -> None:
    async def scenario() -> None:
        path = socket_path(tmp_path)

        async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                await reader.read()  # until the client gives up
            finally:
                writer.close()

        server = await asyncio.start_unix_server(silent, path)
        try:
            with pytest.raises(CommandError, match="did not answer"):
                await send(path, Command("load", "a"), timeout=0.2)
        finally:
            server.close()
            await server.wait_closed()

    asyncio.run(scenario())


def test_a_log_dir_too_deep_for_a_socket_gets_one_in_the_temp_dir(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    path = socket_path(deep)
    assert len(os.fsencode(path)) <= 100
    assert path != deep / "supervisor.sock"
    assert socket_path(deep) == path  # stable for router and supervisor alike
    assert socket_path(Path("/tmp/x")) == Path("/tmp/x/supervisor.sock")
