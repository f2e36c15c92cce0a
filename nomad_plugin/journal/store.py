"""The journal file: a checksummed snapshot plus an append-only log; durable, bounded, multi-process safe.

Layout: ``<data_dir>/journal.json`` (0600) in ``data_dir`` (created 0700, see ``datadir.py``)::

    {"checksum": "sha256:<hex>", "entries": [ ... ], "version": 1}      <- snapshot, one line
    ["put",{...one entry...},"sha256:<hex>"]                             <- one line per change
    ["del","<grant id>","sha256:<hex>"]

The snapshot's ``checksum`` is the SHA-256 of the canonical JSON of
``entries`` (sorted keys, no spaces); a record's is the SHA-256 of the
canonical JSON of ``[op, payload]``.

Why a log: a change appends one compact record (C-encoded JSON, a few hundred
bytes) and ``fdatasync``s it before the call returns, so a write costs the
same with 1 or 1,000 grants live. Rewriting the whole journal on every change
made each Reserve grow with the live grants (71 ms at 1,024; issue 14). When
the log holds at least as many records as there are live entries (and at
least ``COMPACT_MIN_RECORDS``), the entries are written as a new snapshot:
temp file, fsync, rename over the journal, fsync the directory; that costs
O(live) once per O(live) changes, so the amortised cost stays constant. The
plugin's journal (``background_compaction``) does this on a thread of its own
and holds the locks only to take the entries and, after the snapshot is
synced, to copy the records appended meanwhile behind it and rename: a
Reserve no longer pays for the compaction its write made due (issue 14).

Crash safety: a record is one ``write`` of a line ending in a newline, and
nothing is acknowledged before its ``fdatasync``. A crash mid-append leaves
at most one partial last line, with no newline: it was never acknowledged,
so loading drops it (the change did not happen: an intent that never reached
Allocate, a "granted" whose Reserve never returned, or a removal that is
simply redone) and the next writer truncates it away. A compaction is a
rename, so a crash leaves the old or the new snapshot, never a torn one. Any
other damage (a bad snapshot, a complete record line that does not parse or
whose checksum is wrong) is corruption: the file is renamed to
``journal.corrupt-<UTC time>`` and the plugin starts with an empty journal;
the reconciler then reports grants held by live allocations as leaked
(``corrupt_set_aside`` says where the old file went).

Several processes (the plugin and the ``grants`` operator command) may open
the same journal. Every change runs under an exclusive ``flock`` on the data
directory and first catches up with whatever other processes appended or
compacted (an append-only file read from the offset this process knows; a
replaced inode is re-read whole), so no process writes from a stale view and
no update is lost. Readers take the shared lock to catch up the same way.
Files written by earlier versions (one indented snapshot, no log) load as a
snapshot and are rewritten in this layout at the first change.
"""

from __future__ import annotations

import enum
import fcntl
import hashlib
import json
import os
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from nomad_plugin.goplugin.logging import get_logger
from nomad_plugin.journal import datadir
from nomad_plugin.model.errors import PluginError
from nomad_plugin.model.grant import DeviceAsk, GrantedDevice

log = get_logger(__name__)


class EntryState(enum.Enum):
    #: Written before Allocate: the grant may or may not exist at XDM, and XDM may still
    #: commit it until ``settle_until``.
    INTENT = "intent"
    #: Allocate succeeded and Reserve returned (or is about to).
    GRANTED = "granted"
    #: To be released: a release failed (XDM down), or XDM may still commit the grant
    #: (``settle_until`` lies ahead); retried until a release at or after ``settle_until`` succeeds.
    RELEASING = "releasing"


