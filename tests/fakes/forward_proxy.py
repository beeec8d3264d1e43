"""A plain HTTP forward proxy for tests (``HTTP_PROXY=http://127.0.0.1:<port>``): it
takes requests in absolute form (``GET http://host:port/path``), forwards them, streams
the answers back unchanged, and remembers each URL it carried."""

from __future__ import annotations

import http.client
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade"}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _ProxyServer

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _forward(self) -> None:
        target = urlsplit(self.path)
        if target.scheme != "http" or not target.hostname:
            self.send_error(400, "absolute http URL expected")
            return
        self.server.carried.append(f"{self.command} {self.path}")
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
        upstream = http.client.HTTPConnection(target.hostname, target.port or 80, timeout=30)
        try:
            path = target.path + (f"?{target.query}" if target.query else "")
            upstream.request(self.command, path or "/", body=body, headers=headers)
            answer = upstream.getresponse()
            self.send_response(answer.status, answer.reason)
            for key, value in answer.getheaders():
                if key.lower() not in _HOP_BY_HOP:
                    self.send_header(key, value)
            chunked = answer.getheader("Content-Length") is None and self.command != "HEAD"
            if chunked:
                self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            if self.command == "HEAD":
                return
            while block := answer.read(65536):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(block), block) if chunked else block)
            if chunked:
                self.wfile.write(b"0\r\n\r\n")
        except OSError:
            self.close_connection = True
        finally:
            upstream.close()

    do_GET = do_HEAD = do_POST = _forward


class _ProxyServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.carried: list[str] = []


@contextmanager
def forward_proxy() -> Iterator[tuple[str, list[str]]]:
    """A running proxy: its URL, and the list of requests it carried (growing)."""
    server = _ProxyServer()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", server.carried
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


__all__ = ["forward_proxy"]
