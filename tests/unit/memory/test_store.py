"""Remembered footprints: round trip, keys, the bound, and files that are corrupt or
cannot be written."""

from __future__ import annotations

import json
import os
from itertools import count
from pathlib import Path

import pytest

from slm_server.memory.store import FootprintKey, FootprintStore


def key(name: str = "m.gguf", **fields: object) -> FootprintKey:
    values: dict[str, object] = {
        "backend": "llamacpp",
        "model": f"/models/{name}",
        "size": 100,
        "mtime_ns": 1,
        "context_length": 4096,
        "parallel": 2,
    }
    values.update(fields)
    return FootprintKey(**values)  # type: ignore[arg-type]


def ticking() -> object:
    ticks = count(1000)
    return lambda: float(next(ticks))


def test_round_trip_across_instances(tmp_path: Path) -> None:
    path = tmp_path / "logs" / "footprints.json"
    store = FootprintStore(path, clock=ticking())  # type: ignore[arg-type]
    assert store.get(key()) is None
    assert store.put(key(), 215)
    assert store.put("a plain key", 7)
    again = FootprintStore(path)
    assert again.get(key()) == 215
    assert again.get(key().text()) == 215
    assert again.get("a plain key") == 7
    assert again.get(key(parallel=1)) is None
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data["version"] == 1
    assert data["entries"][0] == {"key": key().text(), "mb": 215, "measured_at": 1000.0}


def test_every_field_is_part_of_the_key() -> None:
    base = key()
    variants = [
        key(backend="mlx"),
        key(name="other.gguf"),
        key(size=101),
        key(mtime_ns=2),
        key(context_length=None),
        key(parallel=1),
        key(cache_type_k="q8_0"),
        key(cache_type_v="q8_0"),
        key(extra="kv_unified"),
    ]
    texts = {v.text() for v in variants}
    assert base.text() not in texts
    assert len(texts) == len(variants)


def test_key_of_a_file_and_of_a_directory(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"x" * 10)
    os.utime(model, ns=(5_000, 7_000))
    built = FootprintKey.of("llamacpp", model, context_length=None, parallel=1)
    assert (built.model, built.size, built.mtime_ns) == (str(model.resolve()), 10, 7_000)
    model.write_bytes(b"x" * 11)
    assert FootprintKey.of("llamacpp", model, context_length=None, parallel=1) != built
    directory = tmp_path / "mlx"
    directory.mkdir()
    (directory / "a.safetensors").write_bytes(b"a" * 3)
    (directory / "config.json").write_bytes(b"{}")
    os.utime(directory / "a.safetensors", ns=(1, 9_000))
    os.utime(directory / "config.json", ns=(1, 8_000))
    mlx = FootprintKey.of("mlx", directory, context_length=2048, parallel=4, extra="x")
    assert (mlx.size, mlx.mtime_ns, mlx.extra) == (5, 9_000, "x")
    with pytest.raises(OSError, match="absent"):
        FootprintKey.of("llamacpp", tmp_path / "absent", context_length=None, parallel=1)


def test_entries_are_bounded_oldest_first(tmp_path: Path) -> None:
    path = tmp_path / "footprints.json"
    store = FootprintStore(path, max_entries=3)
    for name in "abcd":
        assert store.put(name, 1)
    assert len(store) == 3
    assert store.get("a") is None
    assert store.put("b", 2)  # b is stored anew, so c is now the oldest
    assert store.put("e", 5)
    again = FootprintStore(path, max_entries=3)
    assert [again.get(n) for n in "bcde"] == [2, None, 1, 5]
    assert len(FootprintStore(path, max_entries=2)) == 2


@pytest.mark.parametrize(
    "content",
    [
        "",
        "{not json",
        "[]",
        '{"version": 2, "entries": []}',
        '{"version": 1, "entries": {}}',
        "\x00\xff" * 10,
    ],
)
def test_a_corrupt_file_reads_as_empty(tmp_path: Path, content: str) -> None:
    path = tmp_path / "footprints.json"
    path.write_text(content, encoding="utf-8", errors="surrogateescape")
    store = FootprintStore(path)
    assert len(store) == 0
    assert store.put("k", 3)
    assert FootprintStore(path).get("k") == 3


def test_bad_entries_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "footprints.json"
    entries = [
        {"key": "good", "mb": 10, "measured_at": 1.0},
        {"key": "zero", "mb": 0},
        {"key": "bool", "mb": True},
        {"key": "float", "mb": 1.5},
        {"key": 5, "mb": 10},
        {"mb": 10},
        "junk",
        {"key": "no time", "mb": 4},
    ]
    path.write_text(json.dumps({"version": 1, "entries": entries}), encoding="utf-8")
    store = FootprintStore(path)
    assert len(store) == 2
    assert (store.get("good"), store.get("no time")) == (10, 4)


def test_an_oversized_file_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "footprints.json"
    with path.open("wb") as handle:
        handle.truncate(2 << 20)
    assert len(FootprintStore(path)) == 0


def test_a_file_that_cannot_be_read_reads_as_empty(tmp_path: Path) -> None:
    path = tmp_path / "footprints.json"
    path.mkdir()  # a directory where the file should be
    store = FootprintStore(path)
    assert len(store) == 0
    assert not store.put("k", 1)
    assert store.last_error is not None


def test_a_failed_write_is_reported_not_raised(tmp_path: Path) -> None:
    # A regular file where the directory should be: the write fails for any user.
    blocker = tmp_path / "logs"
    blocker.write_text("", encoding="utf-8")
    store = FootprintStore(blocker / "footprints.json")
    assert not store.put("k", 9)
    assert store.last_error is not None
    assert "footprints.json" in store.last_error
    assert store.get("k") == 9
    blocker.unlink()
    assert store.put("k", 10)
    assert store.last_error is None
    assert FootprintStore(blocker / "footprints.json").get("k") == 10


def test_put_refuses_nonsense(tmp_path: Path) -> None:
    store = FootprintStore(tmp_path / "f.json")
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="positive"):
            store.put("k", bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_entries"):
        FootprintStore(tmp_path / "f.json", max_entries=0)