@dataclass(frozen=True)
class JournalEntry:
    """What the plugin must remember about one grant to release it later."""

    grant_id: str
    device_ids: tuple[str, ...]
    group: str  # GroupKey as "vendor/type/name"
    kind: str  # model.instances.Kind value
    cards: tuple[str, ...]  # card UUIDs the grant touches
    asks: tuple[DeviceAsk, ...]
    created_at: float  # unix seconds
    state: EntryState = EntryState.INTENT
    granted: tuple[GrantedDevice, ...] = ()
    # Unix seconds until which XDM may still commit this grant: set on every
    # intent (its Allocate's deadline and one more), kept when the Allocate
    # ended without XDM's answer, 0 once XDM answered. Until then a release,
    # even one answered "not found", is not final and the entry stays.
    settle_until: float = 0.0

    def with_state(self, state: EntryState, granted: tuple[GrantedDevice, ...] | None = None) -> JournalEntry:
        return replace(self, state=state, granted=self.granted if granted is None else granted)

    def to_json(self) -> dict[str, Any]:
        return {
            "grant_id": self.grant_id,
            "device_ids": list(self.device_ids),
            "group": self.group,
            "kind": self.kind,
            "cards": list(self.cards),
            "asks": [
                {"minor": a.minor, "core": a.core, "memory_gib": a.memory_gib, "slices": a.slices} for a in self.asks
            ],
            "granted": [
                {
                    "minor": d.minor,
                    "uuid": d.uuid,
                    "core": d.core,
                    "memory_gib": d.memory_gib,
                    "slices": d.slices,
                    "mig_uuid": d.mig_uuid,
                }
                for d in self.granted
            ],
            "created_at": self.created_at,
            "state": self.state.value,
            "settle_until": self.settle_until,
        }

    @classmethod
    def from_json(cls, raw: Any) -> JournalEntry:
        """Parse one entry; raises ``ValueError`` naming the bad field."""
        if not isinstance(raw, dict):
            raise ValueError(f"entry is {type(raw).__name__}, not an object")
        return cls(
            grant_id=_str(raw, "grant_id"),
            device_ids=tuple(_str_list(raw, "device_ids")),
            group=_str(raw, "group"),
            kind=_str(raw, "kind"),
            cards=tuple(_str_list(raw, "cards")),
            asks=tuple(
                DeviceAsk(
                    minor=_int(a, "minor"),
                    core=_int(a, "core"),
                    memory_gib=_int(a, "memory_gib"),
                    slices=_int(a, "slices"),
                )
                for a in _obj_list(raw, "asks")
            ),
            granted=tuple(
                GrantedDevice(
                    minor=_int(d, "minor"),
                    uuid=_str(d, "uuid"),
                    core=_int(d, "core"),
                    memory_gib=_int(d, "memory_gib"),
                    slices=_int(d, "slices"),
                    mig_uuid=_str(d, "mig_uuid"),
                )
                for d in _obj_list(raw, "granted")
            ),
            created_at=_float(raw, "created_at"),
            state=_state(raw),
            settle_until=_float(raw, "settle_until") if "settle_until" in raw else 0.0,
        )


def _field(raw: dict[str, Any], name: str) -> Any:
    if name not in raw:
        raise ValueError(f"field {name!r} missing")
    return raw[name]


def _str(raw: dict[str, Any], name: str) -> str:
    value = _field(raw, name)
    if not isinstance(value, str):
        raise ValueError(f"field {name!r} = {value!r} is not a string")
    return value


def _int(raw: dict[str, Any], name: str) -> int:
    value = _field(raw, name)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"field {name!r} = {value!r} is not an integer")
    return value


def _float(raw: dict[str, Any], name: str) -> float:
    value = _field(raw, name)
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise ValueError(f"field {name!r} = {value!r} is not a number")
    return float(value)


def _str_list(raw: dict[str, Any], name: str) -> list[str]:
    value = _field(raw, name)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"field {name!r} = {value!r} is not a list of strings")
    return value


def _obj_list(raw: dict[str, Any], name: str) -> list[dict[str, Any]]:
    value = _field(raw, name)
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise ValueError(f"field {name!r} is not a list of objects")
    return value


def _state(raw: dict[str, Any]) -> EntryState:
    value = _str(raw, "state")
    try:
        return EntryState(value)
    except ValueError:
        raise ValueError(f"field 'state' = {value!r} is not one of intent/granted/releasing") from None


VERSION = 1
FILE_NAME = "journal.json"
#: Far above any node's instance count (16 cards x 10 shares = 160).
DEFAULT_MAX_ENTRIES = 4096
DEFAULT_MAX_BYTES = 16 * 1024 * 1024
#: Compact when the log holds this many records and at least as many as there are live entries.
#: Each compaction syncs a whole snapshot (1.5-3.3 ms at 1 to 1,024 grants): 2,048 makes it one
#: per 1,024 Reserves or fewer, for ~1 MB of log read back at start-up (~70 ms).
COMPACT_MIN_RECORDS = 2048

