"""The directory of saved slots (slotcache/store.py), attacked: a manifest or a slot
file that is not what we wrote must be refused with a reason (never restored, never
crash the caller); the budget, the replacement of a model's sets and the removal of
what a save left behind must touch only our own files; everything is private."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from slm_server.slotcache.store import (
    FORMAT,
    MANIFEST_MAX_BYTES,
    MIB,
    Refused,
    SavedSet,
    SavedSlot,
    SlotStore,
    slot_file,
)

KEY = "0123456789abcdef01234567"
OTHER = "fedcba9876543210fedcba98"
THIRD = "aaaaaaaaaaaaaaaaaaaaaaaa"
FOURTH = "bbbbbbbbbbbbbbbbbbbbbbbb"
OLD = 1_600_000_000.0  # manifest mtimes set by the tests (the LRU order)


@pytest.fixture
def store(tmp_path: Path) -> SlotStore:
    store = SlotStore(tmp_path / "slots", budget_mb=4)
    store.prepare()
    return store


def written(store: SlotStore, key: str, slot: int, size: int, tokens: int = 10) -> SavedSlot:
    """A slot file as llama-server writes it (umask's 0644), and its record."""
    name = slot_file(key, slot)
    path = store.directory / name
    path.write_bytes(b"s" * size)
    path.chmod(0o644)
    return SavedSlot(slot, name, tokens, size)


def keep(
    store: SlotStore,
    key: str,
    sizes: tuple[int, ...] = (100,),
    role: str = "chat",
    model_id: str = "m1",
    mtime: float | None = None,
) -> list[str]:
    """Save and commit a set of one slot per size; its manifest's mtime set (LRU)."""
    slots = [written(store, key, slot, size) for slot, size in enumerate(sizes)]
    dropped = store.commit(key, role, model_id, slots)
    if mtime is not None and key not in dropped:
        os.utime(store.directory / f"{key}.json", (mtime, mtime))
    return dropped


def manifest(key: str = KEY, **changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "format": FORMAT,
        "key": key,
        "role": "chat",
        "model_id": "m1",
        "saved_at": 1.0,
        "slots": [{"slot": 0, "file": slot_file(key, 0), "tokens": 10, "bytes": 100}],
    }
    data.update(changes)
    return data


def forge(store: SlotStore, content: bytes | dict[str, Any], key: str = KEY) -> None:
    """A manifest written by someone else, beside a slot 0 file of 100 bytes."""
    (store.directory / slot_file(key, 0)).write_bytes(b"s" * 100)
    raw = json.dumps(content).encode() if isinstance(content, dict) else content
    (store.directory / f"{key}.json").write_bytes(raw)


def refused(store: SlotStore, key: str = KEY, slots: int = 2) -> str:
    found = store.saved(key, slots)
    assert isinstance(found, Refused), found
    assert found.key == key
    return found.reason


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


# -- what we wrote is what we read ----------------------------------------------------------


def test_a_committed_set_reads_back_private(store: SlotStore) -> None:
    assert keep(store, KEY, (100, 250)) == []
    found = store.saved(KEY, 2)
    assert isinstance(found, SavedSet)
    assert (found.key, found.role, found.model_id) == (KEY, "chat", "m1")
    assert [(s.slot, s.bytes) for s in found.slots] == [(0, 100), (1, 250)]
    assert (found.tokens, found.bytes) == (20, 350)
    assert found.saved_at > 0
    names = sorted(os.listdir(store.directory))
    assert names == [f"{KEY}.json", slot_file(KEY, 0), slot_file(KEY, 1)]
    assert {mode(store.directory / n) for n in names} == {0o600}


def test_nothing_saved_is_none_not_refused(store: SlotStore) -> None:
    assert store.saved(KEY, 1) is None


def test_prepare_makes_an_existing_open_directory_private(tmp_path: Path) -> None:
    folder = tmp_path / "slots"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    SlotStore(folder, 1).prepare()
    assert mode(folder) == 0o700


def test_prepare_creates_missing_parents_and_a_private_directory(tmp_path: Path) -> None:
    folder = tmp_path / "a" / "b" / "slots"
    SlotStore(folder, 1).prepare()
    assert mode(folder) == 0o700


def test_prepare_on_a_file_raises_oserror(tmp_path: Path) -> None:
    """The supervisor turns this OSError into 'not kept' (SlotSaves.prepare_directory)."""
    (tmp_path / "slots").write_text("not a directory")
    with pytest.raises(FileExistsError):
        SlotStore(tmp_path / "slots", 1).prepare()


# -- forged and corrupt manifests -------------------------------------------------------------


def _slot(**changes: Any) -> dict[str, Any]:
    return {"slot": 0, "file": slot_file(KEY, 0), "tokens": 10, "bytes": 100, **changes}


FORGED: dict[str, bytes | dict[str, Any]] = {
    "not json": b"{not json",
    "not utf-8": b"\xff\xfe{}",
    "empty": b"",
    "an array": b"[1, 2, 3]",
    "a string": b'"manifest"',
    "null": b"null",
    "a huge number": b"1" + b"0" * 5000,
    "too large": json.dumps(manifest(pad="x" * MANIFEST_MAX_BYTES)).encode(),
    "another format": manifest(format=2),
    "a bool format": manifest(format=True),  # True == 1: not a format number
    "a slot listed twice": manifest(slots=[_slot(), _slot()]),
    "no format": {k: v for k, v in manifest().items() if k != "format"},
    "another key": manifest(key=OTHER),
    "slots not a list": manifest(slots={"0": _slot()}),
    "no slots": manifest(slots=[]),
    "slot out of range": manifest(
        slots=[{"slot": 2, "file": slot_file(KEY, 2), "tokens": 1, "bytes": 100}]
    ),
    "negative slot": manifest(slots=[_slot(slot=-1)]),
    "negative tokens": manifest(slots=[_slot(tokens=-1)]),
    "negative bytes": manifest(slots=[_slot(bytes=-100)]),
    "bool slot": manifest(slots=[_slot(slot=False)]),
    "bool tokens": manifest(slots=[_slot(tokens=True)]),
    "string bytes": manifest(slots=[_slot(bytes="100")]),
    "float bytes": manifest(slots=[_slot(bytes=100.0)]),
    "slot not an object": manifest(slots=[[0, slot_file(KEY, 0), 10, 100]]),
    "a path in the file": manifest(slots=[_slot(file=f"sub/{slot_file(KEY, 0)}")]),
    "an absolute file": manifest(slots=[_slot(file=f"/etc/{slot_file(KEY, 0)}")]),
    "a parent in the file": manifest(slots=[_slot(file=f"../{slot_file(KEY, 0)}")]),
    "another keys file": manifest(slots=[_slot(file=slot_file(OTHER, 0))]),
    "another slots file": manifest(slots=[_slot(file=slot_file(KEY, 1))]),
    "no file": manifest(slots=[{"slot": 0, "tokens": 10, "bytes": 100}]),
    "a size mismatch": manifest(slots=[_slot(bytes=99)]),
    "no role": {k: v for k, v in manifest().items() if k != "role"},
    "a model id not a string": manifest(model_id=7),
}


@pytest.mark.parametrize("content", FORGED.values(), ids=FORGED.keys())
def test_a_forged_or_corrupt_manifest_is_refused(store: SlotStore, content: Any) -> None:
    forge(store, content)
    assert refused(store)


def test_the_forged_manifests_differ_from_a_good_one_only_in_what_is_attacked(
    store: SlotStore,
) -> None:
    """The control: the manifest the forgeries start from is accepted."""
    forge(store, manifest())
    assert isinstance(store.saved(KEY, 2), SavedSet)


def test_a_deeply_nested_manifest_is_refused_not_raised(store: SlotStore) -> None:
    """Under the size limit, yet too deep for json's recursion: a RecursionError out of
    ``saved`` would fail the supervisor's start (expect_slots), and out of ``commit``
    (which reads every manifest) every later save."""
    forge(store, b"[" * (MANIFEST_MAX_BYTES - 1))
    assert "unreadable" in refused(store)
    assert keep(store, OTHER) == []  # the corrupt one is no set: its files go as leftovers
    assert isinstance(store.saved(OTHER, 1), SavedSet)
    assert not any(n.startswith(KEY) for n in os.listdir(store.directory))


def test_a_slot_missing_from_disk_is_refused(store: SlotStore) -> None:
    keep(store, KEY, (100, 100))
    (store.directory / slot_file(KEY, 1)).unlink()
    assert "missing" in refused(store)


def test_a_slot_file_grown_since_the_save_is_refused(store: SlotStore) -> None:
    keep(store, KEY, (100,))
    with (store.directory / slot_file(KEY, 0)).open("ab") as handle:
        handle.write(b"more")
    assert "104 bytes, not 100" in refused(store)


def test_a_symlinked_manifest_is_refused(store: SlotStore, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps(manifest()))
    (store.directory / slot_file(KEY, 0)).write_bytes(b"s" * 100)
    (store.directory / f"{KEY}.json").symlink_to(elsewhere)
    assert refused(store) == "no manifest of ours"


def test_a_dangling_symlinked_manifest_is_refused_not_absent(store: SlotStore) -> None:
    (store.directory / f"{KEY}.json").symlink_to(store.directory / "nowhere")
    assert refused(store) == "no manifest of ours"


def test_a_symlinked_slot_file_is_refused(store: SlotStore, tmp_path: Path) -> None:
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"s" * 100)
    (store.directory / slot_file(KEY, 0)).symlink_to(outside)
    (store.directory / f"{KEY}.json").write_text(json.dumps(manifest()))
    assert "not a file of ours" in refused(store)


