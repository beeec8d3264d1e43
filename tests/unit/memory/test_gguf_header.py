"""The dependency-free GGUF header reader: every value type, the shapes real files
have, and hostile headers refused quickly without large allocations."""

from __future__ import annotations

import struct
import time
import tracemalloc
from pathlib import Path

import gguf
import pytest

from slm_server.memory.gguf_header import (
    MAX_ARRAY_VALUES,
    MAX_HEADER_BYTES,
    MAX_KEPT_ARRAY_VALUES,
    MAX_KV_COUNT,
    MAX_STRING_BYTES,
    GgufArray,
    GgufError,
    read_header,
)
from tests.unit.memory.gguf_files import (
    GEMMA3,
    SMOLLM2,
    llama_like,
    raw_header,
    raw_kv,
    raw_string,
    write_gguf,
)


def test_reads_every_scalar_type_strings_and_arrays(tmp_path: Path) -> None:
    def fill(writer: gguf.GGUFWriter) -> None:
        writer.add_uint8("t.u8", 255)
        writer.add_int8("t.i8", -128)
        writer.add_uint16("t.u16", 65535)
        writer.add_int16("t.i16", -32768)
        writer.add_uint32("t.u32", 4_000_000_000)
        writer.add_int32("t.i32", -2_000_000_000)
        writer.add_float32("t.f32", 0.5)
        writer.add_bool("t.bool", True)
        writer.add_uint64("t.u64", 2**63 + 1)
        writer.add_int64("t.i64", -(2**62))
        writer.add_float64("t.f64", 1e-300)
        writer.add_string("t.str", "héllo")
        writer.add_array("t.ints", [1, 2, 3])
        writer.add_array("t.floats", [0.25, 0.5])
        writer.add_array("t.bools", [True, False])
        writer.add_array("t.strs", ["a", "bc", ""])
        writer.add_array("t.long", list(range(MAX_ARRAY_VALUES + 1)))

    header = read_header(write_gguf(tmp_path / "all.gguf", "llama", fill))
    meta = header.metadata
    assert header.version == 3
    assert header.tensor_count == 1
    assert meta["general.architecture"] == "llama"
    expected = {
        "t.u8": 255,
        "t.i8": -128,
        "t.u16": 65535,
        "t.i16": -32768,
        "t.u32": 4_000_000_000,
        "t.i32": -2_000_000_000,
        "t.f32": 0.5,
        "t.bool": True,
        "t.u64": 2**63 + 1,
        "t.i64": -(2**62),
        "t.f64": 1e-300,
        "t.str": "héllo",
        "t.floats": (0.25, 0.5),
        "t.bools": (True, False),
        "t.strs": GgufArray("string", 3),
    }
    for key, value in expected.items():
        assert meta[key] == value, key
    assert meta["t.bool"] is True
    assert meta["t.ints"] == (1, 2, 3)
    assert meta["t.long"] == GgufArray("int32", MAX_ARRAY_VALUES + 1)


def test_reads_version_2_and_empty_values(tmp_path: Path) -> None:
    body = raw_kv(b"general.architecture", 8, raw_string(b"llama"))
    body += raw_kv(b"llama.block_count", 4, struct.pack("<I", 7))
    body += raw_kv(b"t.empty", 8, raw_string(b""))
    body += raw_kv(b"t.none", 9, struct.pack("<IQ", 4, 0))
    path = tmp_path / "v2.gguf"
    path.write_bytes(raw_header(version=2, kvs=4, body=body))
    header = read_header(path)
    assert header.version == 2
    assert header.metadata == {
        "general.architecture": "llama",
        "llama.block_count": 7,
        "t.empty": "",
        "t.none": (),
    }


def test_a_long_string_value_is_skipped_and_reading_goes_on(tmp_path: Path) -> None:
    def fill(writer: gguf.GGUFWriter) -> None:
        writer.add_string("t.big", "x" * (MAX_STRING_BYTES + 1))
        writer.add_uint32("t.after", 7)

    meta = read_header(write_gguf(tmp_path / "big.gguf", "llama", fill)).metadata
    assert "t.big" not in meta
    assert meta["t.after"] == 7


def test_reads_only_the_header_of_a_large_file(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "m.gguf", "llama", llama_like(), tensor_bytes=64 << 20)
    tracemalloc.start()
    try:
        started = time.perf_counter()
        meta = read_header(path).metadata
        elapsed = time.perf_counter() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert meta["llama.block_count"] == 4
    assert peak < 1 << 20
    assert elapsed < 1.0


@pytest.mark.skipif(not SMOLLM2.exists(), reason="the default models are not fetched")
def test_smollm2_metadata() -> None:
    header = read_header(SMOLLM2)
    meta = header.metadata
    assert header.version == 3
    assert meta["general.architecture"] == "llama"
    assert meta["llama.block_count"] == 30
    assert meta["llama.context_length"] == 8192
    assert meta["llama.attention.head_count"] == 9
    assert meta["llama.attention.head_count_kv"] == 3
    assert meta["llama.embedding_length"] == 576
    assert meta["tokenizer.ggml.tokens"] == GgufArray("string", 49152)
    assert isinstance(meta["tokenizer.chat_template"], str)


@pytest.mark.skipif(not GEMMA3.exists(), reason="the default models are not fetched")
def test_gemma3_metadata_is_read_quickly() -> None:
    started = time.perf_counter()
    meta = read_header(GEMMA3).metadata
    assert time.perf_counter() - started < 2.0
    assert meta["general.architecture"] == "gemma3"
    assert meta["gemma3.attention.sliding_window"] == 512
    assert meta["gemma3.attention.key_length"] == 256
    assert meta["tokenizer.ggml.tokens"] == GgufArray("string", 262144)
    assert meta["tokenizer.ggml.scores"] == GgufArray("float32", 262144)


