"""The grant journal: permissions, reopen, atomic writes, corruption set-aside, bounds."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from nomad_plugin.journal import EntryState, Journal, JournalEntry, JournalFull
from nomad_plugin.journal.store import decode, encode
from nomad_plugin.model.grant import DeviceAsk, GrantedDevice


def entry(gid: str = "g-1", state: EntryState = EntryState.GRANTED) -> JournalEntry:
    return JournalEntry(
        grant_id=gid,
        device_ids=(f"{gid}-dev-a", f"{gid}-dev-b"),
        group="alibaba/ppu/PPU 810E",
        kind="whole",
        cards=("C1", "C2"),
        asks=(DeviceAsk(1), DeviceAsk(2)),
        created_at=1700000000.5,
        state=state,
        granted=(GrantedDevice(1, "C1"), GrantedDevice(2, "C2", 0, 0, 0, "")),
    )


def test_dir_0700_file_0600_and_reopen(tmp_path):
    d = tmp_path / "data" / "lj"
    j = Journal(d)
    j.put(entry("a"))
    j.put(entry("b", EntryState.INTENT))
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    assert stat.S_IMODE((d / "journal.json").stat().st_mode) == 0o600
    again = Journal(d)
    assert {e.grant_id: e for e in again.entries()} == {"a": entry("a"), "b": entry("b", EntryState.INTENT)}
    assert again.remove("a") and not again.remove("a")
    assert [e.grant_id for e in Journal(d).entries()] == ["b"]


def test_a_world_writable_dir_is_refused_and_left_as_it_was(tmp_path):
    from nomad_plugin.journal.datadir import DataDirRefused

    d = tmp_path / "lj"
    d.mkdir(mode=0o777)
    os.chmod(d, 0o777)
    with pytest.raises(DataDirRefused, match="writable by other users"):
        Journal(d)
    assert stat.S_IMODE(d.stat().st_mode) == 0o777, "the plugin changed the mode of a directory it did not create"
    assert list(d.iterdir()) == []


def test_entry_round_trip_and_checksum():
    data = encode([entry("a"), entry("b")])
    assert decode(data) == [entry("a"), entry("b")]
    doc = json.loads(data)
    assert doc["version"] == 1 and doc["checksum"].startswith("sha256:")


@pytest.mark.parametrize(
    ("mangle", "reason"),
    [
        (lambda b: b[: len(b) // 2], "not JSON"),
        (lambda b: b.replace(b'"version": 1', b'"version": 2'), "version"),
        (lambda b: b.replace(b"g-1-dev-a", b"g-1-dev-X"), "checksum"),
        (lambda b: b"[]", "top level"),
        (lambda b: b"\xff\xfe", "not JSON"),
    ],
)
def test_corruption_detected_and_set_aside(tmp_path, mangle, reason, caplog):
    j = Journal(tmp_path)
    j.put(entry("g-1"))
    j.compact()  # the entry is in the snapshot (a rename, never torn): any damage there is corruption
    path = tmp_path / "journal.json"
    bad = mangle(path.read_bytes())
    path.write_bytes(bad)
    reopened = Journal(tmp_path)
    assert reopened.entries() == []
    assert reopened.corrupt_set_aside is not None
    assert reopened.corrupt_set_aside.name.startswith("journal.corrupt-")
    assert reopened.corrupt_set_aside.read_bytes() == bad
    assert decode(path.read_bytes()) == []  # a fresh, valid, empty journal
    assert reason in caplog.text


def test_damaged_complete_log_record_is_corruption(tmp_path, caplog):
    j = Journal(tmp_path)
    j.put(entry("g-1"))
    j.put(entry("g-2"))
    path = tmp_path / "journal.json"
    lines = path.read_bytes().split(b"\n")
    assert len(lines) == 4 and lines[-1] == b""  # snapshot, two records, final newline
    bad = b"\n".join([lines[0], lines[1].replace(b"g-1-dev-a", b"g-1-dev-X"), lines[2], b""])
    path.write_bytes(bad)
    reopened = Journal(tmp_path)
    assert reopened.entries() == [] and reopened.corrupt_set_aside is not None
    assert reopened.corrupt_set_aside.read_bytes() == bad
    assert "checksum mismatch" in caplog.text


def test_torn_last_record_is_dropped_and_cut_off(tmp_path, caplog):
    """An append cut short by a crash (no newline) was never acknowledged: drop it, then write past it."""
    j = Journal(tmp_path)
    j.put(entry("a"))
    j.put(entry("b"))
    path = tmp_path / "journal.json"
    whole = path.read_bytes()
    last = len(whole.split(b"\n")[-2])
    for cut in (1, 40, last - 1):
        path.write_bytes(whole[:-cut])
        caplog.clear()
        reopened = Journal(tmp_path)
        assert reopened.corrupt_set_aside is None
        assert [e.grant_id for e in reopened.entries()] == ["a"]
        torn = last + 1 - cut  # what is left of the last record (its newline was cut too)
        assert (
            f"grant journal {path} ends in a partial record ({torn} bytes: an append cut short by a crash, "
            "never acknowledged); ignoring it"
        ) in [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    reopened.put(entry("c"))
    assert path.read_bytes().count(b"\n") == 3, "the partial record was not cut off before appending"
    assert [e.grant_id for e in Journal(tmp_path).entries()] == ["a", "c"]


def test_a_write_appends_one_record_and_compaction_bounds_the_file(tmp_path, monkeypatch):
    from nomad_plugin.journal import store

    monkeypatch.setattr(store, "COMPACT_MIN_RECORDS", 8)
    j = Journal(tmp_path)
    path = tmp_path / "journal.json"
    before = path.stat().st_size
    j.put(entry("a"))
    grew = path.stat().st_size - before
    assert 0 < grew < 1024 and path.read_bytes().count(b"\n") == 2
    for i in range(40):
        j.put(entry(f"x{i}"))
        if i >= 2:
            j.remove(f"x{i - 2}")
    # 79 changes with at most 4 live entries: compacted several times, so the log stays short.
    assert path.read_bytes().count(b"\n") <= 1 + 8
    assert sorted(e.grant_id for e in Journal(tmp_path).entries()) == ["a", "x38", "x39"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["journal.json"]


def test_file_from_an_earlier_version_loads_and_is_rewritten(tmp_path):
    body = [entry("old").to_json()]
    from nomad_plugin.journal.store import _checksum

    old = json.dumps({"version": 1, "checksum": _checksum(body), "entries": body}, sort_keys=True, indent=1)
    (tmp_path / "journal.json").write_text(old)  # the old layout: indented, no newline at the end
    j = Journal(tmp_path)
    assert j.entries() == [entry("old")] and j.corrupt_set_aside is None
    j.put(entry("new"))
    first, *rest = (tmp_path / "journal.json").read_bytes().splitlines()
    assert json.loads(first)["version"] == 1 and len(rest) == 1
    assert [e.grant_id for e in Journal(tmp_path).entries()] == ["old", "new"]


def test_two_instances_see_each_others_writes_and_compactions(tmp_path):
    one, two = Journal(tmp_path), Journal(tmp_path)
    one.put(entry("a"))
    two.put(entry("b"))
    one.put(entry("c"))
    assert [e.grant_id for e in two.entries()] == ["a", "b", "c"]
    two.compact()
    one.remove("b")
    assert two.get("b") is None and len(two) == 2
    two.put(entry("d"))
    assert [e.grant_id for e in one.entries()] == ["a", "c", "d"]


def test_bad_entry_field_is_corruption(tmp_path):
    body = [dict(entry().to_json(), state="weird")]
    from nomad_plugin.journal.store import _checksum

    (tmp_path / "journal.json").write_text(json.dumps({"version": 1, "checksum": _checksum(body), "entries": body}))
    assert Journal(tmp_path).corrupt_set_aside is not None


def test_oversized_journal_is_corruption(tmp_path):
    (tmp_path / "journal.json").write_bytes(b" " * 2048)
    j = Journal(tmp_path, max_bytes=1024)
    assert j.corrupt_set_aside is not None and j.entries() == []


def test_bounded_entries(tmp_path):
    j = Journal(tmp_path, max_entries=2)
    j.put(entry("a"))
    j.put(entry("b"))
    j.put(entry("b", EntryState.RELEASING))  # replacing is fine
    with pytest.raises(JournalFull, match="limit 2"):
        j.put(entry("c"))


def test_stale_temp_files_removed(tmp_path):
    Journal(tmp_path)
    (tmp_path / "journal.json.tmp-1-2").write_text("junk")
    Journal(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["journal.json"]


ROOT = str(Path(__file__).resolve().parents[2])

WRITER = """
import sys
import threading
from nomad_plugin.journal import Journal, store
from tests.reserve.test_journal import entry
store.COMPACT_MIN_RECORDS = int(sys.argv[3])
j = Journal(sys.argv[1], background_compaction=sys.argv[2] == "background")
i = 0
while True:
    j.put(entry(f"g{i}"))
    if i >= 3:
        j.remove(f"g{i-3}")
    print(i, flush=True)
    i += 1