def test_a_directory_in_place_of_a_slot_file_is_refused(store: SlotStore) -> None:
    (store.directory / f"{KEY}.json").write_text(json.dumps(manifest()))
    (store.directory / slot_file(KEY, 0)).mkdir()
    assert "not a file of ours" in refused(store)


@pytest.mark.skipif(os.getuid() != 0, reason="chown to another user needs root")
def test_files_owned_by_another_user_are_refused(store: SlotStore) -> None:
    forge(store, manifest())
    os.chown(store.directory / slot_file(KEY, 0), 12345, -1)
    assert "not a file of ours" in refused(store)
    os.chown(store.directory / slot_file(KEY, 0), os.getuid(), -1)
    os.chown(store.directory / f"{KEY}.json", 12345, -1)
    assert refused(store) == "no manifest of ours"


# -- replacing, the budget, leftovers ---------------------------------------------------------


def test_a_commit_replaces_the_same_role_and_models_other_sets_only(store: SlotStore) -> None:
    keep(store, KEY, role="chat", model_id="m1")
    keep(store, THIRD, role="coder", model_id="m1")  # another role, same model
    keep(store, FOURTH, role="chat", model_id="m2")  # same role, another model
    assert keep(store, OTHER, role="chat", model_id="m1") == [KEY]
    assert store.saved(KEY, 1) is None
    assert not (store.directory / slot_file(KEY, 0)).exists()
    for key in (OTHER, THIRD, FOURTH):
        assert isinstance(store.saved(key, 1), SavedSet), key


