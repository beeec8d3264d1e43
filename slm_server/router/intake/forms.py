"""Finding the routing fields of a ``multipart/form-data`` request body. Pure, but for
:func:`read_form_fields`, which runs the parse in a worker thread.

Image edits and audio transcriptions arrive as multipart forms; the router only needs
their ``model`` (to route) and ``stream`` (to relay an event stream as it arrives).
The body is parsed with python-multipart's streaming parser, once, only to find those
fields and to make sure it is a well-formed form: it is forwarded upstream exactly as
the client sent it, never re-encoded. File parts are skipped without being copied.
"""

from __future__ import annotations

from typing import Any, Final

import anyio.to_thread
from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, MultipartState, parse_options_header

from slm_server.errors import InvalidRequest

FORM_CONTENT_TYPE: Final = b"multipart/form-data"
# What one form may hold before it is refused: a form that needs more is not one of
# ours, and the parser walks part headers byte by byte.
MAX_PARTS: Final = 1000
MAX_PART_HEADER_BYTES: Final = 16 * 1024
# Form values that mean true, as the backends (FastAPI/pydantic) read a boolean field.
TRUE_VALUES: Final = frozenset({"1", "on", "t", "true", "y", "yes"})
_WANTED: Final = (b"model", b"stream")


def _invalid(message: str) -> InvalidRequest:
    return InvalidRequest(message, code="invalid_multipart")


def form_boundary(content_type: str | None) -> bytes:
    """The boundary of a ``multipart/form-data`` content type; 400 for any other."""
    try:
        kind, options = parse_options_header(content_type or "")
    except ValueError:  # not latin-1 (never from a real header), or unparseable
        kind, options = b"", {}
    if kind.lower() != FORM_CONTENT_TYPE:
        shown = (content_type or "none")[:80]
        raise InvalidRequest(
            f"This endpoint takes a multipart/form-data body, not {shown!r}",
            code="invalid_content_type",
        )
    boundary = options.get(b"boundary", b"")
    if not boundary:
        raise _invalid("The multipart/form-data content type has no boundary")
    return boundary


class _Finder:
    """The parser's callbacks: keeps the values of the wanted fields, counts the rest."""

    def __init__(self) -> None:
        self.fields: dict[bytes, list[bytes]] = {}
        self.parts = 0
        self.header_bytes = 0
        self.field_bytes = b""
        self.value_bytes = b""
        self.disposition: bytes | None = None
        self.name: bytes | None = None  # the wanted field being collected, if any
        self.value: list[bytes] = []

    def part_begin(self) -> None:
        self.parts += 1
        if self.parts > MAX_PARTS:
            raise _invalid(f"The form has more than {MAX_PARTS} parts")
        self.header_bytes = 0
        self.disposition = None
        self.name = None

    def _count(self, size: int) -> None:
        self.header_bytes += size
        if self.header_bytes > MAX_PART_HEADER_BYTES:
            raise _invalid(f"A form part has more than {MAX_PART_HEADER_BYTES} bytes of headers")

    def header_field(self, data: bytes, start: int, end: int) -> None:
        self._count(end - start)
        self.field_bytes += data[start:end]

    def header_value(self, data: bytes, start: int, end: int) -> None:
        self._count(end - start)
        self.value_bytes += data[start:end]

    def header_end(self) -> None:
        if self.field_bytes.lower() == b"content-disposition":
            self.disposition = self.value_bytes
        self.field_bytes = self.value_bytes = b""

    def headers_finished(self) -> None:
        if self.disposition is None:
            raise _invalid("A form part has no Content-Disposition header")
        kind, options = parse_options_header(self.disposition.decode("latin-1"))
        if kind.lower() != b"form-data" or b"name" not in options:
            raise _invalid("A form part's Content-Disposition is not form-data with a name")
        if options[b"name"] in _WANTED:
            self.name = options[b"name"]
            self.value = []

    def part_data(self, data: bytes, start: int, end: int) -> None:
        if self.name is not None:
            self.value.append(data[start:end])

    def part_end(self) -> None:
        if self.name is not None:
            self.fields.setdefault(self.name, []).append(b"".join(self.value))
            self.name = None


def form_fields(raw: bytes, content_type: str | None) -> dict[str, Any]:
    """The routing fields of a multipart form: ``model`` (a string) when the form has
    one, and ``stream`` (a boolean) when it has that. 400 when the body is not a
    well-formed ``multipart/form-data`` form or names its model more than once."""
    boundary = form_boundary(content_type)
    finder = _Finder()
    parser = MultipartParser(
        boundary,
        {
            "on_part_begin": finder.part_begin,
            "on_header_field": finder.header_field,
            "on_header_value": finder.header_value,
            "on_header_end": finder.header_end,
            "on_headers_finished": finder.headers_finished,
            "on_part_data": finder.part_data,
            "on_part_end": finder.part_end,
        },
    )
    try:
        parser.write(raw)
    except MultipartParseError as exc:
        raise _invalid(f"The multipart/form-data body is malformed: {exc}") from None
    if parser.state != MultipartState.END:
        raise _invalid("The multipart/form-data body ends before its closing boundary")
    found: dict[str, Any] = {}
    models = finder.fields.get(b"model", [])
    if len(models) > 1:
        raise InvalidRequest(
            "The form has more than one 'model' field", code="invalid_model", param="model"
        )
    if models:
        try:
            found["model"] = models[0].decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidRequest(
                "The 'model' field is not UTF-8 text", code="invalid_model", param="model"
            ) from None
    streams = finder.fields.get(b"stream")
    if streams:
        found["stream"] = streams[-1].decode("latin-1").strip().lower() in TRUE_VALUES
    return found


async def read_form_fields(raw: bytes, content_type: str | None) -> dict[str, Any]:
    """:func:`form_fields` in a worker thread: a large form never holds up the loop."""
    return await anyio.to_thread.run_sync(form_fields, raw, content_type)