_PUT = "put"
_DEL = "del"


class JournalFull(PluginError):
    """The journal holds ``max_entries`` grants; refuse new ones instead of growing."""


class JournalCorrupt(ValueError):
    """Raised by ``decode`` with the reason the file cannot be trusted."""


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _digest(canonical: str) -> str:
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def _checksum(body: list[Any]) -> str:
    return _digest(_canonical(body))


def _snapshot_bytes(canonical_entries: Iterable[str]) -> bytes:
    """The snapshot line from each entry's canonical JSON (what the checksum covers)."""
    joined = ",".join(canonical_entries)
    checksum = _digest("[" + joined + "]")
    return f'{{"checksum": "{checksum}", "entries": [{joined}], "version": {VERSION}}}\n'.encode()


def _record_bytes(op: str, payload_canonical: str) -> bytes:
    body = f'["{op}",{payload_canonical}'
    return f'{body},"{_digest(body + "]")}"]\n'.encode()


def encode(entries: Iterable[JournalEntry]) -> bytes:
    """A journal file holding ``entries`` as a snapshot and no log."""
    return _snapshot_bytes(_canonical(e.to_json()) for e in entries)


@dataclass
class _Parsed:
    entries: dict[str, JournalEntry] = field(default_factory=dict)
    #: grant id -> the canonical JSON it was read as (what a compaction writes back).
    canon: dict[str, str] = field(default_factory=dict)
    #: Bytes up to the end of the last complete record (what the next append follows).
    good_size: int = 0
    records: int = 0
    #: The snapshot is not in this layout (no newline after it): rewrite before appending.
    needs_compaction: bool = False
    torn: bytes = b""


def decode(data: bytes) -> list[JournalEntry]:
    """Parse and verify a journal file's bytes, or raise ``JournalCorrupt``.

    A partial last line (no newline: an append cut short by a crash) is dropped.
    """
    return list(_parse(data).entries.values())


def _parse(data: bytes) -> _Parsed:
    try:
        text = data.decode()
    except UnicodeDecodeError as exc:
        raise JournalCorrupt(f"not JSON: {exc}") from None
    start = len(text) - len(text.lstrip())
    try:
        doc, end = json.JSONDecoder().raw_decode(text, start)
    except ValueError as exc:
        raise JournalCorrupt(f"not JSON: {exc}") from None
    parsed = _Parsed()
    _snapshot_entries(doc, parsed)
    offset = len(text[:end].encode())  # in bytes: the text may hold non-ASCII characters
    rest = data[offset:]
    if not rest.startswith(b"\n"):
        if rest.strip():
            raise JournalCorrupt("extra data after the snapshot")
        parsed.needs_compaction = True
        parsed.good_size = len(data)
        return parsed
    ops, good, torn = _read_records(data, offset + 1)
    _apply(parsed, ops)
    parsed.good_size, parsed.torn = good, torn
    return parsed


def _snapshot_entries(doc: Any, parsed: _Parsed) -> None:
    if not isinstance(doc, dict):
        raise JournalCorrupt("top level is not an object")
    if doc.get("version") != VERSION:
        raise JournalCorrupt(f"version {doc.get('version')!r}, expected {VERSION}")
    body = doc.get("entries")
    if not isinstance(body, list):
        raise JournalCorrupt("'entries' is not a list")
    canon = [_canonical(raw) for raw in body]
    if doc.get("checksum") != _digest("[" + ",".join(canon) + "]"):
        raise JournalCorrupt("checksum mismatch")
    for i, raw in enumerate(body):
        try:
            entry = JournalEntry.from_json(raw)
        except ValueError as exc:
            raise JournalCorrupt(f"entry {i}: {exc}") from None
        if entry.grant_id in parsed.entries:
            raise JournalCorrupt(f"entry {i}: duplicate grant id {entry.grant_id}")
        parsed.entries[entry.grant_id] = entry
        parsed.canon[entry.grant_id] = canon[i]