def test_a_commit_of_the_same_key_replaces_the_set_in_place(store: SlotStore) -> None:
    keep(store, KEY, (100, 100))
    assert keep(store, KEY, (300,)) == []
    found = store.saved(KEY, 2)
    assert isinstance(found, SavedSet)
    assert [(s.slot, s.bytes) for s in found.slots] == [(0, 300)]


def test_the_least_recently_used_sets_go_first(tmp_path: Path) -> None:
    store = SlotStore(tmp_path / "slots", budget_mb=1)
    store.prepare()
    quarter = MIB // 4  # four of them and their manifests are over the budget
    assert keep(store, KEY, (quarter,), model_id="a", mtime=OLD + 1) == []
    assert keep(store, OTHER, (quarter,), model_id="b", mtime=OLD + 3) == []
    assert keep(store, THIRD, (quarter,), model_id="c", mtime=OLD + 2) == []
    assert keep(store, FOURTH, (quarter,), model_id="d") == [KEY]
    assert store.saved(KEY, 1) is None
    assert sorted(os.listdir(store.directory)) == sorted(
        [f"{k}.json" for k in (OTHER, THIRD, FOURTH)]
        + [slot_file(k, 0) for k in (OTHER, THIRD, FOURTH)]
    )


def test_touch_makes_an_old_set_the_youngest(tmp_path: Path) -> None:
    store = SlotStore(tmp_path / "slots", budget_mb=1)
    store.prepare()
    quarter = MIB // 4
    keep(store, KEY, (quarter,), model_id="a", mtime=OLD + 1)
    keep(store, OTHER, (quarter,), model_id="b", mtime=OLD + 2)
    keep(store, THIRD, (quarter,), model_id="c", mtime=OLD + 3)
    store.touch(KEY)  # restored just now
    assert keep(store, FOURTH, (quarter,), model_id="d") == [OTHER]
    assert isinstance(store.saved(KEY, 1), SavedSet)


def test_touch_of_nothing_is_nothing(store: SlotStore) -> None:
    store.touch(KEY)
    assert os.listdir(store.directory) == []


def test_a_set_larger_than_the_whole_budget_is_not_kept(tmp_path: Path) -> None:
    """Nor does it push out the sets that fit: it can never fit, so it goes first."""
    store = SlotStore(tmp_path / "slots", budget_mb=1)
    store.prepare()
    keep(store, OTHER, (1000,), model_id="b", mtime=OLD)
    keep(store, THIRD, (1000,), model_id="c", mtime=OLD + 1)
    assert keep(store, KEY, (MIB, 1)) == [KEY]
    assert store.saved(KEY, 2) is None
    assert not any(n.startswith(KEY) for n in os.listdir(store.directory))
    assert isinstance(store.saved(OTHER, 1), SavedSet)
    assert isinstance(store.saved(THIRD, 1), SavedSet)