HUGE = 2**63
KEY = raw_string(b"k")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "truncated"),
        (b"GGU", "truncated"),
        (b"GGML" + bytes(20), "bad magic"),
        (raw_header(version=1), "unsupported GGUF version 1"),
        (raw_header(version=0), "unsupported GGUF version 0"),
        (raw_header(version=4), "unsupported GGUF version 4"),
        (b"GGUF" + struct.pack(">IQQ", 3, 0, 0), "big-endian"),
        (raw_header()[:-3], "truncated"),
        (raw_header(tensors=HUGE), "implausible tensor count"),
        (raw_header(kvs=HUGE), "implausible key-value count"),
        (raw_header(kvs=MAX_KV_COUNT + 1), "implausible key-value count"),
        (raw_header(kvs=3), "truncated"),
        (raw_header(kvs=1, body=raw_string(b"", HUGE)), "longer than 65535"),
        (raw_header(kvs=1, body=raw_string(b"k" * 10, 70_000)), "longer than 65535"),
        (raw_header(kvs=1, body=raw_string(b"\xff\xfe")), "not UTF-8"),
        (raw_header(kvs=1, body=KEY), "truncated"),
        (raw_header(kvs=1, body=KEY + struct.pack("<I", 13)), "unknown value type 13"),
        (raw_header(kvs=1, body=raw_kv(b"k", 4, b"\x01")), "truncated"),
        (raw_header(kvs=1, body=raw_kv(b"k", 8, raw_string(b"", HUGE))), "truncated"),
        (
            raw_header(kvs=1, body=raw_kv(b"k", 8, raw_string(b"", MAX_STRING_BYTES + 9))),
            "truncated",
        ),
        (raw_header(kvs=1, body=raw_kv(b"k", 9, struct.pack("<IQ", 4, HUGE))), "truncated"),
        (raw_header(kvs=1, body=raw_kv(b"k", 9, struct.pack("<IQ", 8, HUGE))), "truncated"),
        (
            raw_header(kvs=1, body=raw_kv(b"k", 9, struct.pack("<IQ", 8, 2) + raw_string(b"a"))),
            "truncated",
        ),
        (
            raw_header(
                kvs=1, body=raw_kv(b"k", 9, struct.pack("<IQ", 8, 1) + raw_string(b"", HUGE))
            ),
            "truncated",
        ),
        (raw_header(kvs=1, body=raw_kv(b"k", 9, struct.pack("<IQ", 9, 1))), "nested array"),
        (raw_header(kvs=1, body=raw_kv(b"k", 9, struct.pack("<IQ", 77, 1))), "unknown type 77"),
        (
            raw_header(kvs=2, body=raw_kv(b"k", 0, b"\x01") * 2),
            "duplicate key 'k'",
        ),
    ],
)
def test_hostile_headers_fail_fast_with_bounded_memory(
    tmp_path: Path, content: bytes, message: str
) -> None:
    path = tmp_path / "hostile.gguf"
    path.write_bytes(content)
    tracemalloc.start()
    try:
        started = time.perf_counter()
        with pytest.raises(GgufError, match=message) as caught:
            read_header(path)
        elapsed = time.perf_counter() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert str(path) in str(caught.value)
    assert elapsed < 0.5
    assert peak < 1 << 20


def test_a_huge_string_array_count_is_refused_before_looping(tmp_path: Path) -> None:
    # 10 million strings claimed, only a few bytes present: refused at once.
    body = raw_kv(b"k", 9, struct.pack("<IQ", 8, 10_000_000) + raw_string(b"a") * 4)
    path = tmp_path / "strings.gguf"
    path.write_bytes(raw_header(kvs=1, body=body))
    started = time.perf_counter()
    with pytest.raises(GgufError, match="10000000 strings"):
        read_header(path)
    assert time.perf_counter() - started < 0.1


def test_a_missing_file_or_a_directory_is_a_gguf_error(tmp_path: Path) -> None:
    with pytest.raises(GgufError, match=r"absent\.gguf: cannot read"):
        read_header(tmp_path / "absent.gguf")
    with pytest.raises(GgufError, match="cannot read"):
        read_header(tmp_path)


def test_what_a_header_makes_us_keep_is_bounded(tmp_path: Path) -> None:
    # 100 arrays of 4096 values: past the kept budget they come back as lengths only.
    one = struct.pack("<IQ", 5, MAX_ARRAY_VALUES) + bytes(4 * MAX_ARRAY_VALUES)
    body = b"".join(raw_kv(f"a{i}".encode(), 9, one) for i in range(100))
    path = tmp_path / "arrays.gguf"
    path.write_bytes(raw_header(kvs=100, body=body))
    meta = read_header(path).metadata
    kept = [k for k, v in meta.items() if isinstance(v, tuple)]
    assert len(kept) == MAX_KEPT_ARRAY_VALUES // MAX_ARRAY_VALUES
    assert meta["a99"] == GgufArray("int32", MAX_ARRAY_VALUES)


def test_metadata_past_the_header_cap_is_refused(tmp_path: Path) -> None:
    body = raw_kv(b"k", 8, raw_string(b"", MAX_HEADER_BYTES))
    path = tmp_path / "sparse.gguf"
    with path.open("wb") as handle:
        handle.write(raw_header(kvs=2, body=body))
        handle.truncate(MAX_HEADER_BYTES + (1 << 20))  # sparse: costs no disk
    with pytest.raises(GgufError, match="metadata larger than 64 MiB"):
        read_header(path)