# One verified record: (grant id, the entry and its canonical JSON) for a put, (grant id, None) for a del.
_Op = tuple[str, tuple[JournalEntry, str] | None]


def _read_records(data: bytes, offset: int) -> tuple[list[_Op], int, bytes]:
    """The complete record lines from ``offset`` (verified), the end of the last one, and a partial last line."""
    ops: list[_Op] = []
    good = offset
    while offset < len(data):
        newline = data.find(b"\n", offset)
        if newline < 0:
            return ops, good, data[offset:]
        line = data[offset:newline]
        if line.strip():
            ops.append(_record(line, offset))
        offset = good = newline + 1
    return ops, good, b""


def _record(line: bytes, offset: int) -> _Op:
    where = f"record at byte {offset}"
    try:
        rec = json.loads(line)
    except (ValueError, UnicodeDecodeError) as exc:
        raise JournalCorrupt(f"{where}: not JSON: {exc}") from None
    if not isinstance(rec, list) or len(rec) != 3 or rec[0] not in (_PUT, _DEL):
        raise JournalCorrupt(f"{where}: not a [op, payload, checksum] record")
    op, payload, checksum = rec
    canon = _canonical(payload)
    if checksum != _digest(f'["{op}",{canon}]'):
        raise JournalCorrupt(f"{where}: checksum mismatch")
    if op == _DEL:
        if not isinstance(payload, str):
            raise JournalCorrupt(f"{where}: 'del' names {payload!r}, not a grant id")
        return payload, None
    try:
        entry = JournalEntry.from_json(payload)
    except ValueError as exc:
        raise JournalCorrupt(f"{where}: {exc}") from None
    return entry.grant_id, (entry, canon)


def _apply(parsed: _Parsed, ops: list[_Op]) -> None:
    for grant_id, put in ops:
        if put is None:
            parsed.entries.pop(grant_id, None)
            parsed.canon.pop(grant_id, None)
        else:
            parsed.entries[grant_id], parsed.canon[grant_id] = put
    parsed.records += len(ops)


