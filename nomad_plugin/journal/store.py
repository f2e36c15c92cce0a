"""The grant journal: one checksummed JSON snapshot of every grant, rewritten whole on every change.

Nomad never says when a task ended, so the plugin remembers each grant to
release it later (docs/reserve.md). As kubelet's device-manager checkpoint
(``pkg/kubelet/checkpointmanager``), a change writes a temp file, fsyncs it,
renames it over ``<data_dir>/journal.json`` and fsyncs the directory before
it returns. The file is ``{"checksum": "sha256:<hex>", "entries": [...],
"version": 1}``, the checksum over the canonical JSON of ``entries``; one
that does not verify, or carries anything after the snapshot, is set aside.
Several processes may open
one journal: a change holds an exclusive ``flock`` on the directory and
first reads the file again if another process replaced it (a new inode per
write; the one last read stays open, so it is not reused).
"""

from __future__ import annotations

import enum
import fcntl
import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Collection, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import IO, Any

from nomad_plugin.journal import datadir
from nomad_plugin.model.errors import PluginError
from nomad_plugin.model.grant import DeviceAsk, GrantedDevice

log = logging.getLogger(__name__)

VERSION = 1
FILE_NAME = "journal.json"
#: Far above any node's instance count (16 cards x 10 shares = 160).
MAX_GRANTS = 4096
MAX_BYTES = 16 * 1024 * 1024


class EntryState(enum.Enum):
    INTENT = "intent"  # written before Allocate: XDM may hold the grant, or commit it until settle_until
    GRANTED = "granted"  # Allocate succeeded
    RELEASING = "releasing"  # retried until a release at or after settle_until succeeds


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
    # Unix seconds until which XDM may still commit this grant (0 once XDM answered the Allocate):
    # until then a release, even one answered "not found", is not final and the entry stays.
    settle_until: float = 0.0

    def with_state(self, state: EntryState, granted: tuple[GrantedDevice, ...] | None = None) -> JournalEntry:
        return replace(self, state=state, granted=self.granted if granted is None else granted)

    @cached_property
    def canonical(self) -> str:  # made once: every write encodes every entry, nearly all unchanged
        return _canonical(self.to_json())

    def to_json(self) -> dict[str, Any]:
        raw = {n: getattr(self, n) for n in ("grant_id", "group", "kind", "created_at", "settle_until")}
        raw.update(device_ids=list(self.device_ids), cards=list(self.cards), state=self.state.value)
        raw["asks"] = [{n: getattr(a, n) for n in _ASK_FIELDS} for a in self.asks]
        raw["granted"] = [{n: getattr(d, n) for n in _GRANTED_FIELDS} for d in self.granted]
        return raw

    @classmethod
    def from_json(cls, raw: Any) -> JournalEntry:
        """Parse one entry; raises ``ValueError`` naming the bad field."""
        if not isinstance(raw, dict):
            raise ValueError(f"entry is {type(raw).__name__}, not an object")
        return cls(
            grant_id=_typed(raw, "grant_id", "a string"),
            device_ids=tuple(_typed(raw, "device_ids", "a list of strings")),
            group=_typed(raw, "group", "a string"),
            kind=_typed(raw, "kind", "a string"),
            cards=tuple(_typed(raw, "cards", "a list of strings")),
            asks=tuple(
                DeviceAsk(**{n: _typed(a, n, "an integer") for n in _ASK_FIELDS})
                for a in _typed(raw, "asks", "a list of objects")
            ),
            granted=tuple(
                GrantedDevice(**{n: _typed(d, n, kind) for n, kind in _GRANTED_FIELDS.items()})
                for d in _typed(raw, "granted", "a list of objects")
            ),
            created_at=float(_typed(raw, "created_at", "a number")),
            state=EntryState(_typed(raw, "state", "one of intent/granted/releasing")),
            settle_until=float(_typed(raw, "settle_until", "a number")) if "settle_until" in raw else 0.0,
        )


