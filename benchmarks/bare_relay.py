"""The floor under any proxy written in Python on this machine: a blind byte relay.

    uv run python -m benchmarks.bare_relay --port 8700 --upstream bench=8601 \
        --upstream bench-burst=8602

Each client connection is tied, at its first read, to one upstream: the one whose model
name (``"<name>"``, quoted as JSON has it) that read contains, else the first one given.
From then on every byte read from either side is written to the other as it is, with
flow control (a side whose peer is full stops being read). It parses nothing, checks
nothing, logs nothing and keeps no state per request: one read and one write per piece
in each direction, the least a relay on asyncio, uvloop and the kernel's loopback can
do. So what it costs per whole answer and per streamed chunk, measured beside the
router in one run (``benchmarks.run defaults``), is what the router's work is to be
judged against on that machine; the rest of what the router costs is its own.

It is only right for the benchmarks' load generator, whose connections each stay with
one model; it is no gateway.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
from typing import cast

import uvloop

from benchmarks.fastfake import serve_until_signalled


def _nodelay(transport: asyncio.BaseTransport) -> None:
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class _Side(asyncio.Protocol):
    """One end of a relayed pair: what it reads goes to ``peer``'s transport."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: _Side | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        _nodelay(transport)

    def data_received(self, data: bytes) -> None:
        peer = self.peer
        if peer is not None and peer.transport is not None:
            peer.transport.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        peer = self.peer
        if peer is not None and peer.transport is not None:
            peer.transport.close()

    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()


class _Client(_Side):
    """A client's connection: picks its upstream at the first read, holds what comes
    before that upstream is connected."""

    def __init__(self, upstreams: list[tuple[bytes, int]], default: int) -> None:
        super().__init__()
        self.upstreams = upstreams
        self.default = default
        self.waiting: list[bytes] | None = None
        self.connecting: asyncio.Future[None] | None = None

    def data_received(self, data: bytes) -> None:
        if self.waiting is not None:  # connecting
            self.waiting.append(data)
            return
        if self.peer is not None:
            super().data_received(data)
            return
        self.waiting = [data]
        port = next((p for name, p in self.upstreams if name in data), self.default)
        self.connecting = asyncio.ensure_future(self._connect(port))

    async def _connect(self, port: int) -> None:
        loop = asyncio.get_running_loop()
        try:
            _, upstream = await loop.create_connection(_Side, "127.0.0.1", port)
        except OSError:
            if self.transport is not None:
                self.transport.close()
            return
        upstream.peer = self
        self.peer = upstream
        waiting, self.waiting = self.waiting or [], None
        if upstream.transport is not None:
            upstream.transport.write(b"".join(waiting))


async def serve(port: int, upstreams: list[tuple[bytes, int]], default: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: _Client(upstreams, default), "127.0.0.1", port, backlog=1024, reuse_address=True
    )
    await serve_until_signalled(server, f"bare_relay pid {os.getpid()} on http://127.0.0.1:{port}")


def _upstream(text: str) -> tuple[bytes, int]:
    name, _, port = text.rpartition("=")
    return b'"' + name.encode() + b'"', int(port)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument(
        "--upstream", type=_upstream, action="append", required=True, help="model=port"
    )
    args = parser.parse_args()
    # Longest names first, so that no name is found inside a longer one's quotes.
    upstreams = sorted(args.upstream, key=lambda u: -len(u[0]))
    uvloop.run(serve(args.port, upstreams, args.upstream[0][1]))


if __name__ == "__main__":
    main()