"""


@pytest.mark.parametrize(("mode", "compact_at"), [("inline", 2048), ("inline", 8), ("background", 8)])
def test_sigkill_during_writes_never_leaves_a_torn_journal(tmp_path, mode, compact_at):
    """Kill a writer mid-stream many times; every reopen finds a valid journal.

    Each writer gets its own directory: a second writer starting again at g0
    would never remove what the first left above its own indices (how far a
    killed writer got past the lines read depends on the box's load). With a
    threshold of 8 records the writer compacts every few changes (inline, or
    on its background thread), so the kill lands in and around compactions too.
    """
    for run in range(5):
        data = tmp_path / f"run{run}"
        argv = [sys.executable, "-c", WRITER, str(data), mode, str(compact_at)]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, cwd=ROOT, text=True)
        assert proc.stdout is not None
        for _ in range(20 + 10 * run):
            proc.stdout.readline()
        proc.kill()
        proc.wait()
        j = Journal(data)
        assert j.corrupt_set_aside is None
        # Some state the writer passed through: the last 3 or 4 of g0, g1, ... in a row.
        found = sorted(int(e.grant_id[1:]) for e in j.entries())
        assert 3 <= len(found) <= 4 and found == list(range(found[0], found[0] + len(found))), found


CONCURRENT_WRITER = """
import sys
import threading
from nomad_plugin.journal import Journal, store
from tests.reserve.test_journal import entry
store.COMPACT_MIN_RECORDS = 16
tag = sys.argv[2]
j = Journal(sys.argv[1], background_compaction=tag == "q")
for i in range(120):
    j.put(entry(f"{tag}{i}"))
    if i % 3 == 0:
        j.remove(f"{tag}{i}")
j.close()
"""


def test_two_processes_writing_at_once_lose_no_update(tmp_path):
    """The plugin and the ``grants`` command may write the same journal: every change must survive."""
    Journal(tmp_path)
    procs = [
        subprocess.Popen([sys.executable, "-c", CONCURRENT_WRITER, str(tmp_path), tag], cwd=ROOT) for tag in ("p", "q")
    ]
    for proc in procs:
        assert proc.wait(timeout=300) == 0
    expected = {f"{tag}{i}" for tag in ("p", "q") for i in range(120) if i % 3 != 0}
    j = Journal(tmp_path)
    assert j.corrupt_set_aside is None
    assert {e.grant_id for e in j.entries()} == expected


def test_holders_and_kinds_follow_every_change_including_other_writers(tmp_path):
    one, two = Journal(tmp_path), Journal(tmp_path)
    one.put(entry("a"))
    one.put(dataclasses.replace(entry("b"), kind="share", device_ids=("a-dev-a", "b-only"), cards=("C2",)))
    assert [e.grant_id for e in one.holders("a-dev-a")] == ["a", "b"]
    assert one.kinds_by_card() == {"C1": frozenset({"whole"}), "C2": frozenset({"whole", "share"})}
    one.remove("a")
    assert [e.grant_id for e in one.holders("a-dev-a")] == ["b"] and one.holders("a-dev-b") == []
    assert one.kinds_by_card() == {"C2": frozenset({"share"})}
    generation = two.generation
    assert len(two) == 1  # catches up with what the other instance wrote
    assert two.generation != generation
    assert [e.grant_id for e in two.holders("b-only")] == ["b"]
    assert two.kinds_by_card() == {"C2": frozenset({"share"})}
    two.compact()
    one.put(entry("c"))
    assert len(two) == 2 and [e.grant_id for e in two.holders("c-dev-a")] == ["c"]


def test_kinds_by_card_is_the_same_read_only_object_until_a_card_gains_or_loses_a_kind(tmp_path):
    j = Journal(tmp_path)
    j.put(entry("a"))
    first = j.kinds_by_card()
    with pytest.raises(TypeError):
        first["C9"] = frozenset({"whole"})  # type: ignore[index]
    j.put(dataclasses.replace(entry("b"), device_ids=("b-x",)))  # whole again on C1 and C2: no card's kinds change
    assert j.kinds_by_card() is first
    j.put(dataclasses.replace(entry("c"), kind="share", device_ids=("c-x",), cards=("C2",)))
    second = j.kinds_by_card()
    assert second is not first and second == {"C1": frozenset({"whole"}), "C2": frozenset({"whole", "share"})}
    j.remove("b")  # "a" still holds whole on both cards
    assert j.kinds_by_card() is second
    j.remove("c")  # the last share on C2 leaves
    assert j.kinds_by_card() == {"C1": frozenset({"whole"}), "C2": frozenset({"whole"})}
    other = Journal(tmp_path)
    other.put(dataclasses.replace(entry("d"), kind="mig", device_ids=("d-x",), cards=("C3",)))
    before = j.kinds_by_card()
    assert len(j) == 2  # catching up with another process's write re-reads the view
    assert j.kinds_by_card() is not before and j.kinds_by_card()["C3"] == frozenset({"mig"})


def test_kinds_changes_counts_each_change_of_a_cards_kinds_and_needs_no_lock(tmp_path):
    j = Journal(tmp_path)
    start = j.kinds_changes
    j.put(entry("a"))  # whole is new on C1 and on C2
    assert j.kinds_changes == start + 2
    j.put(dataclasses.replace(entry("b"), device_ids=("b-x",)))
    assert j.kinds_changes == start + 2, "whole again on both cards changes no card's kinds"
    j.put(dataclasses.replace(entry("c"), kind="share", device_ids=("c-x",), cards=("C2",)))
    assert j.kinds_changes == start + 3
    j.remove("b")
    assert j.kinds_changes == start + 3, "a still holds whole on both cards"
    j.remove("c")
    assert j.kinds_changes == start + 4, "the last share left C2"
    other = Journal(tmp_path)
    other.put(dataclasses.replace(entry("d"), kind="mig", device_ids=("d-x",), cards=("C3",)))
    assert len(j) == 2  # catching up with another process's record
    assert j.kinds_changes == start + 5, "mig is new on C3"
    other.remove("a")
    other.remove("d")
    other.compact()  # the file replaced by one that holds nothing
    assert len(j) == 0  # read again whole
    seen = j.kinds_changes
    assert seen == start + 6, "every kind left every card: one change, for the view read again"
    read: list[int] = []
    with j._lock:  # a compaction's locked phase, say
        reader = threading.Thread(target=lambda: read.append(j.kinds_changes))
        reader.start()
        reader.join(5)
    assert read == [seen], "reading the count waited for the journal's lock"


def _corrupt(directory: Path) -> None:
    j = Journal(directory)
    j.put(entry("g-1"))
    (directory / "journal.json").write_bytes(b"{not json")


def test_a_second_corrupt_journal_in_the_same_second_is_kept_beside_the_first(tmp_path, caplog):
    """Set-aside files are named journal.corrupt-<UTC second>[.N] and never overwrite one another."""
    import re
    import time as _time

    _corrupt(tmp_path)
    now = _time.time()
    stamps = [_time.strftime("%Y%m%dT%H%M%SZ", _time.gmtime(now + d)) for d in range(-1, 30)]
    for stamp in stamps:  # an earlier set-aside (and its .1) already holds every second of the run
        (tmp_path / f"journal.corrupt-{stamp}").write_text("older")
        (tmp_path / f"journal.corrupt-{stamp}.1").write_text("older .1")
    with caplog.at_level("ERROR", logger="nomad_plugin.journal.store"):
        j = Journal(tmp_path)
    target = j.corrupt_set_aside
    assert target is not None and j.entries() == []
    match = re.fullmatch(r"journal\.corrupt-(\d{8}T\d{6}Z)\.2", target.name)
    assert match is not None and match.group(1) in stamps, target.name
    assert target.read_bytes() == b"{not json"
    assert all((tmp_path / f"journal.corrupt-{s}").read_text() == "older" for s in stamps)
    assert all((tmp_path / f"journal.corrupt-{s}.1").read_text() == "older .1" for s in stamps)
    [record] = caplog.records
    assert re.fullmatch(
        rf"grant journal {re.escape(str(tmp_path / 'journal.json'))} is corrupt \(.+\); moved to "
        rf"{re.escape(str(target))} and starting empty - grants it held are reported as leaked when a live "
        r"allocation still uses them",
        record.getMessage(),
    ), record.getMessage()


def test_set_aside_name_is_the_utc_second_whatever_the_local_zone(tmp_path):
    import re
    import time as _time

    _corrupt(tmp_path)
    old_tz = os.environ.get("TZ")
    os.environ["TZ"] = "CST-8"  # UTC+8: a local-time stamp would be 8 hours off
    _time.tzset()
    try:
        before = _time.strftime("%Y%m%dT%H%M%SZ", _time.gmtime())
        target = Journal(tmp_path).corrupt_set_aside
        after = _time.strftime("%Y%m%dT%H%M%SZ", _time.gmtime())
    finally:
        if old_tz is None:
            del os.environ["TZ"]
        else:
            os.environ["TZ"] = old_tz
        _time.tzset()
    assert target is not None
    match = re.fullmatch(r"journal\.corrupt-(\d{8}T\d{6}Z)", target.name)
    assert match is not None and before <= match.group(1) <= after, target.name


def test_the_first_clash_gets_suffix_1(tmp_path):
    import time as _time

    _corrupt(tmp_path)
    now = _time.time()
    stamps = [_time.strftime("%Y%m%dT%H%M%SZ", _time.gmtime(now + d)) for d in range(-1, 30)]
    for stamp in stamps:
        (tmp_path / f"journal.corrupt-{stamp}").write_text("older")
    target = Journal(tmp_path).corrupt_set_aside
    assert target is not None and target.name.endswith(".1") and target.name[len("journal.corrupt-") : -2] in stamps


def test_every_field_including_the_late_window_survives_a_reopen(tmp_path):
    from dataclasses import replace

    e = replace(entry("late"), state=EntryState.RELEASING, settle_until=1700000123.25)
    Journal(tmp_path).put(e)
    assert Journal(tmp_path).get("late") == e


def test_full_journal_message_in_full(tmp_path):
    j = Journal(tmp_path, max_entries=1)
    j.put(entry("a"))
    with pytest.raises(JournalFull) as err:
        j.put(entry("b"))
    assert str(err.value) == (
        "the grant journal holds 1 grants (limit 1); "
        "grants are not being released - check the reconciler and the Nomad API"
    )


# --- one sync per Reserve: unsynced appends, sync(), and the sync before a compaction's rename ----------
def _record_syncs(monkeypatch) -> list[tuple[str, str]]:
    """Log every data sync (by file name) and every rename, in order, as the journal makes them."""
    from nomad_plugin.journal import store

    calls: list[tuple[str, str]] = []
    real_sync, real_replace = os.fdatasync, os.replace

    def sync(fd: int) -> None:
        calls.append(("sync", os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))))
        real_sync(fd)

    def replace(src, dst) -> None:
        calls.append(("rename", f"{os.path.basename(src)} -> {os.path.basename(dst)}"))
        real_replace(src, dst)

    monkeypatch.setattr(store.os, "fdatasync", sync)
    monkeypatch.setattr(store.os, "replace", replace)
    return calls


def test_an_unsynced_put_is_read_back_and_synced_by_the_next_sync(tmp_path, monkeypatch):
    j = Journal(tmp_path)
    calls = _record_syncs(monkeypatch)
    j.put(entry("a", EntryState.INTENT), durable=False)
    assert calls == [], "durable=False must not sync"
    assert [e.grant_id for e in Journal(tmp_path).entries()] == ["a"], "the record is in the file all the same"
    j.sync()
    assert calls == [("sync", "journal.json")]
    j.put(entry("a"))
    assert calls == [("sync", "journal.json")] * 2, "a durable put syncs before it returns"
    j.remove("a")
    assert calls == [("sync", "journal.json")] * 3, "a removal syncs before it returns"


def test_a_compaction_syncs_the_temp_file_before_the_rename(tmp_path, monkeypatch):
    """The snapshot must be on disk before it replaces the journal, else a crash can leave an empty journal."""
    j = Journal(tmp_path)
    j.put(entry("a"))
    calls = _record_syncs(monkeypatch)
    j.compact()
    [rename] = [i for i, c in enumerate(calls) if c[0] == "rename"]
    tmp_name = calls[rename][1].split(" -> ")[0]
    assert calls[rename][1].endswith("-> journal.json") and tmp_name.startswith("journal.json.tmp-")
    assert ("sync", tmp_name) in calls[:rename], f"no sync of {tmp_name} before the rename: {calls}"
    assert [e.grant_id for e in Journal(tmp_path).entries()] == ["a"]


# --- grant-id leases (journal/ids.py) ----------------------------------------------------------------------
def _ids(tmp_path, boot="boot-1", block=4):
    from nomad_plugin.journal.ids import GrantIds

    return GrantIds(tmp_path, block=block, boot_id=lambda: boot)


def _leases(tmp_path) -> list[dict]:
    return json.loads((tmp_path / "grant-ids.json").read_text())["leases"]


def test_derived_ids_are_uuid4_shaped_and_differ_by_seed_and_counter():
    import uuid

    from nomad_plugin.journal.ids import derive

    a0, a1, b0 = derive("aa", 0), derive("aa", 1), derive("bb", 0)
    assert len({a0, a1, b0}) == 3 and derive("aa", 0) == a0
    # Pinned: a lease written by one version must name the same ids for the next (start-up release).
    assert a0 == "9b8764f1-4748-41d8-92d8-96e714a021eb"
    for gid in (a0, a1, b0):
        assert uuid.UUID(gid).version == 4 and str(uuid.UUID(gid)) == gid


def test_each_id_is_named_by_a_lease_on_disk_before_it_is_handed_out(tmp_path):
    from nomad_plugin.journal.ids import derive

    ids = _ids(tmp_path, block=4)
    assert not (tmp_path / "grant-ids.json").exists(), "creating a GrantIds does no I/O"
    taken = []
    first = None
    for _ in range(6):
        gid = ids.take()
        if first is None:
            [raw] = _leases(tmp_path)  # 3 of 4 ids left: no second lease yet
            first = _lease(raw)
        named = {g for raw in _leases(tmp_path) for g in _lease(raw).ids()}
        assert gid in named, f"{gid} was handed out before a durable lease named it"
        taken.append(gid)
        ids.settled(gid)
    assert len(set(taken)) == 6
    assert first is not None  # ids are handed out in the lease's order
    assert first.ids() == [derive(first.seed, n) for n in range(first.start, first.end)] == taken[:4]
    assert (tmp_path / "grant-ids.json").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "grant-ids.lock").stat().st_mode & 0o777 == 0o600


def _lease(raw):
    from nomad_plugin.journal.ids import Lease

    return Lease.from_json(raw)


def test_the_next_lease_is_written_ahead_once_half_of_one_is_used(tmp_path):
    import time

    ids = _ids(tmp_path, block=4)
    ids.prepare()
    assert len(_leases(tmp_path)) == 1
    first = ids.take()
    assert len(_leases(tmp_path)) == 1, "3 of 4 ids left: no second lease yet"
    ids.take()  # 2 of 4 left: half used, the next one is written in the background
    deadline = time.monotonic() + 10
    while len(_leases(tmp_path)) < 2:
        assert time.monotonic() < deadline, "the second lease was not written ahead within 10 s"
        time.sleep(0.01)
    ids.settled(first)


def test_a_used_up_lease_leaves_the_file_only_when_none_of_its_ids_is_in_flight(tmp_path):
    ids = _ids(tmp_path, block=2)
    held = ids.take()  # lease 1, still in flight
    ids.settled(ids.take())
    for _ in range(4):  # leases 2 and 3: each switch writes the file
        ids.settled(ids.take())
    seeds = [raw["seed"] for raw in _leases(tmp_path)]
    first = _lease(_leases(tmp_path)[0])
    assert held in first.ids(), "lease 1 is kept while one of its ids is in flight"
    ids.settled(held)
    ids.settled(held)  # twice, or an unknown id: no effect
    # The next lease write (a switch or a prefetch, possibly on its thread) drops lease 1.
    import time

    deadline = time.monotonic() + 10
    while first.seed in [raw["seed"] for raw in _leases(tmp_path)]:
        assert time.monotonic() < deadline, "lease 1 was not dropped within 10 s of its last id settling"
        ids.settled(ids.take())
        time.sleep(0.01)
    assert len(seeds) >= 2


def test_stale_ids_are_those_of_earlier_boots_that_the_journal_does_not_name(tmp_path):
    old = _ids(tmp_path, boot="boot-1", block=3)
    used = old.take()
    lease = _lease(_leases(tmp_path)[0])
    unused = [g for g in lease.ids() if g != used]
    assert _ids(tmp_path, boot="boot-1").stale_ids(lambda g: False) == [], "same boot: the journal is complete"
    now = _ids(tmp_path, boot="boot-2")
    assert now.stale_ids(lambda g: False) == lease.ids()
    assert now.stale_ids(lambda g: g == used) == unused
    assert _ids(tmp_path, boot="").stale_ids(lambda g: False) == lease.ids(), "no boot id: never this boot"


def test_forget_stale_keeps_only_this_process_leases(tmp_path):
    _ids(tmp_path, boot="boot-1").take()
    (tmp_path / "grant-ids.json.tmp-1-2").write_text("left by a crash")
    now = _ids(tmp_path, boot="boot-2")
    now.prepare()
    assert len(_leases(tmp_path)) == 2
    now.forget_stale()
    assert [raw["boot_id"] for raw in _leases(tmp_path)] == ["boot-2"]
    assert not (tmp_path / "grant-ids.json.tmp-1-2").exists()
    _ids(tmp_path, boot="boot-2").forget_stale()  # another process's start: this one's lease goes too
    assert _leases(tmp_path) == []


def test_forget_stale_keeps_a_used_up_lease_whose_id_is_still_in_flight(tmp_path):
    ids = _ids(tmp_path, block=2)
    held = ids.take()
    ids.settled(ids.take())
    ids.settled(ids.take())  # lease 2 now; lease 1 is used up but ``held`` is in flight
    ids.forget_stale()
    named = {g for raw in _leases(tmp_path) for g in _lease(raw).ids()}
    assert held in named


def _flock_waits(monkeypatch):
    """Patch the lease module's ``flock``: returns an event set each time a caller is about to wait on it."""
    import fcntl
    import threading

    from nomad_plugin.journal import ids as ids_mod

    waiting = threading.Event()
    real = fcntl.flock

    def flock(fd, op):
        waiting.set()
        return real(fd, op)

    monkeypatch.setattr(ids_mod.fcntl, "flock", flock)
    return waiting


def _hold_lease_flock(tmp_path):
    """Take the lease file's flock as another process's writer would (its own open file description)."""
    import fcntl

    fd = os.open(tmp_path / "grant-ids.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def test_forget_stale_leaves_a_temp_file_alone_while_another_writer_holds_the_flock(tmp_path, monkeypatch):
    """CI failure: the startup sweep removed a Reserve's temp file between its write and its rename."""
    import threading

    ids = _ids(tmp_path, boot="boot-2")
    ids.prepare()
    fd = _hold_lease_flock(tmp_path)  # before the patch: fcntl.flock is one function for everybody
    waiting = _flock_waits(monkeypatch)
    in_progress = tmp_path / "grant-ids.json.tmp-99999-1"
    in_progress.write_text("another writer's lease list, not yet renamed")
    sweep = threading.Thread(target=ids.forget_stale)
    try:
        sweep.start()
        assert waiting.wait(10), "forget_stale never reached the flock within 10 s"
        assert in_progress.exists(), "forget_stale removed a temp file while its writer held the flock"
    finally:
        os.close(fd)
        sweep.join(10)
    assert not sweep.is_alive(), "forget_stale did not finish within 10 s of the flock being released"
    assert not in_progress.exists(), "under the flock a temp file is a dead writer's, and is swept"
    assert len(_leases(tmp_path)) == 1


def test_a_lease_written_while_forget_stale_runs_is_kept(tmp_path, monkeypatch):
    """The first Reserve may write a lease while the startup thread forgets stale ones: that lease must stay."""
    import threading

    from nomad_plugin.journal import ids as ids_mod

    _ids(tmp_path, boot="boot-1").take()  # a lease of an earlier boot, to be forgotten
    ids = _ids(tmp_path, boot="boot-2")
    sweeping, go_on = threading.Event(), threading.Event()
    real_write = ids_mod.GrantIds._write

    def paused_sweep(self, **kw):
        if kw.get("keep") is not None:  # forget_stale's write: it has chosen which leases to keep
            sweeping.set()
            go_on.wait(10)
        real_write(self, **kw)

    monkeypatch.setattr(ids_mod.GrantIds, "_write", paused_sweep)
    taken: list[str] = []
    sweep = threading.Thread(target=ids.forget_stale)
    reserve = threading.Thread(target=lambda: taken.append(ids.take()))
    try:
        sweep.start()
        assert sweeping.wait(10), "forget_stale never reached its write within 10 s"
        reserve.start()  # the first take() writes this process's first lease
        reserve.join(0.5)  # the window in which a take() could slip in; it must wait for the sweep instead
    finally:
        go_on.set()
        sweep.join(10)
        reserve.join(10)
    assert not sweep.is_alive() and not reserve.is_alive(), "forget_stale or take() hung"
    leases = _leases(tmp_path)
    assert len(leases) == 1 and leases[0]["boot_id"] == "boot-2" and taken[0] in _lease(leases[0]).ids(), (
        f"the lease naming the id {taken} handed out was dropped or the old one kept: {leases}"
    )


def test_forget_stale_waits_for_a_lease_being_written_ahead(tmp_path, monkeypatch):
    """A prefetch that has written its lease but not yet published it must not lose the lease to forget_stale."""
    import threading

    from nomad_plugin.journal import ids as ids_mod

    ids = _ids(tmp_path, block=4)
    ids.prepare()
    written = threading.Event()
    go_on = threading.Event()
    real_write = ids_mod.GrantIds._write

    def slow_prefetch_write(self, **kw):
        real_write(self, **kw)
        if threading.current_thread().name == "grant-ids-lease":
            written.set()
            go_on.wait(10)

    monkeypatch.setattr(ids_mod.GrantIds, "_write", slow_prefetch_write)
    ids.take()
    ids.take()  # half used: the next lease is written ahead, and pauses before it is published
    assert written.wait(10), "no lease was written ahead within 10 s"
    sweep = threading.Thread(target=ids.forget_stale)
    sweep.start()
    go_on.set()
    sweep.join(10)
    assert not sweep.is_alive(), "forget_stale hung"
    assert len(_leases(tmp_path)) == 2, f"the lease written ahead was dropped: {_leases(tmp_path)}"
    for _ in range(3):
        gid = ids.take()
        assert gid in {g for raw in _leases(tmp_path) for g in _lease(raw).ids()}


def test_a_failed_prefetch_is_logged_and_the_next_lease_is_written_when_needed(tmp_path, monkeypatch, caplog):
    import time

    from nomad_plugin.journal import ids as ids_mod

    ids = _ids(tmp_path, block=4)
    ids.prepare()
    real_replace = os.replace

    def refuse(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ids_mod.os, "replace", refuse)
    ids.take()
    ids.take()  # half used: the prefetch starts and fails
    want = "writing the next grant-id lease failed; the Reserve that needs it writes it"
    deadline = time.monotonic() + 10
    while want not in [r.getMessage() for r in caplog.records]:
        assert time.monotonic() < deadline, "the failed prefetch was not logged within 10 s"
        time.sleep(0.01)
    monkeypatch.setattr(ids_mod.os, "replace", real_replace)
    seeds = {raw["seed"] for raw in _leases(tmp_path)}
    taken = [ids.take()]  # 1 of 4 left: a failed prefetch does not stop the next one
    while {raw["seed"] for raw in _leases(tmp_path)} == seeds:
        assert time.monotonic() < deadline + 10, "no lease was written ahead again after a failed one"
        time.sleep(0.01)
    taken += [ids.take() for _ in range(3)]
    named = {g for raw in _leases(tmp_path) for g in _lease(raw).ids()}
    assert set(taken) <= named


def test_leases_are_written_ahead_used_and_dropped_round_after_round(tmp_path):
    import time

    ids = _ids(tmp_path, block=4)
    ids.prepare()
    for round_ in range(4):
        ids.settled(ids.take())
        before = {raw["seed"] for raw in _leases(tmp_path)}  # 3 of 4 left: nothing written ahead yet
        ids.settled(ids.take())
        deadline = time.monotonic() + 10
        while {raw["seed"] for raw in _leases(tmp_path)} <= before:  # half used: the next one is written ahead
            assert time.monotonic() < deadline, f"round {round_}: no lease written ahead within 10 s"
            time.sleep(0.01)
        for _ in range(2):
            ids.settled(ids.take())
    # The prefetched leases were the ones used, and used-up ones left: the file does not grow.
    assert len(_leases(tmp_path)) <= 3, _leases(tmp_path)


def _lease_body(**over) -> bytes:
    lease = {"seed": "s", "start": 0, "end": 1, "boot_id": "b", **over}
    return json.dumps({"version": 1, "leases": [lease]}).encode()


@pytest.mark.parametrize(
    "body, why",
    [
        (b"not json", "Expecting value: line 1 column 1 (char 0)"),
        (b'{"version": 2, "leases": []}', "version 2"),
        (b"[]", "version []"),
        (b'{"version": 1, "leases": {}}', "'leases' is not a list"),
        (b'{"version": 1, "leases": [1]}', "lease 1 is not an object"),
        (_lease_body(seed=""), "lease seed '' is not a non-empty string"),
        (_lease_body(seed=5), "lease seed 5 is not a non-empty string"),
        (_lease_body(start=2), "lease range 2..1 is not 0 <= start <= end"),
        (_lease_body(start=-1), "lease range -1..1 is not 0 <= start <= end"),
        (_lease_body(start="0"), "lease range '0'..1 is not 0 <= start <= end"),
        (_lease_body(end="1"), "lease range 0..'1' is not 0 <= start <= end"),
        (_lease_body(boot_id=3), "lease boot_id 3 is not a string"),
    ],
)
def test_a_damaged_lease_file_is_refused_naming_it(tmp_path, body, why):
    (tmp_path / "grant-ids.json").write_bytes(body)
    ids = _ids(tmp_path)
    with pytest.raises(OSError) as err:
        ids.take()
    assert str(err.value) == f"grant-id lease file {tmp_path / 'grant-ids.json'} is unreadable: {why}"
    with pytest.raises(OSError):
        ids.stale_ids(lambda g: False)


def test_a_lease_reads_back_as_written_and_edge_ranges_are_valid(tmp_path):
    from nomad_plugin.journal.ids import Lease

    lease = Lease("s", 0, 0, "b")
    assert Lease.from_json(lease.to_json()) == lease and lease.ids() == []
    assert Lease.from_json({"seed": "s", "start": 3, "end": 3, "boot_id": ""}).boot_id == ""
    (tmp_path / "grant-ids.json").write_bytes(_lease_body(start=1, end=3))
    from nomad_plugin.journal.ids import derive

    assert _ids(tmp_path, boot="other").stale_ids(lambda g: False) == [derive("s", 1), derive("s", 2)]


def test_a_lease_needs_at_least_two_ids(tmp_path):
    with pytest.raises(ValueError) as err:
        _ids(tmp_path, block=1)
    assert str(err.value) == "block: 1 ids per lease; at least 2"
    ids = _ids(tmp_path, block=2)
    ids.prepare()
    assert [(raw["start"], raw["end"]) for raw in _leases(tmp_path)] == [(0, 2)]


def test_the_boot_id_comes_from_the_kernel(tmp_path):
    from nomad_plugin.journal.ids import read_boot_id

    assert read_boot_id() == Path("/proc/sys/kernel/random/boot_id").read_text().strip() != ""
    assert read_boot_id(str(tmp_path / "absent")) == ""


# --- every rejection, in full (mutation testing: a reason nobody reads is a reason nobody checks) ------------
def _full(**over):
    raw = entry("g-1").to_json()
    raw.update(over)
    return raw


@pytest.mark.parametrize(
    "raw, message",
    [
        ([1], "entry is list, not an object"),
        ({k: v for k, v in _full().items() if k != "group"}, "field 'group' missing"),
        (_full(group=5), "field 'group' = 5 is not a string"),
        (_full(created_at="x"), "field 'created_at' = 'x' is not a number"),
        (_full(created_at=True), "field 'created_at' = True is not a number"),
        (
            _full(asks=[{"minor": "1", "core": 0, "memory_gib": 0, "slices": 0}]),
            "field 'minor' = '1' is not an integer",
        ),
        (
            _full(asks=[{"minor": False, "core": 0, "memory_gib": 0, "slices": 0}]),
            "field 'minor' = False is not an integer",
        ),
        (_full(cards="C1"), "field 'cards' = 'C1' is not a list of strings"),
        (_full(cards=["C1", 2]), "field 'cards' = ['C1', 2] is not a list of strings"),
        (_full(asks={"minor": 1}), "field 'asks' is not a list of objects"),
        (_full(asks=[1]), "field 'asks' is not a list of objects"),
        (_full(state="gone"), "field 'state' = 'gone' is not one of intent/granted/releasing"),
    ],
)
def test_each_malformed_entry_is_refused_naming_the_field(raw, message):
    with pytest.raises(ValueError) as err:
        JournalEntry.from_json(raw)
    assert str(err.value) == message


def test_every_field_of_an_entry_survives_the_round_trip():
    e = dataclasses.replace(
        entry("g-9"),
        asks=(DeviceAsk(3, core=20, memory_gib=18, slices=0), DeviceAsk(4, core=0, memory_gib=10, slices=2)),
        granted=(GrantedDevice(3, "C3", 20, 18, 0, ""), GrantedDevice(4, "C4", 0, 10, 2, "MIG-x")),
        settle_until=17.5,
    )
    assert JournalEntry.from_json(json.loads(json.dumps(e.to_json()))) == e
    old = e.to_json()
    del old["settle_until"]  # written by versions without the late-grant window
    assert JournalEntry.from_json(old).settle_until == 0.0


def _snapshot_doc(body) -> bytes:
    return (json.dumps(body) + "\n").encode()


@pytest.mark.parametrize(
    "data, message",
    [
        (b"[]\n", "top level is not an object"),
        (_snapshot_doc({"version": 2, "entries": [], "checksum": ""}), "version 2, expected 1"),
        (_snapshot_doc({"version": 1, "entries": {}, "checksum": ""}), "'entries' is not a list"),
        (_snapshot_doc({"version": 1, "entries": [], "checksum": "sha256:00"}), "checksum mismatch"),
        (encode([]).rstrip(b"\n") + b" x", "extra data after the snapshot"),
    ],
)
def test_each_damaged_snapshot_is_refused_with_its_reason(data, message):
    from nomad_plugin.journal.store import JournalCorrupt

    with pytest.raises(JournalCorrupt) as err:
        decode(data)
    assert str(err.value) == message


def test_a_bad_or_duplicate_snapshot_entry_is_named_by_its_index():
    from nomad_plugin.journal.store import JournalCorrupt, _snapshot_bytes

    good = json.dumps(entry("a").to_json(), sort_keys=True, separators=(",", ":"))
    with pytest.raises(JournalCorrupt) as err:
        decode(_snapshot_bytes([good, good]))
    assert str(err.value) == "entry 1: duplicate grant id a"
    with pytest.raises(JournalCorrupt) as err:
        decode(_snapshot_bytes([good, '{"grant_id":"b"}']))
    assert str(err.value) == "entry 1: field 'device_ids' missing"


def _with_records(*records: bytes) -> bytes:
    return encode([entry("a")]) + b"".join(records)


@pytest.mark.parametrize(
    "record, message",
    [
        (b"nope\n", "not JSON"),
        (b'["put",{}]\n', "not a [op, payload, checksum] record"),
        (b"5\n", "not a [op, payload, checksum] record"),
        (b'{"a":1}\n', "not a [op, payload, checksum] record"),
        (b'["zap",1,"x"]\n', "not a [op, payload, checksum] record"),
    ],
)
def test_a_bad_record_is_named_by_its_byte_offset(record, message):
    from nomad_plugin.journal.store import JournalCorrupt

    data = _with_records(record)
    with pytest.raises(JournalCorrupt) as err:
        decode(data)
    assert str(err.value).startswith(f"record at byte {len(encode([entry('a')]))}: {message}"), str(err.value)


def test_a_del_of_a_non_id_and_a_put_of_a_bad_entry_are_named():
    from nomad_plugin.journal.store import JournalCorrupt, _record_bytes

    offset = len(encode([entry("a")]))
    with pytest.raises(JournalCorrupt) as err:
        decode(_with_records(_record_bytes("del", "5")))
    assert str(err.value) == f"record at byte {offset}: 'del' names 5, not a grant id"
    with pytest.raises(JournalCorrupt) as err:
        decode(_with_records(_record_bytes("put", '{"grant_id":"b"}')))
    assert str(err.value) == f"record at byte {offset}: field 'device_ids' missing"


def test_leading_whitespace_and_blank_lines_are_tolerated(tmp_path):
    from nomad_plugin.journal.store import _record_bytes

    put_b = _record_bytes("put", json.dumps(entry("b").to_json(), sort_keys=True, separators=(",", ":")))
    assert [e.grant_id for e in decode(b"\n " + _with_records(b"\n", put_b))] == ["a", "b"]
    # A reader catching up with appended bytes that start with a blank line.
    j = Journal(tmp_path)
    j.put(entry("a"))
    with open(tmp_path / "journal.json", "ab") as fh:
        fh.write(b"\n" + put_b)
    assert sorted(e.grant_id for e in j.entries()) == ["a", "b"]


def test_a_clean_journal_reports_no_partial_record(tmp_path, caplog):
    j = Journal(tmp_path)
    j.put(entry("a"))
    Journal(tmp_path)
    assert "partial record" not in caplog.text


def test_short_reads_are_continued_and_end_of_file_stops(tmp_path, monkeypatch):
    from nomad_plugin.journal import store

    j = Journal(tmp_path)
    j.put(entry("a"))
    j.put(entry("b"))
    j.remove("a")
    real_pread = os.pread
    monkeypatch.setattr(store.os, "pread", lambda fd, n, off: real_pread(fd, min(n, 1), off))  # POSIX allows it
    assert [e.grant_id for e in Journal(tmp_path).entries()] == ["b"]
    fd = os.open(tmp_path / "journal.json", os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        assert store._read_from(fd, 0, size + 10) == (tmp_path / "journal.json").read_bytes()  # EOF: what is there
        assert store._read_from(fd, size - 1, 1) == b"\n"
    finally:
        os.close(fd)


def test_compaction_happens_exactly_when_the_log_reaches_the_threshold(tmp_path):
    from nomad_plugin.journal.store import COMPACT_MIN_RECORDS

    def lines() -> int:
        return len((tmp_path / "journal.json").read_bytes().splitlines())

    j = Journal(tmp_path)
    for i in range(COMPACT_MIN_RECORDS - 1):
        j.put(entry(f"g{i}"))
    assert lines() == COMPACT_MIN_RECORDS, f"snapshot + {COMPACT_MIN_RECORDS - 1} records: not compacted yet"
    # Counted across a reopen: the records read back count towards the threshold.
    again = Journal(tmp_path)
    again.put(entry("last"))
    assert lines() == 1, f"record number {COMPACT_MIN_RECORDS} compacts the log into one snapshot"
    assert len(Journal(tmp_path).entries()) == COMPACT_MIN_RECORDS


# --- background compaction (the plugin's journal) ------------------------------------------------------
def _wait_for(condition, what, seconds=10.0):
    import time

    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"not within {seconds} s: {what}"
        time.sleep(0.005)


def _lines(directory) -> list[bytes]:
    return (directory / "journal.json").read_bytes().splitlines()


def _paused_compactor(monkeypatch):
    """Pause the background compactor after it synced its snapshot: (paused, resume) events."""
    import threading

    from nomad_plugin.journal import store

    paused, resume = threading.Event(), threading.Event()
    real_sync = store._sync

    def sync(fd):
        real_sync(fd)
        if threading.current_thread().name == "journal-compact" and not paused.is_set():
            paused.set()
            assert resume.wait(10), "the test never resumed the compactor"

    monkeypatch.setattr(store, "_sync", sync)
    return paused, resume


def _compaction_under_way(tmp_path, monkeypatch):
    """A background-compacting journal whose compaction of g0..g7 is paused after its snapshot sync: (j, resume)."""
    from nomad_plugin.journal import store

    monkeypatch.setattr(store, "COMPACT_MIN_RECORDS", 8)
    paused, resume = _paused_compactor(monkeypatch)
    j = Journal(tmp_path, background_compaction=True)
    for i in range(8):
        j.put(entry(f"g{i}"))
    assert paused.wait(10), "the compactor never synced its snapshot"
    return j, resume


def _problems(caplog) -> list[str]:
    import logging

    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_background_compaction_happens_off_the_writing_thread_and_keeps_every_entry(tmp_path, monkeypatch, caplog):
    import threading

    from nomad_plugin.journal import store

    monkeypatch.setattr(store, "COMPACT_MIN_RECORDS", 8)
    j = Journal(tmp_path, background_compaction=True)
    compacted_by: list[str] = []
    real = Journal._compact_beside_writers

    def spy(self):
        compacted_by.append(threading.current_thread().name)
        return real(self)

    monkeypatch.setattr(Journal, "_compact_beside_writers", spy)
    monkeypatch.setattr(Journal, "_compact", lambda self: pytest.fail("an inline compaction in background mode"))
    for i in range(8):
        j.put(entry(f"g{i}"))
    _wait_for(lambda: len(_lines(tmp_path)) == 1, "the 8th record compacted into one snapshot line")
    assert compacted_by and set(compacted_by) == {"journal-compact"}
    assert sorted(e.grant_id for e in Journal(tmp_path).entries()) == [f"g{i}" for i in range(8)]
    assert (tmp_path / "journal.json").stat().st_mode & 0o777 == 0o600
    j.put(entry("g8"))
    assert len(_lines(tmp_path)) == 2, "after a compaction, a change is one record after the snapshot"
    j.close()  # waits for the compactor
    assert _problems(caplog) == [], "a compaction that went well logs no warning or error"
    assert not [t for t in threading.enumerate() if t.name == "journal-compact"], "close() stops the compactor"


def test_records_appended_while_the_snapshot_is_synced_follow_it_in_the_new_file(tmp_path, monkeypatch, caplog):
    j, resume = _compaction_under_way(tmp_path, monkeypatch)
    j.put(entry("late"))  # the writer is not held up by the compaction under way
    j.remove("g0")
    j.put(dataclasses.replace(entry("g1"), state=EntryState.RELEASING))
    resume.set()
    _wait_for(lambda: len(_lines(tmp_path)) == 4, "the snapshot and the 3 records appended meanwhile")
    expected = {f"g{i}" for i in range(1, 8)} | {"late"}
    again = Journal(tmp_path)
    assert {e.grant_id for e in again.entries()} == expected
    assert again.get("g1").state is EntryState.RELEASING
    assert {e.grant_id for e in j.entries()} == expected
    j.put(entry("next"))  # appends after the tail, in the new file
    assert {e.grant_id for e in Journal(tmp_path).entries()} == expected | {"next"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["journal.json"], "no temp file left"
    j.close()
    assert _problems(caplog) == []


@pytest.mark.parametrize("meanwhile", ["another process compacts", "a new journal sweeps temp files"])
def test_a_compaction_that_loses_its_file_or_temp_file_meanwhile_gives_up_and_loses_nothing(
    tmp_path, monkeypatch, meanwhile, caplog
):
    import logging

    from nomad_plugin.journal import store

    caplog.set_level(logging.DEBUG, logger="nomad_plugin.journal.store")

    monkeypatch.setattr(store, "COMPACT_MIN_RECORDS", 8)
    paused, resume = _paused_compactor(monkeypatch)
    j = Journal(tmp_path, background_compaction=True)
    other = Journal(tmp_path) if meanwhile == "another process compacts" else None
    for i in range(8):
        j.put(entry(f"g{i}"))
    assert paused.wait(10), "the compactor never synced its snapshot"
    if other is not None:  # opened before: nothing swept, the file is replaced under the compactor
        other.put(entry("other"))
        other.put(entry("other-2"))
        other.compact()
        assert list(tmp_path.glob("journal.json.tmp-*")), "the compactor's temp file is still there"
    else:
        other = Journal(tmp_path)  # its construction sweeps temp files (under the flock)
        assert not list(tmp_path.glob("journal.json.tmp-*")), "the new journal swept the compactor's temp file"
    resume.set()
    gave_up = "grant journal changed hands during a compaction; the next change compacts again"
    _wait_for(lambda: gave_up in [r.getMessage() for r in caplog.records], "the compactor giving up (debug line)")
    _wait_for(lambda: not list(tmp_path.glob("journal.json.tmp-*")), "no temp file left")
    expected = {f"g{i}" for i in range(8)} | (
        {"other", "other-2"} if meanwhile == "another process compacts" else set()
    )
    assert {e.grant_id for e in Journal(tmp_path).entries()} == expected
    assert {e.grant_id for e in j.entries()} == expected
    j.put(entry("after"))  # still wanted: this change compacts (or is a record after the other's snapshot)
    _wait_for(lambda: {e.grant_id for e in Journal(tmp_path).entries()} == expected | {"after"}, "the change after it")
    j.close()
    other.close()
    assert _problems(caplog) == [], "giving up is not a failure"


def test_a_failed_background_compaction_is_logged_and_retried_by_the_next_change(tmp_path, monkeypatch, caplog):
    from nomad_plugin.journal import store

    monkeypatch.setattr(store, "COMPACT_MIN_RECORDS", 8)
    failures = []
    real_replace = store.os.replace

    def refuse_once(src, dst):
        if not failures:
            failures.append(src)
            raise OSError(28, "No space left on device")
        return real_replace(src, dst)

    j = Journal(tmp_path, background_compaction=True)  # creating the file renames one into place
    monkeypatch.setattr(store.os, "replace", refuse_once)
    for i in range(8):
        j.put(entry(f"g{i}"))
    message = (
        "grant journal compaction failed ([Errno 28] No space left on device); the log keeps growing until it succeeds"
    )
    _wait_for(lambda: message in [r.getMessage() for r in caplog.records], "the failure's warning")
    assert len(_lines(tmp_path)) == 9 and not list(tmp_path.glob("journal.json.tmp-*"))
    j.put(entry("g8"))
    _wait_for(lambda: len(_lines(tmp_path)) == 1, "the next change's compaction")
    assert {e.grant_id for e in Journal(tmp_path).entries()} == {f"g{i}" for i in range(9)}
    j.close()


def test_an_unexpected_error_in_a_background_compaction_is_logged_with_its_traceback(tmp_path, monkeypatch, caplog):
    from nomad_plugin.journal import store

    monkeypatch.setattr(store, "COMPACT_MIN_RECORDS", 8)
    real = store._snapshot_bytes
    calls: list[int] = []

    def broken_once(entries):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("boom")
        return real(entries)

    j = Journal(tmp_path, background_compaction=True)  # creating the file encodes an empty snapshot
    monkeypatch.setattr(store, "_snapshot_bytes", broken_once)
    for i in range(8):
        j.put(entry(f"g{i}"))
    message = "grant journal compaction failed; the log keeps growing until it succeeds"
    _wait_for(lambda: message in [r.getMessage() for r in caplog.records], "the error line")
    [record] = [r for r in caplog.records if r.getMessage() == message]
    assert record.exc_info is not None and "boom" in str(record.exc_info[1])
    j.put(entry("g8"))
    _wait_for(lambda: len(_lines(tmp_path)) == 1, "the next change's compaction")
    j.close()


def test_stop_background_returns_after_its_timeout_while_a_compaction_is_under_way(tmp_path, monkeypatch):
    import time

    j, resume = _compaction_under_way(tmp_path, monkeypatch)
    started = time.monotonic()
    j.stop_background(timeout=0.2)
    waited = time.monotonic() - started
    resume.set()
    assert waited < 5, f"stop_background waited {waited:.1f} s for a compaction it was told to wait 0.2 s for"
    j.close()


EXITING_WRITER = """
import sys, time
from nomad_plugin.journal import Journal, store
from tests.reserve.test_journal import entry
store.COMPACT_MIN_RECORDS = 8
j = Journal(sys.argv[1], background_compaction=True)
for i in range(8):
    j.put(entry(f"g{i}"))
deadline = time.monotonic() + 10
while len((j.dir / "journal.json").read_bytes().splitlines()) > 1:
    assert time.monotonic() < deadline, "no background compaction within 10 s"
    time.sleep(0.01)
print("compacted", flush=True)
"""


def test_a_process_that_never_closes_its_journal_still_exits(tmp_path):
    """The compactor thread is a daemon: it waits for work forever and must not keep the process alive."""
    proc = subprocess.run(
        [sys.executable, "-c", EXITING_WRITER, str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "compacted", proc.stderr


def test_stop_background_falls_back_to_inline_compaction(tmp_path, monkeypatch):
    from nomad_plugin.journal import store

    monkeypatch.setattr(store, "COMPACT_MIN_RECORDS", 8)
    j = Journal(tmp_path, background_compaction=True)
    j.put(entry("g0"))
    j.stop_background(timeout=5)
    for i in range(1, 8):
        j.put(entry(f"g{i}"))
    assert len(_lines(tmp_path)) == 1, "the 8th record compacted at once, in the writing thread"
    j.close()


def test_a_failed_compaction_is_logged_and_the_change_is_kept(tmp_path, monkeypatch, caplog):
    from nomad_plugin.journal import store

    j = Journal(tmp_path)
    for i in range(store.COMPACT_MIN_RECORDS - 1):
        j.put(entry(f"g{i}"))

    def refuse(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store.os, "replace", refuse)
    j.put(entry("last"))  # its record is durable; only the compaction failed
    assert (
        "grant journal compaction failed ([Errno 28] No space left on device); "
        "the log keeps growing until it succeeds" in [r.getMessage() for r in caplog.records]
    )
    monkeypatch.undo()
    assert len(Journal(tmp_path).entries()) == store.COMPACT_MIN_RECORDS


def test_a_failed_append_is_cut_back_and_its_error_raised(tmp_path, monkeypatch, caplog):
    from nomad_plugin.journal import store

    j = Journal(tmp_path)
    j.put(entry("a"))
    size = (tmp_path / "journal.json").stat().st_size
    real_write = os.write

    def half_then_full(fd, data):
        real_write(fd, bytes(data)[: len(data) // 2])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store.os, "write", half_then_full)
    with pytest.raises(OSError) as err:
        j.put(entry("b"))
    assert err.value.errno == 28
    assert (tmp_path / "journal.json").stat().st_size == size, "the half-written record was cut off"
    # The cut fails too: the append's own error still surfaces, and the log says what happened.
    monkeypatch.setattr(store.os, "ftruncate", lambda fd, n: (_ for _ in ()).throw(OSError(5, "I/O error")))
    with pytest.raises(OSError) as err:
        j.put(entry("c"))
    assert err.value.errno == 28
    assert "could not cut a failed journal append back; the next load drops it" in [
        r.getMessage() for r in caplog.records
    ]
    monkeypatch.undo()
    assert [e.grant_id for e in Journal(tmp_path).entries()] == ["a"], "the partial record is dropped on load"


def test_a_failed_snapshot_write_leaves_no_temp_file_and_raises(tmp_path, monkeypatch):
    from nomad_plugin.journal import store

    j = Journal(tmp_path)
    j.put(entry("a"))
    real_write = os.write

    def no_space_for_temp(fd, data):
        if ".tmp-" in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(28, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(store.os, "write", no_space_for_temp)
    with pytest.raises(OSError) as err:
        j.compact()
    assert err.value.errno == 28
    assert not list(tmp_path.glob("journal.json.tmp-*"))
    monkeypatch.undo()
    assert [e.grant_id for e in Journal(tmp_path).entries()] == ["a"]


@pytest.mark.parametrize("change", ["put", "remove", "compact"])
def test_a_journal_file_deleted_under_a_writer_is_written_back_whole(tmp_path, change):
    j = Journal(tmp_path)
    j.put(entry("a"))
    j.put(entry("b"))
    (tmp_path / "journal.json").unlink()
    if change == "put":
        j.put(entry("c"))
        want = ["a", "b", "c"]
    elif change == "remove":
        j.remove("b")
        want = ["a"]
    else:
        j.compact()
        want = ["a", "b"]
    assert sorted(e.grant_id for e in Journal(tmp_path).entries()) == want


def test_the_generation_never_repeats_across_own_writes_and_catching_up(tmp_path):
    one, two = Journal(tmp_path), Journal(tmp_path)
    seen = [one.generation]
    one.put(entry("a"))
    seen.append(one.generation)
    one.put(entry("b"))
    seen.append(one.generation)
    two.put(entry("c"))
    len(one)  # catch up
    seen.append(one.generation)
    one.remove("a")
    seen.append(one.generation)
    one.remove("b")
    seen.append(one.generation)
    for name in ("d", "e"):  # another process compacts: the file is replaced and read again whole
        two.put(entry(name))
        two.compact()
        len(one)
        seen.append(one.generation)
    assert len(set(seen)) == len(seen), seen


def test_kinds_by_card_counts_every_entry_on_a_card(tmp_path):
    j = Journal(tmp_path)
    j.put(entry("a"))
    j.put(entry("b"))  # the same cards C1, C2, the same kind
    j.remove("a")
    assert j.kinds_by_card() == {"C1": frozenset({"whole"}), "C2": frozenset({"whole"})}
    j.remove("b")
    assert j.kinds_by_card() == {}


def test_close_is_idempotent_and_closes_both_descriptors(tmp_path):
    j = Journal(tmp_path)
    fds = (j._fd, j._dir_fd)
    j.close()
    for fd in fds:
        with pytest.raises(OSError):
            os.fstat(fd)
    j.close()


def _fds_into(path):
    """This process's descriptors open on ``path`` or on a file inside it."""
    out = []
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor is gone by now
            target = os.readlink(f"/proc/self/fd/{name}")
            if target == str(path) or target.startswith(f"{path}/"):
                out.append(target)
    return sorted(out)


def test_a_journal_dropped_without_close_releases_its_descriptors(tmp_path):
    # A reference cycle, as an exception's traceback makes in real code: only
    # the cyclic GC frees it, and the finalizer is what closes the descriptors.
    j = Journal(tmp_path / "d")
    j.put(entry("a"))
    j.self_ref = j
    assert _fds_into(tmp_path / "d") == sorted([str(tmp_path / "d"), str(tmp_path / "d" / "journal.json")])
    del j
    gc.collect()
    assert _fds_into(tmp_path / "d") == []


def test_only_one_lease_is_written_ahead_at_a_time_on_a_daemon_thread(tmp_path, monkeypatch):
    import threading
    import time

    from nomad_plugin.journal import ids as ids_mod

    ids = _ids(tmp_path, block=8)
    ids.prepare()
    gate = threading.Event()
    real_replace = os.replace

    def slow_replace(src, dst):
        assert gate.wait(30), "the test never opened the gate"
        real_replace(src, dst)

    monkeypatch.setattr(ids_mod.os, "replace", slow_replace)
    for _ in range(3):
        ids.settled(ids.take())  # 5 of 8 left: nothing ahead yet
    assert [t for t in threading.enumerate() if t.name == "grant-ids-lease"] == []
    for _ in range(3):
        ids.settled(ids.take())  # 4, 3, 2 left: one write ahead, held at the gate
    writers = [t for t in threading.enumerate() if t.name == "grant-ids-lease"]
    assert len(writers) == 1 and writers[0].daemon, writers
    gate.set()
    writers[0].join(30)
    assert len(_leases(tmp_path)) == 2
    taken = [ids.take() for _ in range(3)]  # the 9th id comes from the lease written ahead
    named = {g for raw in _leases(tmp_path) for g in _lease(raw).ids()}
    assert set(taken) <= named and len(_leases(tmp_path)) == 2, _leases(tmp_path)
    deadline = time.monotonic() + 10
    while any(t.name == "grant-ids-lease" and t.is_alive() for t in threading.enumerate()):
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_compactions_do_not_leak_file_descriptors(tmp_path):
    j = Journal(tmp_path)
    j.put(entry("a"))
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(3):
        j.compact()
    assert len(os.listdir("/proc/self/fd")) == before


def test_a_reader_does_not_write_back_a_deleted_journal(tmp_path):
    j = Journal(tmp_path)
    j.put(entry("a"))
    (tmp_path / "journal.json").unlink()
    assert [e.grant_id for e in j.entries()] == ["a"] and len(j) == 1 and j.get("a") is not None
    assert not (tmp_path / "journal.json").exists(), "only a writer puts the file back"


def test_a_reader_catches_up_with_another_process_compaction(tmp_path):
    one, two = Journal(tmp_path), Journal(tmp_path)
    two.put(entry("x"))
    two.put(entry("y"))
    two.compact()  # a new file (inode)
    assert sorted(e.grant_id for e in one.entries()) == ["x", "y"]


def test_records_read_from_another_process_count_towards_compaction(tmp_path):
    from nomad_plugin.journal.store import COMPACT_MIN_RECORDS

    one, two = Journal(tmp_path), Journal(tmp_path)
    for i in range(100):
        one.put(entry(f"a{i}"))
    len(two)  # catches up 100 records
    for i in range(COMPACT_MIN_RECORDS - 101):
        one.put(entry(f"b{i}"))
    len(two)  # and 155 more: 255 in all
    assert len((tmp_path / "journal.json").read_bytes().splitlines()) == COMPACT_MIN_RECORDS
    two.put(entry("last"))  # the 256th record: compacted by the process that wrote it
    assert len((tmp_path / "journal.json").read_bytes().splitlines()) == 1


def test_the_size_bound_is_inclusive_and_named(tmp_path, caplog):
    j = Journal(tmp_path)
    j.put(entry("a"))
    size = (tmp_path / "journal.json").stat().st_size
    assert [e.grant_id for e in Journal(tmp_path, max_bytes=size).entries()] == ["a"]
    smaller = Journal(tmp_path, max_bytes=size - 1)
    assert smaller.entries() == [] and smaller.corrupt_set_aside is not None
    assert f"{size} bytes, over the {size - 1}-byte bound" in caplog.text


def test_snapshot_reads_without_writing(tmp_path):
    from nomad_plugin.journal.store import JournalCorrupt

    assert Journal.snapshot(tmp_path / "absent") == [] and not (tmp_path / "absent").exists()
    j = Journal(tmp_path)
    j.put(entry("a"))
    before = (tmp_path / "journal.json").read_bytes()
    assert [e.grant_id for e in Journal.snapshot(tmp_path)] == ["a"]
    assert (tmp_path / "journal.json").read_bytes() == before
    (tmp_path / "journal.json").write_bytes(b"nope")
    with pytest.raises(JournalCorrupt):
        Journal.snapshot(tmp_path)
    assert (tmp_path / "journal.json").read_bytes() == b"nope", "a damaged journal is not set aside by a reader"


def test_when_no_lease_could_be_written_ahead_the_switch_drops_used_up_leases(tmp_path, monkeypatch):
    """Every write-ahead fails here, so each switch writes the next lease itself, dropping what it can."""
    import threading
    import time

    from nomad_plugin.journal import ids as ids_mod

    real_replace = os.replace

    def replace_failing_on_the_lease_thread(src, dst):
        if threading.current_thread().name == "grant-ids-lease":
            raise OSError(28, "No space left on device")
        real_replace(src, dst)

    def quiet():
        deadline = time.monotonic() + 10
        while any(t.name == "grant-ids-lease" and t.is_alive() for t in threading.enumerate()):
            assert time.monotonic() < deadline, "a lease write-ahead thread did not end"
            time.sleep(0.01)

    monkeypatch.setattr(ids_mod.os, "replace", replace_failing_on_the_lease_thread)
    ids = _ids(tmp_path, block=2)
    ids.prepare()
    seeds = lambda: [_lease(raw).seed for raw in _leases(tmp_path)]  # noqa: E731
    [first] = seeds()
    for _ in range(2):
        ids.settled(ids.take())
        quiet()
    held = ids.take()  # the switch to a second lease: the first, used up and settled, is dropped
    quiet()
    [second] = seeds()
    assert second != first
    ids.settled(ids.take())
    quiet()
    ids.settled(ids.take())  # the switch to a third lease: the second still has an id in flight
    quiet()
    assert seeds()[0] == second and len(seeds()) == 2
    ids.settled(held)
    ids.settled(ids.take())
    quiet()
    ids.settled(ids.take())  # the next switch drops the second lease too, now that nothing of it is in flight
    quiet()
    assert second not in seeds() and len(seeds()) == 1


def test_an_existing_readable_directory_is_used_as_it_is(tmp_path):
    """A 0755 directory the plugin did not create keeps its mode; the journal in it is 0600 all the same."""
    directory = tmp_path / "data"
    directory.mkdir(mode=0o755)
    directory.chmod(0o755)
    Journal(directory).put(entry("g-1"))
    assert directory.stat().st_mode & 0o777 == 0o755
    assert (directory / "journal.json").stat().st_mode & 0o777 == 0o600


def test_a_missing_directory_is_created_0700_with_0755_parents_whatever_the_umask(tmp_path):
    old = os.umask(0)
    try:
        Journal(tmp_path / "a" / "b" / "data")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a").stat().st_mode) == 0o755
    assert stat.S_IMODE((tmp_path / "a" / "b").stat().st_mode) == 0o755
    assert stat.S_IMODE((tmp_path / "a" / "b" / "data").stat().st_mode) == 0o700


def test_known_count_is_this_process_view_and_exact_after_a_write(tmp_path):
    mine, other = Journal(tmp_path), Journal(tmp_path)
    mine.put(entry("g-1"))
    assert mine.known_count() == 1
    other.put(entry("g-2"))
    other.put(entry("g-3"))
    assert mine.known_count() == 1, "known_count read the disk"
    mine.put(entry("g-4"))  # a write catches up first
    assert mine.known_count() == len(mine) == 4
    mine.remove("g-2")
    assert mine.known_count() == 3


def _record_sync_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    calls: list[tuple[str, int]] = []
    for name in ("fdatasync", "fsync"):
        real = getattr(os, name, None)
        if real is not None:

            def recorder(fd: int, name: str = name, real=real) -> None:  # type: ignore[no-untyped-def]
                calls.append((name, fd))
                real(fd)

            monkeypatch.setattr(os, name, recorder)
    return calls


def test_a_durable_write_is_one_fdatasync_of_the_journal(tmp_path, monkeypatch):
    """fdatasync, not fsync: the data and the size, without the inode times (one per Reserve; issue 14)."""
    calls = _record_sync_calls(monkeypatch)
    journal = Journal(tmp_path)
    calls.clear()
    journal.put(entry("g-1"))
    assert calls == [("fdatasync", journal._fd)]
    journal.put(entry("g-2"), durable=False)
    assert calls == [("fdatasync", journal._fd)], "a write that was not asked to be durable was synced"


def test_without_fdatasync_a_durable_write_falls_back_to_fsync(tmp_path, monkeypatch):
    calls = _record_sync_calls(monkeypatch)
    monkeypatch.delattr(os, "fdatasync")
    journal = Journal(tmp_path)
    calls.clear()
    journal.put(entry("g-1"))
    assert calls == [("fsync", journal._fd)]
    assert [e.grant_id for e in Journal(tmp_path).entries()] == ["g-1"]
