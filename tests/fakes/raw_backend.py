"""A backend that misbehaves at the byte level, run as a real process on a real port.

    python -m tests.fakes.raw_backend --port PORT --script FILE

``GET /health`` answers 200 ``{"status":"ok"}``. Every other request is read whole
(head and ``Content-Length`` body) and answered by the steps in FILE, a JSON object
re-read for each request (so a test changes behaviour by rewriting it):

    {"steps": [{"send": "HTTP/1.1 600 Odd\\r\\n..."},   text sent as Latin-1 bytes
               {"repeat": "x", "times": 1000000},       the same text, many times
               {"chunk": "data: a\\r\\n\\r\\n"},          one chunk of a chunked body
               {"sleep": 0.5},
               {"hold": true}]}                          keep the connection open

``"by_path": {"/v1/responses": [...]}`` gives other steps for the requests to one path.
After the steps the connection is closed, unless a ``hold`` step keeps it open until
the client closes it. A missing or empty FILE answers every request with 500.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
from pathlib import Path
from typing import Any

HEALTH = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 15\r\n\r\n"
    b'{"status":"ok"}'
)
NO_SCRIPT = b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 9\r\n\r\nno script"
REPEAT_BLOCK = 64 * 1024


async def _read_request(reader: asyncio.StreamReader) -> bytes | None:
    """The request's head (its body read and dropped); None at EOF."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
        return None
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
                await reader.readexactly(int(value.strip()))
    return head


async def _run(steps: list[dict[str, Any]], writer: asyncio.StreamWriter) -> bool:
    """Play the steps; True when the connection is to be held open."""
    hold = False
    for step in steps:
        if "send" in step:
            writer.write(str(step["send"]).encode("latin-1"))
        elif "chunk" in step:
            data = str(step["chunk"]).encode("latin-1")
            writer.write(b"%x\r\n%s\r\n" % (len(data), data))
        elif "repeat" in step:
            piece = str(step["repeat"]).encode("latin-1")
            block = piece * max(1, REPEAT_BLOCK // max(1, len(piece)))
            left = len(piece) * int(step["times"])
            while left > 0:
                writer.write(block[:left])
                left -= len(block)
                await writer.drain()
        elif "sleep" in step:
            await asyncio.sleep(float(step["sleep"]))
        elif step.get("hold"):
            hold = True
        await writer.drain()
    return hold


class RawBackend:
    def __init__(self, script: Path) -> None:
        self.script = script

    def steps(self, path: str) -> list[dict[str, Any]] | None:
        try:
            data = json.loads(self.script.read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(data, dict):
            return None
        steps = data.get("by_path", {}).get(path, data.get("steps"))
        return steps if isinstance(steps, list) else None

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while (head := await _read_request(reader)) is not None:
                if head.startswith(b"GET /health "):
                    writer.write(HEALTH)
                    await writer.drain()
                    continue
                path = head.split(b" ", 2)[1].decode("latin-1") if b" " in head else ""
                steps = self.steps(path)
                if steps is None:
                    writer.write(NO_SCRIPT)
                    break
                if await _run(steps, writer):
                    with contextlib.suppress(ConnectionError):
                        await reader.read()  # until the client closes
                break
        except ConnectionError:
            pass
        finally:
            writer.close()


async def main(port: int, script: Path) -> None:
    backend = RawBackend(script)
    server = await asyncio.start_server(backend.serve, "127.0.0.1", port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--script", type=Path, required=True)
    args = parser.parse_args()
    asyncio.run(main(args.port, args.script))
