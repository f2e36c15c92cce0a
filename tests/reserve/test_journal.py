"""The grant journal: permissions, reopen, the atomic snapshot write, corruption set-aside, bounds, old files."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from nomad_plugin.journal import EntryState, Journal, JournalEntry, JournalFull
from nomad_plugin.journal.store import JournalCorrupt, checksum, decode, encode
from nomad_plugin.model.grant import DeviceAsk, GrantedDevice
from tests.this_thread import in_this_thread


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


def canonical(value) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def record(op: str, payload) -> bytes:
    """A change record appended after the snapshot: never valid in a journal file."""
    return f'["{op}",{canonical(payload)},"{checksum([op, payload])}"]\n'.encode()


def put(e: JournalEntry) -> bytes:
    return record("put", e.to_json())


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


def test_the_file_is_one_snapshot_of_the_current_entries_after_every_change(tmp_path):
    j = Journal(tmp_path)
    path = tmp_path / "journal.json"
    assert decode(path.read_bytes()) == [] and path.read_bytes().count(b"\n") == 1
    j.put(entry("a"))
    j.put(entry("b"))
    j.put(entry("a", EntryState.RELEASING))  # replaced in place, order kept
    j.remove("b")
    assert path.read_bytes() == encode([entry("a", EntryState.RELEASING)])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["journal.json"]


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
    assert doc["version"] == 1 and doc["checksum"] == checksum(doc["entries"])


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


# --- nothing but whitespace may follow the snapshot ------------------------------------------------
def test_anything_after_the_snapshot_is_corruption_and_the_file_is_set_aside(tmp_path, caplog):
    path = tmp_path / "journal.json"
    bad = encode([entry("a")]) + put(entry("b"))
    path.write_bytes(bad)
    reopened = Journal(tmp_path)
    assert reopened.entries() == [] and reopened.corrupt_set_aside is not None
    assert reopened.corrupt_set_aside.read_bytes() == bad
    assert "extra data after the snapshot" in caplog.text
    assert decode(path.read_bytes()) == []


def test_an_indented_snapshot_without_a_final_newline_loads_as_it_is(tmp_path):
    body = [entry("old").to_json()]
    old = json.dumps({"version": 1, "checksum": checksum(body), "entries": body}, sort_keys=True, indent=1)
    (tmp_path / "journal.json").write_text(old)
    j = Journal(tmp_path)
    assert j.entries() == [entry("old")] and j.corrupt_set_aside is None
    j.put(entry("new"))
    assert (tmp_path / "journal.json").read_bytes() == encode([entry("old"), entry("new")])


def test_leading_and_trailing_whitespace_is_tolerated():
    assert [e.grant_id for e in decode(b"\n " + encode([entry("a")]) + b"\n \n")] == ["a"]


# --- several processes --------------------------------------------------------------------------------
def test_two_instances_see_each_others_writes(tmp_path):
    one, two = Journal(tmp_path), Journal(tmp_path)
    one.put(entry("a"))
    two.put(entry("b"))
    one.put(entry("c"))
    assert [e.grant_id for e in two.entries()] == ["a", "b", "c"]
    one.remove("b")
    assert two.get("b") is None and len(two) == 2
    two.put(entry("d"))
    assert [e.grant_id for e in one.entries()] == ["a", "c", "d"]


def test_a_reader_catches_up_with_a_file_another_process_replaced(tmp_path):
    one, two = Journal(tmp_path), Journal(tmp_path)
    two.put(entry("x"))
    two.put(entry("y"))
    assert sorted(e.grant_id for e in one.entries()) == ["x", "y"]
    (tmp_path / "journal.json.new").write_bytes(encode([entry("z")]))
    os.replace(tmp_path / "journal.json.new", tmp_path / "journal.json")  # as another writer's rename
    assert [e.grant_id for e in one.entries()] == ["z"]


def test_a_reader_does_not_write_back_a_deleted_journal(tmp_path):
    j = Journal(tmp_path)
    j.put(entry("a"))
    (tmp_path / "journal.json").unlink()
    assert [e.grant_id for e in j.entries()] == ["a"] and len(j) == 1 and j.get("a") is not None
    assert not (tmp_path / "journal.json").exists(), "only a writer puts the file back"


@pytest.mark.parametrize("change", ["put", "remove"])
def test_a_journal_file_deleted_under_a_writer_is_written_back_whole(tmp_path, change):
    j = Journal(tmp_path)
    j.put(entry("a"))
    j.put(entry("b"))
    (tmp_path / "journal.json").unlink()
    if change == "put":
        j.put(entry("c"))
        want = ["a", "b", "c"]
    else:
        j.remove("b")
        want = ["a"]
    assert sorted(e.grant_id for e in Journal(tmp_path).entries()) == want


ROOT = str(Path(__file__).resolve().parents[2])

WRITER = """
import sys
from nomad_plugin.journal import Journal
from tests.reserve.test_journal import entry
j = Journal(sys.argv[1])
i = 0
while True:
    j.put(entry(f"g{i}"))
    if i >= 3:
        j.remove(f"g{i-3}")
    print(i, flush=True)
    i += 1
