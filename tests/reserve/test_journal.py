"""The grant journal: permissions, reopen, atomic writes, corruption set-aside, bounds."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import subprocess
import sys
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


def test_world_writable_dir_is_tightened(tmp_path):
    d = tmp_path / "lj"
    d.mkdir(mode=0o777)
    os.chmod(d, 0o777)
    Journal(d)
    assert stat.S_IMODE(d.stat().st_mode) == 0o700


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
    for cut in (1, 40, len(whole.split(b"\n")[-2]) - 1):
        path.write_bytes(whole[:-cut])
        reopened = Journal(tmp_path)
        assert reopened.corrupt_set_aside is None
        assert [e.grant_id for e in reopened.entries()] == ["a"]
        assert "partial record" in caplog.text
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
    killed writer got past the 20 lines read depends on the box's load).
    """
    for run in range(5):
        data = tmp_path / f"run{run}"
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(data)], stdout=subprocess.PIPE, cwd=ROOT, text=True)
        assert proc.stdout is not None
        for _ in range(20):
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
from nomad_plugin.journal import Journal, store
from tests.reserve.test_journal import entry
store.COMPACT_MIN_RECORDS = 16
j = Journal(sys.argv[1])
tag = sys.argv[2]
for i in range(120):
    j.put(entry(f"{tag}{i}"))
    if i % 3 == 0:
        j.remove(f"{tag}{i}")
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