def test_a_set_within_the_budget_is_kept_and_its_manifest_counts(tmp_path: Path) -> None:
    store = SlotStore(tmp_path / "slots", budget_mb=1)
    store.prepare()
    assert keep(store, KEY, (MIB // 2 - 1000, MIB // 2 - 1000)) == []
    assert isinstance(store.saved(KEY, 2), SavedSet)
    # Slot files of exactly the budget: their manifest is on disk too.
    assert keep(store, KEY, (MIB // 2, MIB // 2)) == [KEY]


def test_files_a_save_left_without_a_manifest_are_removed(store: SlotStore) -> None:
    written(store, OTHER, 0, 50)  # the save was cut short before its commit
    (store.directory / f"{THIRD}.json.tmp").write_text("{")  # a commit cut short
    (store.directory / "notes.txt").write_text("mine")
    keep(store, KEY)
    names = sorted(os.listdir(store.directory))
    assert names == sorted([f"{KEY}.json", slot_file(KEY, 0), "notes.txt"])


def test_a_corrupt_manifest_and_its_files_are_removed_by_the_budget(store: SlotStore) -> None:
    forge(store, b"{corrupt", key=OTHER)
    keep(store, KEY)
    assert not any(n.startswith(OTHER) for n in os.listdir(store.directory))


def test_discard_removes_the_manifest_and_every_slot_of_the_key_only(store: SlotStore) -> None:
    keep(store, KEY, (10, 10))
    keep(store, OTHER, model_id="m2")
    store.discard(KEY)
    assert sorted(os.listdir(store.directory)) == [f"{OTHER}.json", slot_file(OTHER, 0)]


# -- clearing -----------------------------------------------------------------------------


def test_clear_removes_only_our_files(store: SlotStore) -> None:
    keep(store, KEY, (10, 10))
    keep(store, OTHER, model_id="m2")
    (store.directory / "notes.txt").write_text("not ours")
    (store.directory / f"{KEY}.slot0.bin.bak").write_text("not ours either")
    (store.directory / "sub").mkdir()
    (store.directory / "sub" / slot_file(THIRD, 0)).write_text("in a subdirectory")
    assert store.clear() == 5
    assert sorted(os.listdir(store.directory)) == sorted(
        ["notes.txt", f"{KEY}.slot0.bin.bak", "sub"]
    )
    assert (store.directory / "sub" / slot_file(THIRD, 0)).exists()


def test_clear_leaves_a_subdirectory_named_like_ours(store: SlotStore) -> None:
    """Not a file of ours: neither removed nor a reason to stop clearing the rest."""
    keep(store, KEY)
    (store.directory / slot_file(OTHER, 0)).mkdir()
    (store.directory / f"{THIRD}.json").mkdir()
    assert store.clear() == 2
    assert sorted(os.listdir(store.directory)) == sorted([slot_file(OTHER, 0), f"{THIRD}.json"])


def test_a_subdirectory_named_like_ours_does_not_fail_a_commit(store: SlotStore) -> None:
    (store.directory / f"{THIRD}.json").mkdir()
    (store.directory / slot_file(FOURTH, 0)).mkdir()
    assert keep(store, KEY) == []
    assert isinstance(store.saved(KEY, 1), SavedSet)


def test_discard_leaves_a_subdirectory_named_like_its_files(store: SlotStore) -> None:
    """A save that fails discards its key: a directory in the way must not raise out
    of it (Actor.stop would then never stop the process)."""
    keep(store, KEY, (10, 10))
    (store.directory / slot_file(KEY, 2)).mkdir()
    store.discard(KEY)
    assert os.listdir(store.directory) == [slot_file(KEY, 2)]
    (store.directory / f"{OTHER}.json").mkdir()
    store.discard(OTHER)
    assert (store.directory / f"{OTHER}.json").is_dir()


def test_clear_of_a_missing_directory_is_zero(tmp_path: Path) -> None:
    assert SlotStore(tmp_path / "none", 1).clear() == 0


def test_clear_removes_a_symlink_named_like_ours_not_its_target(
    store: SlotStore, tmp_path: Path
) -> None:
    target = tmp_path / "precious.bin"
    target.write_text("keep me")
    (store.directory / slot_file(KEY, 0)).symlink_to(target)
    assert store.clear() == 1
    assert target.read_text() == "keep me"


def test_slot_file_refuses_a_key_that_is_not_one() -> None:
    for bad in ("../etc", "ABCDEF0123456789", "abc", "a" * 65, f"{KEY}/x"):
        with pytest.raises(ValueError, match="not a cache key"):
            slot_file(bad, 0)
