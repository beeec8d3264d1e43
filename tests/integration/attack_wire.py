"""Raw-socket helpers for the attack tests: one HTTP/1.1 response read off a socket
exactly (Content-Length or chunked framing), so several responses on one keep-alive
connection can be told apart."""

from __future__ import annotations

import socket
from dataclasses import dataclass


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes


class Wire:
    """A client socket with a read buffer, for responses one after another."""

    def __init__(self, url: str, timeout: float = 15.0) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.buffer = b""

    def __enter__(self) -> Wire:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self) -> bool:
        chunk = self.sock.recv(65536)
        self.buffer += chunk
        return bool(chunk)

    def _until(self, marker: bytes) -> bytes:
        while marker not in self.buffer:
            if not self._fill():
                raise ConnectionError(f"closed before {marker!r}; got {self.buffer[:300]!r}")
        head, _, self.buffer = self.buffer.partition(marker)
        return head

    def _exactly(self, size: int) -> bytes:
        while len(self.buffer) < size:
            if not self._fill():
                raise ConnectionError(f"closed {size - len(self.buffer)} bytes short")
        data, self.buffer = self.buffer[:size], self.buffer[size:]
        return data

    def response(self) -> Reply:
        """The next whole response (fails with ConnectionError if the router closes
        the connection first)."""
        head = self._until(b"\r\n\r\n")
        status_line, *lines = head.split(b"\r\n")
        status = int(status_line.split(b" ", 2)[1])
        headers: dict[str, str] = {}
        for line in lines:
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        if "content-length" in headers:
            body = self._exactly(int(headers["content-length"]))
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            parts = []
            while size := int(self._until(b"\r\n").split(b";")[0], 16):
                parts.append(self._exactly(size))
                self._exactly(2)
            self._until(b"\r\n")  # no trailers from the router
            body = b"".join(parts)
        else:
            body = b""
        return Reply(status, headers, body)

    def rest(self) -> bytes:
        """Everything until the router closes the connection."""
        while self._fill():
            pass
        data, self.buffer = self.buffer, b""
        return data

    def closed_without_more(self) -> bool:
        """Whether the router closes the connection and sends nothing more."""
        try:
            return self.rest() == b""
        except ConnectionResetError:
            return not self.buffer


def request(method: str, path: str, body: bytes = b"", /, **headers: str) -> bytes:
    """A request's bytes; ``Host: 127.0.0.1`` unless given."""
    lines = [f"{method} {path} HTTP/1.1", "host: " + headers.pop("host", "127.0.0.1")]
    lines += [f"{name.replace('_', '-')}: {value}" for name, value in headers.items()]
    if body or method == "POST":
        lines.append(f"content-length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