_ASK_FIELDS = ("minor", "core", "memory_gib", "slices")
_GRANTED_FIELDS = {n: "a string" if n.endswith("uuid") else "an integer" for n in GrantedDevice.__dataclass_fields__}
_IS = {
    "a string": lambda v: isinstance(v, str),
    "an integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "a number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "a list of strings": lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
    "a list of objects": lambda v: isinstance(v, list) and all(isinstance(x, dict) for x in v),
    "one of intent/granted/releasing": lambda v: isinstance(v, str) and v in {s.value for s in EntryState},
}


def _typed(raw: dict[str, Any], name: str, kind: str) -> Any:
    if name not in raw:
        raise ValueError(f"field {name!r} missing")
    value = raw[name]
    if not _IS[kind](value):
        shown = "" if kind == "a list of objects" else f" = {value!r}"
        raise ValueError(f"field {name!r}{shown} is not {kind}")
    return value


class JournalFull(PluginError):
    """The journal holds ``max_entries`` grants; refuse new ones instead of growing."""


class JournalCorrupt(ValueError):
    """The reason the file cannot be trusted."""


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def checksum(body: Any) -> str:
    """Of a snapshot's ``entries``."""
    return "sha256:" + hashlib.sha256(_canonical(body).encode()).hexdigest()


def encode(entries: Iterable[JournalEntry]) -> bytes:
    # The canonical JSON of the entries list, byte for byte what checksum() hashes.
    body = "[" + ",".join(e.canonical for e in entries) + "]"
    digest = "sha256:" + hashlib.sha256(body.encode()).hexdigest()
    return f'{{"checksum": "{digest}", "entries": {body}, "version": {VERSION}}}\n'.encode()


def decode(data: bytes) -> list[JournalEntry]:
    return list(_parse_file(data).values())