"""


def test_sigkill_during_writes_never_leaves_a_torn_journal(tmp_path):
    """Kill a writer mid-stream many times; every reopen finds a valid journal.

    Each writer gets its own directory: a second writer starting again at g0
    would never remove what the first left above its own indices (how far a
    killed writer got past the lines read depends on the box's load).
    """
    for run in range(5):
        data = tmp_path / f"run{run}"
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(data)], stdout=subprocess.PIPE, cwd=ROOT, text=True)
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
from nomad_plugin.journal import Journal
from tests.reserve.test_journal import entry
tag = sys.argv[2]
j = Journal(sys.argv[1])
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


# --- the atomic write -----------------------------------------------------------------------------------
def _record_io(monkeypatch) -> list[tuple[str, str]]:
    """Every fsync (by what it names) and rename, in order, as the journal makes them."""
    from nomad_plugin.journal import store

    calls: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        calls.append(("fsync", os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))))
        real_fsync(fd)

    def replace(src, dst) -> None:
        calls.append(("rename", f"{os.path.basename(src)} -> {os.path.basename(dst)}"))
        real_replace(src, dst)

    monkeypatch.setattr(store.os, "fsync", in_this_thread(fsync, real_fsync))
    monkeypatch.setattr(store.os, "replace", in_this_thread(replace, real_replace))
    return calls


@pytest.mark.parametrize("change", ["put", "remove"])
def test_a_change_is_the_temp_file_synced_renamed_and_the_directory_synced_before_it_returns(
    tmp_path, monkeypatch, change
):
    j = Journal(tmp_path / "data")
    j.put(entry("a"))
    calls = _record_io(monkeypatch)
    j.put(entry("b")) if change == "put" else j.remove("a")
    [(_, tmp_synced), rename, dir_synced] = calls
    assert tmp_synced.startswith("journal.json.tmp-") and rename == ("rename", f"{tmp_synced} -> journal.json")
    assert dir_synced == ("fsync", "data"), calls


def test_a_failed_write_leaves_the_journal_as_it_was_and_no_temp_file(tmp_path, monkeypatch):
    from nomad_plugin.journal import store

    j = Journal(tmp_path)
    j.put(entry("a"))
    before = (tmp_path / "journal.json").read_bytes()
    real_write = os.write

    def half_then_full(fd, data):
        real_write(fd, bytes(data)[: len(data) // 2])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store.os, "write", in_this_thread(half_then_full, real_write))
    with pytest.raises(OSError) as err:
        j.put(entry("b"))
    assert err.value.errno == 28
    with pytest.raises(OSError):
        j.remove("a")
    monkeypatch.undo()
    assert (tmp_path / "journal.json").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["journal.json"]
    assert [e.grant_id for e in j.entries()] == ["a"], "this process's view is what the file holds"
    j.put(entry("c"))
    assert [e.grant_id for e in Journal(tmp_path).entries()] == ["a", "c"]


def test_a_failed_fsync_of_the_temp_file_leaves_the_journal_as_it_was(tmp_path, monkeypatch):
    from nomad_plugin.journal import store

    j = Journal(tmp_path)
    j.put(entry("a"))
    failing_fsync = in_this_thread(lambda fd: (_ for _ in ()).throw(OSError(5, "Input/output error")), os.fsync)
    monkeypatch.setattr(store.os, "fsync", failing_fsync)
    with pytest.raises(OSError):
        j.put(entry("b"))
    monkeypatch.undo()
    assert [e.grant_id for e in Journal(tmp_path).entries()] == ["a"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["journal.json"]


def test_stale_temp_files_removed(tmp_path):
    Journal(tmp_path)
    (tmp_path / "journal.json.tmp-1-2").write_text("junk")
    Journal(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["journal.json"]


# --- bounds and set-aside ---------------------------------------------------------------------------------
def test_bad_entry_field_is_corruption(tmp_path):
    body = [dict(entry().to_json(), state="weird")]
    (tmp_path / "journal.json").write_text(json.dumps({"version": 1, "checksum": checksum(body), "entries": body}))
    assert Journal(tmp_path).corrupt_set_aside is not None


def test_oversized_journal_is_corruption(tmp_path):
    (tmp_path / "journal.json").write_bytes(b" " * 2048)
    j = Journal(tmp_path, max_bytes=1024)
    assert j.corrupt_set_aside is not None and j.entries() == []


def test_the_size_bound_is_inclusive_and_named(tmp_path, caplog):
    j = Journal(tmp_path)
    j.put(entry("a"))
    size = (tmp_path / "journal.json").stat().st_size
    assert [e.grant_id for e in Journal(tmp_path, max_bytes=size).entries()] == ["a"]
    smaller = Journal(tmp_path, max_bytes=size - 1)
    assert smaller.entries() == [] and smaller.corrupt_set_aside is not None
    assert f"{size} bytes, over the {size - 1}-byte bound" in caplog.text


def test_bounded_entries(tmp_path):
    j = Journal(tmp_path, max_entries=2)
    j.put(entry("a"))
    j.put(entry("b"))
    j.put(entry("b", EntryState.RELEASING))  # replacing is fine
    with pytest.raises(JournalFull, match="limit 2"):
        j.put(entry("c"))


def test_full_journal_message_in_full(tmp_path):
    j = Journal(tmp_path, max_entries=1)
    j.put(entry("a"))
    with pytest.raises(JournalFull) as err:
        j.put(entry("b"))
    assert str(err.value) == (
        "the grant journal holds 1 grants (limit 1); "
        "grants are not being released - check the reconciler and the Nomad API"
    )


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
    [rec] = caplog.records
    assert re.fullmatch(
        rf"grant journal {re.escape(str(tmp_path / 'journal.json'))} is corrupt \(.+\); moved to "
        rf"{re.escape(str(target))} and starting empty - grants it held are reported as leaked when a live "
        r"allocation still uses them",
        rec.getMessage(),
    ), rec.getMessage()


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
    e = dataclasses.replace(entry("late"), state=EntryState.RELEASING, settle_until=1700000123.25)
    Journal(tmp_path).put(e)
    assert Journal(tmp_path).get("late") == e


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
        (_full(granted=[{"minor": 1, "uuid": 2}]), "field 'uuid' = 2 is not a string"),
        (_full(cards="C1"), "field 'cards' = 'C1' is not a list of strings"),
        (_full(cards=["C1", 2]), "field 'cards' = ['C1', 2] is not a list of strings"),
        (_full(asks={"minor": 1}), "field 'asks' is not a list of objects"),
        (_full(asks=[1]), "field 'asks' is not a list of objects"),
        (_full(state="gone"), "field 'state' = 'gone' is not one of intent/granted/releasing"),
        (_full(state=["intent"]), "field 'state' = ['intent'] is not one of intent/granted/releasing"),
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
    with pytest.raises(JournalCorrupt) as err:
        decode(data)
    assert str(err.value) == message


def test_a_bad_or_duplicate_snapshot_entry_is_named_by_its_index():
    def snapshot(body) -> bytes:
        return _snapshot_doc({"version": 1, "checksum": checksum(body), "entries": body})

    good = entry("a").to_json()
    with pytest.raises(JournalCorrupt) as err:
        decode(snapshot([good, good]))
    assert str(err.value) == "entry 1: duplicate grant id a"
    with pytest.raises(JournalCorrupt) as err:
        decode(snapshot([good, {"grant_id": "b"}]))
    assert str(err.value) == "entry 1: field 'device_ids' missing"


# --- descriptors, reading without writing, the directory ---------------------------------------------------
def _fds_into(path):
    """This process's descriptors open on ``path`` or on a file inside it."""
    out = []
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor is gone by now
            target = os.readlink(f"/proc/self/fd/{name}")
            if target == str(path) or target.startswith(f"{path}/"):
                out.append(target)
    return sorted(out)


def test_close_is_idempotent_and_a_closed_journal_still_answers(tmp_path):
    j = Journal(tmp_path / "d")
    j.put(entry("a"))
    j.close()
    assert _fds_into(tmp_path / "d") == []
    j.close()
    assert [e.grant_id for e in j.entries()] == ["a"]
    j.put(entry("b"))
    assert [e.grant_id for e in Journal(tmp_path / "d").entries()] == ["a", "b"]


def test_a_journal_dropped_without_close_releases_its_descriptors(tmp_path):
    # A reference cycle, as an exception's traceback makes in real code: only the cyclic GC frees it.
    j = Journal(tmp_path / "d")
    j.put(entry("a"))
    j.self_ref = j
    assert _fds_into(tmp_path / "d") == [str(tmp_path / "d" / "journal.json")]
    del j
    gc.collect()
    assert _fds_into(tmp_path / "d") == []


def test_writes_do_not_leak_file_descriptors(tmp_path):
    j = Journal(tmp_path)
    j.put(entry("a"))
    before = len(os.listdir("/proc/self/fd"))
    for i in range(5):
        j.put(entry(f"b{i}"))
        j.remove(f"b{i}")
    assert len(os.listdir("/proc/self/fd")) == before


def test_snapshot_reads_without_writing(tmp_path):
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


def test_a_data_dir_that_is_a_file_is_refused(tmp_path):
    from nomad_plugin.journal.datadir import DataDirRefused

    (tmp_path / "f").write_text("x")
    with pytest.raises(DataDirRefused, match="exists but is not a directory"):
        Journal(tmp_path / "f")
