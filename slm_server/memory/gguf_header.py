"""The metadata key-values at the head of a GGUF file, read without any dependency.

A GGUF file starts with ``GGUF``, a version (2 or 3), the tensor count, the key-value
count, then each key (a length-prefixed UTF-8 string), its type code and its value;
the tensor infos and the tensor data follow, and are never read here. Only the header
is read, through a small buffer, so a model of many GB costs a few MB of reads at most.

Values come back as Python scalars (``int``, ``float``, ``bool``), ``str``, a ``tuple``
for a short array of scalars (a per-layer head count, say), or a :class:`GgufArray`
that records only the element type and length of a long or string array (the
tokenizer's vocabulary is skipped, not kept). A caller that needs to know whether the
vocabulary holds a few given token texts (:mod:`.fill_in`: the fill-in-the-middle tokens
llama.cpp finds by their text) names them, and the vocabulary is streamed past them:
each string is compared where its length is one of theirs and never kept, so the memory
it costs does not grow with the vocabulary.

Like llama.cpp's own reader (``ggml/src/gguf.cpp``, ``gguf_init_from_file_impl``) we
refuse version 1, a file of the other endianness, nested arrays and duplicate keys.
Every length and count is checked against the bytes the file still has and against
caps, so a corrupt or hostile file fails fast with :class:`GgufError` and never makes
us allocate or loop in proportion to a number it claims.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Final

MAGIC: Final = b"GGUF"
SUPPORTED_VERSIONS: Final = (2, 3)

# Caps on what a header may claim. Real files hold a few dozen keys, keys of tens of
# bytes, chat templates of tens of kB and vocabularies of a few hundred thousand
# tokens (a few MB of header in all).
MAX_KV_COUNT: Final = 65_536
MAX_TENSOR_COUNT: Final = 1 << 20
MAX_KEY_BYTES: Final = 65_535
MAX_STRING_BYTES: Final = 1 << 20  # longer string values are skipped, not returned
MAX_ARRAY_VALUES: Final = 4_096  # longer arrays come back as a GgufArray
MAX_HEADER_BYTES: Final = 64 << 20
# What one header may make us keep in all; beyond it values are skipped like long ones.
MAX_KEPT_STRING_BYTES: Final = 16 << 20
MAX_KEPT_ARRAY_VALUES: Final = 1 << 18
# The array of the tokenizer's vocabulary, the token texts by id.
VOCABULARY_KEY: Final = "tokenizer.ggml.tokens"

_BUFFER_BYTES: Final = 1 << 16
_U64: Final = struct.Struct("<Q")

# GGUF value type codes (gguf.cpp's gguf_type) and their struct formats.
TYPE_STRING: Final = 8
TYPE_ARRAY: Final = 9
_SCALAR_FORMATS: Final[Mapping[int, str]] = {
    0: "B",  # uint8
    1: "b",  # int8
    2: "H",  # uint16
    3: "h",  # int16
    4: "I",  # uint32
    5: "i",  # int32
    6: "f",  # float32
    7: "?",  # bool
    10: "Q",  # uint64
    11: "q",  # int64
    12: "d",  # float64
}
TYPE_NAMES: Final[Mapping[int, str]] = {
    0: "uint8",
    1: "int8",
    2: "uint16",
    3: "int16",
    4: "uint32",
    5: "int32",
    6: "float32",
    7: "bool",
    8: "string",
    9: "array",
    10: "uint64",
    11: "int64",
    12: "float64",
}


class GgufError(Exception):
    """The file is not a GGUF file we can read; the message names the file."""


@dataclass(frozen=True)
class GgufArray:
    """An array we did not keep: its element type (a ``TYPE_NAMES`` value) and length."""

    element_type: str
    length: int


Scalar = int | float | bool | str
GgufValue = Scalar | tuple[int | float | bool, ...] | GgufArray


@dataclass(frozen=True)
class GgufHeader:
    """What the header says: its version, how many tensors follow, the metadata, and
    which of the token texts the caller asked about are in the vocabulary."""

    version: int
    tensor_count: int
    metadata: Mapping[str, GgufValue]
    found_tokens: frozenset[str] = frozenset()


class _Reader:
    """Sequential reads from the header through one buffer, each checked against the
    bytes the file has left and the header cap."""

    def __init__(
        self, handle: BinaryIO, size: int, path: Path, wanted: frozenset[bytes] = frozenset()
    ) -> None:
        self._handle = handle
        self._size = size
        self._path = path
        self.wanted = wanted  # token texts looked for in the vocabulary
        self.found: set[bytes] = set()
        self._buffer = b""
        self._pos = 0  # in the buffer
        self.offset = 0  # in the file
        self.kept_string_bytes = 0
        self.kept_array_values = 0

    def fail(self, what: str) -> GgufError:
        return GgufError(f"{self._path}: {what} (at byte {self.offset})")

    def claim(self, count: int, what: str) -> None:
        """Fail unless ``count`` more bytes exist and stay within the header cap."""
        if count > self._size - self.offset:
            raise self.fail(f"truncated: {what} needs {count} bytes, the file has fewer left")
        if self.offset + count > MAX_HEADER_BYTES:
            raise self.fail(f"metadata larger than {MAX_HEADER_BYTES >> 20} MiB")

    def _fill(self, count: int, what: str) -> None:
        """Make ``count`` bytes from the current position available in the buffer."""
        self.claim(count, what)
        if self._pos + count > len(self._buffer):
            rest = self._buffer[self._pos :]
            more = self._handle.read(max(count - len(rest), _BUFFER_BYTES))
            self._buffer, self._pos = rest + more, 0
            if len(self._buffer) < count:
                raise self.fail(f"truncated while reading {what}")

    def read(self, count: int, what: str) -> bytes:
        self._fill(count, what)
        data = self._buffer[self._pos : self._pos + count]
        self._pos += count
        self.offset += count
        return data

    def skip(self, count: int, what: str) -> None:
        self.claim(count, what)
        left = len(self._buffer) - self._pos
        if count <= left:
            self._pos += count
        else:
            self._handle.seek(count - left, os.SEEK_CUR)
            self._buffer, self._pos = b"", 0
        self.offset += count

    def skip_strings(self, count: int, what: str) -> None:
        """Skip ``count`` length-prefixed strings (the hot loop of a vocabulary)."""
        # Each string holds at least its 8-byte length: a count the file cannot hold is
        # refused before we loop over it.
        self.claim(count * 8, what)
        for _ in range(count):
            if self._pos + 8 > len(self._buffer):
                self._fill(8, what)
            (length,) = _U64.unpack_from(self._buffer, self._pos)
            self._pos += 8
            self.offset += 8
            self.skip(length, what)

    def find_strings(self, count: int, what: str) -> None:
        """Skip ``count`` length-prefixed strings as :meth:`skip_strings` does, noting
        in ``found`` each that is one of ``wanted``: only a string of a wanted length is
        looked at, in the buffer, and none is kept."""
        self.claim(count * 8, what)
        wanted = self.wanted
        lengths = {len(text) for text in wanted}
        for _ in range(count):
            if self._pos + 8 > len(self._buffer):
                self._fill(8, what)
            (length,) = _U64.unpack_from(self._buffer, self._pos)
            self._pos += 8
            self.offset += 8
            if length in lengths:
                text = self.read(length, what)
                if text in wanted:
                    self.found.add(text)
            else:
                self.skip(length, what)

    def unpack(self, fmt: str, what: str) -> int | float | bool:
        size = struct.calcsize("<" + fmt)
        value: int | float | bool = struct.unpack("<" + fmt, self.read(size, what))[0]
        return value

    def count(self, what: str) -> int:
        return int(self.unpack("Q", what))

    def _decode(self, length: int, what: str) -> str:
        try:
            return self.read(length, what).decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} is not UTF-8") from None

    def key(self, what: str) -> str:
        """A length-prefixed string of at most ``MAX_KEY_BYTES``."""
        length = self.count(f"the length of {what}")
        if length > MAX_KEY_BYTES:
            raise self.fail(f"{what} is longer than {MAX_KEY_BYTES} bytes")
        return self._decode(length, what)

    def string(self, what: str) -> str | None:
        """A length-prefixed string; ``None`` (skipped) when over ``MAX_STRING_BYTES``."""
        length = self.count(f"the length of {what}")
        if length > MAX_STRING_BYTES or self.kept_string_bytes + length > MAX_KEPT_STRING_BYTES:
            self.skip(length, what)
            return None
        self.kept_string_bytes += length
        return self._decode(length, what)


def _read_array(reader: _Reader, key: str) -> GgufValue:
    element = int(reader.unpack("I", f"the element type of {key!r}"))
    length = reader.count(f"the length of {key!r}")
    if element == TYPE_ARRAY:
        raise reader.fail(f"{key!r} is a nested array, which GGUF readers refuse")
    if element == TYPE_STRING:
        if key == VOCABULARY_KEY and reader.wanted:
            reader.find_strings(length, f"the {length} strings of {key!r}")
        else:
            reader.skip_strings(length, f"the {length} strings of {key!r}")
        return GgufArray("string", length)
    fmt = _SCALAR_FORMATS.get(element)
    if fmt is None:
        raise reader.fail(f"{key!r} has an array of unknown type {element}")
    width = struct.calcsize("<" + fmt)
    if length > MAX_ARRAY_VALUES or reader.kept_array_values + length > MAX_KEPT_ARRAY_VALUES:
        reader.skip(length * width, f"the values of {key!r}")
        return GgufArray(TYPE_NAMES[element], length)
    reader.kept_array_values += length
    data = reader.read(length * width, f"the values of {key!r}")
    return tuple(struct.unpack(f"<{length}{fmt}", data))


def _read_value(reader: _Reader, key: str, value_type: int) -> GgufValue | None:
    if value_type == TYPE_STRING:
        return reader.string(f"the value of {key!r}")
    if value_type == TYPE_ARRAY:
        return _read_array(reader, key)
    fmt = _SCALAR_FORMATS.get(value_type)
    if fmt is None:
        raise reader.fail(f"{key!r} has unknown value type {value_type}")
    return reader.unpack(fmt, f"the value of {key!r}")


def read_header(path: Path, find_tokens: Collection[str] = ()) -> GgufHeader:
    """The header of the GGUF file at ``path``, and which of the token texts
    ``find_tokens`` its vocabulary holds (``found_tokens``).

    Raises :class:`GgufError` for a file that is missing, unreadable, not GGUF, of an
    unsupported version or corrupt; string values longer than ``MAX_STRING_BYTES``
    (or past ``MAX_KEPT_STRING_BYTES`` in all) are left out of ``metadata``.
    """
    wanted = frozenset(text.encode("utf-8") for text in find_tokens)
    try:
        with open(path, "rb", buffering=0) as handle:
            size = os.fstat(handle.fileno()).st_size
            return _parse(_Reader(handle, size, path, wanted))
    except OSError as exc:
        raise GgufError(f"{path}: cannot read: {exc.strerror or exc}") from exc


def _parse(reader: _Reader) -> GgufHeader:
    if reader.read(4, "the magic") != MAGIC:
        raise reader.fail("not a GGUF file (bad magic)")
    version = int(reader.unpack("I", "the version"))
    if version & 0xFFFF == 0 and version != 0:
        raise reader.fail(f"version {version:#x}: a big-endian GGUF file, not supported")
    if version not in SUPPORTED_VERSIONS:
        raise reader.fail(f"unsupported GGUF version {version}")
    tensor_count = reader.count("the tensor count")
    if tensor_count > MAX_TENSOR_COUNT:
        raise reader.fail(f"implausible tensor count {tensor_count}")
    kv_count = reader.count("the key-value count")
    if kv_count > MAX_KV_COUNT:
        raise reader.fail(f"implausible key-value count {kv_count}")
    metadata: dict[str, GgufValue] = {}
    seen: set[str] = set()
    for index in range(kv_count):
        key = reader.key(f"key {index}")
        if key in seen:
            raise reader.fail(f"duplicate key {key!r}")
        seen.add(key)
        value_type = int(reader.unpack("I", f"the type of {key!r}"))
        value = _read_value(reader, key, value_type)
        if value is not None:
            metadata[key] = value
    found = frozenset(text.decode("utf-8") for text in reader.found)
    return GgufHeader(version, tensor_count, metadata, found)