def _parse_file(data: bytes) -> dict[str, JournalEntry]:
    """The entries by grant id; anything but whitespace after the snapshot is corruption."""
    try:
        text = data.decode()
        doc, end = json.JSONDecoder().raw_decode(text, len(text) - len(text.lstrip()))
    except ValueError as exc:  # UnicodeDecodeError included
        raise JournalCorrupt(f"not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise JournalCorrupt("top level is not an object")
    if doc.get("version") != VERSION:
        raise JournalCorrupt(f"version {doc.get('version')!r}, expected {VERSION}")
    body = doc.get("entries")
    if not isinstance(body, list):
        raise JournalCorrupt("'entries' is not a list")
    if doc.get("checksum") != checksum(body):
        raise JournalCorrupt("checksum mismatch")
    entries: dict[str, JournalEntry] = {}
    for i, raw in enumerate(body):
        entry = _entry(raw, f"entry {i}")
        if entry.grant_id in entries:
            raise JournalCorrupt(f"entry {i}: duplicate grant id {entry.grant_id}")
        entries[entry.grant_id] = entry
    if text[end:].strip():
        raise JournalCorrupt("extra data after the snapshot")
    return entries


def _entry(raw: Any, where: str) -> JournalEntry:
    try:
        return JournalEntry.from_json(raw)
    except ValueError as exc:
        raise JournalCorrupt(f"{where}: {exc}") from None


class Journal:
    """Grant id -> entry, on disk before each change returns; safe across threads and processes."""

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        max_entries: int = MAX_GRANTS,
        max_bytes: int = MAX_BYTES,
    ) -> None:
        self.dir = datadir.prepare(data_dir)
        self.path = self.dir / FILE_NAME
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self.corrupt_set_aside: Path | None = None
        self._entries: dict[str, JournalEntry] = {}
        self._file: IO[bytes] | None = None  # the file as this process last read or wrote it
        self._lock = threading.Lock()
        with self._locked(fcntl.LOCK_EX) as dir_fd:
            for stale in self.dir.glob(FILE_NAME + ".tmp-*"):
                stale.unlink(missing_ok=True)  # a writer that died between creating and renaming it
            try:
                self._load()
            except JournalCorrupt as exc:
                self._set_aside(str(exc))  # leaves no file read: a fresh, empty one is written
            if self._file is None:
                self._write(self._entries, dir_fd)

    @classmethod
    def snapshot(cls, data_dir: str | os.PathLike[str]) -> list[JournalEntry]:
        """The entries on disk, read without writing (operator commands next to the plugin); absent = empty."""
        path = Path(data_dir) / FILE_NAME
        return decode(path.read_bytes()) if path.exists() else []

    def entries(self) -> list[JournalEntry]:
        return list(self._current().values())

    def get(self, grant_id: str) -> JournalEntry | None:
        return self._current().get(grant_id)

    def __len__(self) -> int:
        return len(self._current())

    def put(self, entry: JournalEntry, remove: Collection[str] = ()) -> None:
        """Add or replace ``entry``, and drop the grants ``remove`` names, in one write."""
        with self._locked(fcntl.LOCK_EX) as dir_fd:
            self._catch_up()
            kept = {g: e for g, e in self._entries.items() if g not in remove} if remove else self._entries
            if entry.grant_id not in kept and len(kept) >= self.max_entries:
                raise JournalFull(
                    f"the grant journal holds {len(kept)} grants (limit {self.max_entries}); "
                    "grants are not being released - check the reconciler and the Nomad API"
                )
            self._write({**kept, entry.grant_id: entry}, dir_fd)

    def remove(self, grant_id: str) -> bool:
        with self._locked(fcntl.LOCK_EX) as dir_fd:
            self._catch_up()
            if grant_id not in self._entries:
                return False
            self._write({g: e for g, e in self._entries.items() if g != grant_id}, dir_fd)
            return True

    def close(self) -> None:
        """Let go of the file (a later call opens it again)."""
        with self._lock:
            file, self._file = self._file, None
        if file is not None:
            file.close()

    def _current(self) -> dict[str, JournalEntry]:
        """Caught up with other processes; a new dict on every change, never changed in place."""
        with self._locked(fcntl.LOCK_SH):
            self._catch_up()
            return self._entries

    @contextmanager
    def _locked(self, kind: int) -> Iterator[int]:
        """This thread's turn, and the directory's ``flock`` among processes."""
        with self._lock:
            dir_fd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                fcntl.flock(dir_fd, kind)
                yield dir_fd
            finally:
                os.close(dir_fd)  # drops the flock

    def _catch_up(self) -> None:
        """Read the file again if another process replaced it (a deleted one: this view stands, a write restores it)."""
        try:
            on_disk = os.stat(self.path)
        except FileNotFoundError:
            return
        if self._file is not None:
            mine = os.fstat(self._file.fileno())
            if (on_disk.st_ino, on_disk.st_dev) == (mine.st_ino, mine.st_dev):
                return
        self._load()

    def _load(self) -> None:
        """Read the file (absent: nothing), or raise ``JournalCorrupt``."""
        try:
            file = open(self.path, "rb")  # kept open as _file
        except FileNotFoundError:
            return
        try:
            size = os.fstat(file.fileno()).st_size
            if size > self.max_bytes:
                raise JournalCorrupt(f"{size} bytes, over the {self.max_bytes}-byte bound")
            entries = _parse_file(file.read())
        except BaseException:
            file.close()
            raise
        self._adopt(entries, file)

    def _write(self, entries: dict[str, JournalEntry], dir_fd: int) -> None:
        """Replace the file with ``entries``: temp file, fsync, rename, directory fsync (caller holds the flock)."""
        data = encode(entries.values())
        tmp = self.dir / f"{FILE_NAME}.tmp-{os.getpid()}-{threading.get_ident()}"
        file = os.fdopen(os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600), "rb")
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(file.fileno(), view) :]
            os.fsync(file.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            file.close()
            tmp.unlink(missing_ok=True)
            raise
        self._adopt(entries, file)
        os.fsync(dir_fd)

    def _adopt(self, entries: dict[str, JournalEntry], file: IO[bytes]) -> None:
        if self._file is not None:
            self._file.close()
        self._entries, self._file = entries, file

    def _set_aside(self, reason: str) -> None:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        target, n = self.dir / f"journal.corrupt-{stamp}", 0
        while target.exists():
            n += 1
            target = self.dir / f"journal.corrupt-{stamp}.{n}"
        os.replace(self.path, target)
        self.corrupt_set_aside = target
        self._entries = {}
        why = "grants it held are reported as leaked when a live allocation still uses them"
        log.error(
            "grant journal %s is corrupt (%s); moved to %s and starting empty - %s", self.path, reason, target, why
        )
