"""Which of a client's headers go upstream (``forward_headers``), read from the raw
header list in one pass."""

from __future__ import annotations

from slm_server.router.upstream.client import forward_headers


def test_hop_by_hop_credentials_and_what_connection_names_stay() -> None:
    raw = [
        (b"host", b"127.0.0.1:8000"),
        (b"content-length", b"2"),
        (b"connection", b"keep-alive, X-Secret"),
        (b"x-secret", b"1"),
        (b"authorization", b"Bearer k"),
        (b"proxy-authorization", b"Basic x"),
        (b"te", b"trailers"),
        (b"expect", b"100-continue"),
        (b"accept-encoding", b"gzip"),
        (b"x-kept", b"\xe9"),  # latin-1, as HTTP has it
        (b"Traceparent", b"00-abc-def-01"),
    ]
    assert forward_headers(raw) == {"x-kept": "\xe9", "traceparent": "00-abc-def-01"}


def test_a_header_sent_twice_goes_with_its_last_value() -> None:
    assert forward_headers([(b"x-a", b"1"), (b"x-a", b"2")]) == {"x-a": "2"}


def test_a_connection_token_names_a_header_sent_before_or_after_it() -> None:
    raw = [(b"x-before", b"1"), (b"connection", b" X-Before ,x-after"), (b"x-after", b"2")]
    assert forward_headers(raw) == {}