def _sync(fd: int) -> None:
    """fdatasync where there is one: the data and size, without the atime churn."""
    sync = getattr(os, "fdatasync", os.fsync)
    sync(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class Journal:
    """Map grant id -> entry, persisted before each call returns; safe across threads and processes."""

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        max_bytes: int = DEFAULT_MAX_BYTES,
        background_compaction: bool = False,
    ) -> None:
        """``background_compaction``: compact on a thread of its own, not in the write that finds it due.

        The plugin's journal does (a compaction at 1,024 grants cost the Reserve
        that triggered it ~3.3 ms); other users keep the simpler inline
        compaction. Call ``close`` (or ``stop_background``) to stop that thread.
        """
        self.dir = Path(data_dir)
        self.path = self.dir / FILE_NAME
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.corrupt_set_aside: Path | None = None
        self._lock = threading.Lock()
        self._entries: dict[str, JournalEntry] = {}
        self._canon: dict[str, str] = {}  # grant id -> canonical JSON, for cheap compaction
        self._fd = -1  # the journal file as this process last read it (O_APPEND)
        self._size = 0  # bytes of it applied (end of the last complete record)
        self._records = 0  # log records after the snapshot
        self._needs_compaction = False
        self._generation = 0  # bumped whenever this process's view of the entries changes
        # Derived views, kept in step with _entries so lookups never scan every grant.
        self._by_device: dict[str, dict[str, JournalEntry]] = {}  # device ID -> grant id -> entry
        self._card_kinds: dict[str, Counter[str]] = {}  # card UUID -> kind -> live entries
        self._kinds_changes = 0  # bumped whenever some card's set of kinds changes (``kinds_changes``)
        # kinds_by_card's answer, and the count it was built at.
        self._kinds_view: tuple[int, Mapping[str, frozenset[str]]] | None = None
        self._compaction_due = threading.Event()  # wakes the background compactor
        self._compactor: threading.Thread | None = None
        self._background = background_compaction
        self._prepare_dir()
        self._dir_fd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY)
        with self._lock, self._flock(fcntl.LOCK_EX):
            self._open()

    # -- reading -------------------------------------------------------------
    @classmethod
    def snapshot(cls, data_dir: str | os.PathLike[str]) -> list[JournalEntry]:
        """The entries on disk, read without opening the journal for writing.

        For operator commands that run next to the plugin (``grants``): no
        temp-file cleanup, no set-aside, no write. An absent journal is empty;
        an unreadable one raises ``JournalCorrupt``.
        """
        try:
            data = (Path(data_dir) / FILE_NAME).read_bytes()
        except FileNotFoundError:
            return []
        return decode(data)

    def entries(self) -> list[JournalEntry]:
        with self._lock, self._flock(fcntl.LOCK_SH):
            self._catch_up()
            return list(self._entries.values())

    def get(self, grant_id: str) -> JournalEntry | None:
        with self._lock, self._flock(fcntl.LOCK_SH):
            self._catch_up()
            return self._entries.get(grant_id)

    def holders(self, device_id: str) -> list[JournalEntry]:
        """The entries naming ``device_id``, oldest first, from this process's view (no disk access).

        Constant time whatever the number of grants: the stats layout asks once
        per instance per tick. Call ``len()`` first to catch up with other processes.
        """
        with self._lock:
            return list(self._by_device.get(device_id, {}).values())

    def kinds_by_card(self) -> Mapping[str, frozenset[str]]:
        """Card UUID -> the kinds of the entries on it, from this process's view (no disk access).

        Read-only, and the same object until some card's set of kinds changes:
        the fingerprint engine asks after every Reserve, and most Reserves add
        a grant to a card that already holds one of its kind, so it can tell
        "unchanged" by identity instead of comparing every card (issue 14).
        """
        with self._lock:
            built = self._kinds_view
            if built is not None and built[0] == self._kinds_changes:
                return built[1]
            view = MappingProxyType({card: frozenset(kinds) for card, kinds in self._card_kinds.items()})
            self._kinds_view = (self._kinds_changes, view)
            return view

    @property
    def kinds_changes(self) -> int:
        """How often some card's set of kinds has changed in this process's view; read without the lock.

        A Reserve asks it after its grant is journalled, to tell whether the
        fingerprint engine has anything to re-mark. ``kinds_by_card`` takes the
        journal's lock, which a background compaction holds for a moment now and
        then: read on the Reserve's path, that wait showed in its tail (issue 14).
        """
        return self._kinds_changes

    @property
    def generation(self) -> int:
        """A counter that changes whenever the entries this process knows change.

        Reading it never touches the disk (changes by other processes show up
        at the next read or write), so callers can cheaply cache views derived
        from ``entries()``.
        """
        return self._generation

    def known_count(self) -> int:
        """How many entries this process's view holds, without looking at the disk (after a write, exact)."""
        with self._lock:
            return len(self._entries)

    def __len__(self) -> int:
        with self._lock, self._flock(fcntl.LOCK_SH):
            self._catch_up()
            return len(self._entries)

    # -- writing (each durable before it returns) ----------------------------
    def put(self, entry: JournalEntry, *, durable: bool = True) -> None:
        """Record ``entry``; with ``durable`` (the default) it is on disk before this returns.

        ``durable=False`` appends without the ``fdatasync``: the record is in
        the page cache, so it survives a crash of this process (SIGKILL) but
        not of the machine; the next durable write (of any record, by any
        process) syncs it too. Reserve uses it for the intent record, which a
        power loss is covered for by ``GrantIds`` (docs/reserve.md).
        """
        with self._lock, self._flock(fcntl.LOCK_EX):
            self._catch_up(writing=True)
            if entry.grant_id not in self._entries and len(self._entries) >= self.max_entries:
                raise JournalFull(
                    f"the grant journal holds {len(self._entries)} grants (limit {self.max_entries}); "
                    "grants are not being released - check the reconciler and the Nomad API"
                )
            canon = _canonical(entry.to_json())
            self._append(_record_bytes(_PUT, canon), durable=durable)
            self._set(entry, canon)
            self._generation += 1
            self._maybe_compact()

    def sync(self) -> None:
        """Make every record appended so far durable (after ``put(..., durable=False)``)."""
        with self._lock:
            _sync(self._fd)

    def remove(self, grant_id: str) -> bool:
        with self._lock, self._flock(fcntl.LOCK_EX):
            self._catch_up(writing=True)
            if grant_id not in self._entries:
                return False
            self._append(_record_bytes(_DEL, json.dumps(grant_id)))
            self._drop(grant_id)
            self._generation += 1
            self._maybe_compact()
            return True

    def compact(self) -> None:
        """Rewrite the journal as one snapshot now (done automatically as the log grows)."""
        with self._lock, self._flock(fcntl.LOCK_EX):
            self._catch_up(writing=True)
            self._compact()

    def stop_background(self, timeout: float = 1.0) -> None:
        """Stop the background compactor (later compactions run inline); waits up to ``timeout`` s."""
        with self._lock:
            self._background = False
            thread, self._compactor = self._compactor, None
        self._compaction_due.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def close(self) -> None:
        """Release the file descriptors (the journal stays on disk)."""
        self.stop_background()
        with self._lock:
            for fd in (self._fd, self._dir_fd):
                if fd >= 0:
                    os.close(fd)
            self._fd = self._dir_fd = -1

    def __del__(self) -> None:  # pragma: no mutate block
        # The safety net for a journal dropped without close(). It closes the
        # descriptors itself, without the lock or another method: a finalizer
        # runs wherever the cyclic GC fires (inside any allocation, of any
        # thread), so it does the least it can. Nothing else can use an object
        # being finalized, so the lock guards nothing here. Kept out of mutmut
        # (a finalizer that ran mutated code re-entered CPython's ContextVar.set
        # through mutmut's trampoline and crashed its stats pass: docs/testing.md).
        with suppress(Exception):  # interpreter shutdown, or __init__ failed half-way
            for fd in (getattr(self, "_fd", -1), getattr(self, "_dir_fd", -1)):
                if fd >= 0:
                    os.close(fd)

    # -- internals -------------------------------------------------------------
    @contextmanager
    def _flock(self, kind: int) -> Iterator[None]:
        """The inter-process lock: a ``flock`` on the data directory (no extra file to leave behind)."""
        fcntl.flock(self._dir_fd, kind)
        try:
            yield
        finally:
            fcntl.flock(self._dir_fd, fcntl.LOCK_UN)

    def _open(self) -> None:
        """Load the journal at construction, under the exclusive lock."""
        for stale in self.dir.glob(FILE_NAME + ".tmp-*"):
            stale.unlink(missing_ok=True)
        try:
            self._load()
        except JournalCorrupt as exc:
            self._set_aside(str(exc))
            self._reset_empty()

    def _load(self) -> None:
        """(Re)read the whole file; raises ``JournalCorrupt``. A missing file is created empty."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND)
        except FileNotFoundError:
            self._reset_empty()
            return
        try:
            size = os.fstat(fd).st_size
            if size > self.max_bytes:
                raise JournalCorrupt(f"{size} bytes, over the {self.max_bytes}-byte bound")
            parsed = _parse(_read_from(fd, 0, size))
        except BaseException:
            os.close(fd)
            raise
        self._adopt(fd, parsed)

    def _adopt(self, fd: int, parsed: _Parsed) -> None:
        if self._fd >= 0 and self._fd != fd:
            os.close(self._fd)
        self._fd = fd
        if parsed.entries is not self._entries:
            self._generation += 1
            self._entries, self._canon = parsed.entries, parsed.canon
            self._reindex()
        self._size = parsed.good_size
        self._records = parsed.records
        self._needs_compaction = parsed.needs_compaction
        if parsed.torn:
            log.warning(
                "grant journal %s ends in a partial record (%d bytes: an append cut short by a crash, "
                "never acknowledged); ignoring it",
                self.path,
                len(parsed.torn),
            )

    def _catch_up(self, writing: bool = False) -> None:
        """Apply what other processes wrote since this one last looked (the caller holds the flock)."""
        try:
            on_disk = os.stat(self.path)
        except FileNotFoundError:
            # Deleted under us: what this process knows is all there is; a writer puts it back.
            if writing:
                self._compact()
            return
        mine = os.fstat(self._fd)
        if (on_disk.st_ino, on_disk.st_dev) == (mine.st_ino, mine.st_dev):
            if on_disk.st_size == self._size:
                return
            if on_disk.st_size > self._size and not self._needs_compaction:
                ops, good, _torn = _read_records(_read_from(self._fd, self._size, on_disk.st_size - self._size), 0)
                for grant_id, put in ops:
                    if put is None:
                        self._drop(grant_id)
                    else:
                        self._set(*put)
                if ops:
                    self._generation += 1
                self._size += good
                self._records += len(ops)
                return
        # Replaced (compacted by another process) or cut short: read it again whole.
        self._load()

    def _append(self, record: bytes, *, durable: bool = True) -> None:
        """One record (durable before returning unless told otherwise); on failure the file is cut back."""
        if self._needs_compaction:
            self._compact()
        on_disk = os.fstat(self._fd).st_size
        if on_disk != self._size:  # a partial record left by a crash: cut it off first
            os.ftruncate(self._fd, self._size)
        try:
            _write_all(self._fd, record)
            if durable:
                _sync(self._fd)
        except BaseException:
            try:
                os.ftruncate(self._fd, self._size)
            except OSError:
                log.exception("could not cut a failed journal append back; the next load drops it")
            raise
        self._size += len(record)
        self._records += 1

    def _compaction_wanted(self) -> bool:
        return self._records >= max(COMPACT_MIN_RECORDS, len(self._entries))

    def _maybe_compact(self) -> None:
        """After a change (caller holds the locks): compact now, or hand it to the background thread."""
        if not self._compaction_wanted():
            return
        if self._background:
            if self._compactor is None:
                self._compactor = threading.Thread(target=self._compact_loop, name="journal-compact", daemon=True)
                self._compactor.start()
            self._compaction_due.set()
            return
        try:
            self._compact()
        except OSError as exc:  # the change itself is durable in the log; compaction is retried later
            log.warning("grant journal compaction failed (%s); the log keeps growing until it succeeds", exc)

    def _compact_loop(self) -> None:
        while True:
            self._compaction_due.wait()
            self._compaction_due.clear()
            if not self._background:
                return
            try:
                self._compact_beside_writers()
            except OSError as exc:  # the changes are durable in the log; the next change asks again
                log.warning("grant journal compaction failed (%s); the log keeps growing until it succeeds", exc)
            except Exception:
                log.exception("grant journal compaction failed; the log keeps growing until it succeeds")

    def _compact_beside_writers(self) -> None:
        """A compaction whose slow part (writing and syncing the snapshot) holds no lock.

        1. Under the locks: catch up, take the entries as the file holds them up to its
           current end (``base``).
        2. Without them: encode the snapshot, write it to a temp file and ``fsync`` it,
           while Reserves append.
        3. Under the locks again: catch up; if another process replaced the file or the
           temp file was swept meanwhile, give up (the next change asks again). Else copy
           the records appended since ``base`` after the snapshot, sync, rename over the
           journal, sync the directory. The result is the same file an inline compaction
           followed by those appends would have left: a crash at any point leaves the old
           or the new file, each complete.
        """
        with self._lock, self._flock(fcntl.LOCK_EX):
            if self._fd < 0:
                return
            self._catch_up(writing=True)
            if self._needs_compaction or not self._compaction_wanted():
                return
            canonical = [self._canon[gid] for gid in self._entries]  # encoded below, outside the locks
            base, base_records, identity = self._size, self._records, _identity(self._fd)
        snapshot = _snapshot_bytes(canonical)
        tmp = self._temp_path()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
        try:
            _write_all(fd, snapshot)
            _sync(fd)
            with self._lock, self._flock(fcntl.LOCK_EX):
                if self._fd < 0:
                    return
                self._catch_up(writing=True)
                if _identity(self._fd) != identity or self._size < base or not tmp.exists():
                    log.debug("grant journal changed hands during a compaction; the next change compacts again")
                    return
                tail = _read_from(self._fd, base, self._size - base)
                if tail:
                    _write_all(fd, tail)
                    _sync(fd)
                os.replace(tmp, self.path)
                os.fsync(self._dir_fd)
                new_fd = os.open(self.path, os.O_RDWR | os.O_APPEND)
                # The snapshot plus the tail's changes are exactly this process's caught-up view.
                records = self._records - base_records
                self._adopt(new_fd, _Parsed(self._entries, self._canon, good_size=len(snapshot) + len(tail)))
                self._records = records
        finally:
            os.close(fd)
            tmp.unlink(missing_ok=True)  # gone already after the rename

    def _compact(self) -> None:
        self._replace_with(_snapshot_bytes(self._canon[gid] for gid in self._entries))

    def _reset_empty(self) -> None:
        if self._entries:
            self._generation += 1
        self._entries, self._canon = {}, {}
        self._reindex()
        self._replace_with(_snapshot_bytes(()))

    # -- the derived views -------------------------------------------------------
    def _set(self, entry: JournalEntry, canon: str) -> None:
        if entry.grant_id in self._entries:
            self._unindex(self._entries[entry.grant_id])
        self._entries[entry.grant_id] = entry
        self._canon[entry.grant_id] = canon
        self._index(entry)

    def _drop(self, grant_id: str) -> None:
        entry = self._entries.pop(grant_id, None)
        self._canon.pop(grant_id, None)
        if entry is not None:
            self._unindex(entry)

    def _reindex(self) -> None:
        self._by_device, self._card_kinds = {}, {}
        self._kinds_changes += 1
        for entry in self._entries.values():
            self._index(entry)

    def _index(self, entry: JournalEntry) -> None:
        for device_id in entry.device_ids:
            self._by_device.setdefault(device_id, {})[entry.grant_id] = entry
        for card in entry.cards:
            kinds = self._card_kinds.setdefault(card, Counter())
            if not kinds[entry.kind]:
                self._kinds_changes += 1  # a kind new on this card
            kinds[entry.kind] += 1

    def _unindex(self, entry: JournalEntry) -> None:
        for device_id in entry.device_ids:
            holders = self._by_device.get(device_id)
            if holders is not None:
                holders.pop(entry.grant_id, None)
                if not holders:
                    del self._by_device[device_id]
        for card in entry.cards:
            kinds = self._card_kinds.get(card)
            if kinds is not None:
                kinds[entry.kind] -= 1
                if kinds[entry.kind] <= 0:
                    del kinds[entry.kind]
                    self._kinds_changes += 1  # its last entry of this kind left the card
                if not kinds:
                    del self._card_kinds[card]

    def _temp_path(self) -> Path:
        """This process's and thread's temp file for a new journal (swept by the next open if left behind)."""
        return self.dir / f"{FILE_NAME}.tmp-{os.getpid()}-{threading.get_ident()}"

    def _replace_with(self, data: bytes) -> None:
        """Write ``data`` as the whole journal: temp file, fsync, rename, directory fsync."""
        tmp = self._temp_path()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            _write_all(fd, data)
            _sync(fd)
        except BaseException:
            os.close(fd)
            tmp.unlink(missing_ok=True)
            raise
        os.close(fd)
        os.replace(tmp, self.path)
        os.fsync(self._dir_fd)
        new_fd = os.open(self.path, os.O_RDWR | os.O_APPEND)
        self._adopt(new_fd, _Parsed(self._entries, self._canon, good_size=len(data)))

    def _prepare_dir(self) -> None:
        """Create the data directory 0700, or check the existing one (never chmodded: ``datadir.py``)."""
        datadir.prepare(self.dir)

    def _set_aside(self, reason: str) -> None:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        target = self.dir / f"journal.corrupt-{stamp}"
        n = 1
        while target.exists():
            target = self.dir / f"journal.corrupt-{stamp}.{n}"
            n += 1
        os.replace(self.path, target)
        self.corrupt_set_aside = target
        log.error(
            "grant journal %s is corrupt (%s); moved to %s and starting empty - grants it held are "
            "reported as leaked when a live allocation still uses them",
            self.path,
            reason,
            target,
        )


def _identity(fd: int) -> tuple[int, int]:
    """Which file ``fd`` is (inode, device): a compaction by another process replaces it."""
    st = os.fstat(fd)
    return st.st_ino, st.st_dev


def _read_from(fd: int, offset: int, size: int) -> bytes:
    chunks = []
    while size > 0:
        chunk = os.pread(fd, size, offset)
        if not chunk:
            break
        chunks.append(chunk)
        offset += len(chunk)
        size -= len(chunk)
    return b"".join(chunks)
