"""The journal file: atomic, durable, checksummed, bounded.

Layout: ``<data_dir>/journal.json`` (0600) in ``data_dir`` (0700)::

    {"version": 1, "checksum": "sha256:<hex>", "entries": [ ... ]}

``checksum`` is the SHA-256 of the canonical JSON of ``entries`` (sorted
keys, no spaces). Every change rewrites the whole file: write a temp file,
fsync it, rename it over the journal, fsync the directory. A crash at any
point leaves either the old or the new journal, never a torn one.

A journal that fails to load (bad JSON, wrong version, bad checksum, a bad
entry, too big) is renamed to ``journal.corrupt-<UTC time>`` and the plugin
starts with an empty journal; the reconciler then reports grants held by
live allocations as leaked (``corrupt_set_aside`` says where the old file went).
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from nomad_plugin.goplugin.logging import get_logger
from nomad_plugin.journal.entry import JournalEntry
from nomad_plugin.model.errors import PluginError

log = get_logger(__name__)

VERSION = 1
FILE_NAME = "journal.json"
#: Far above any node's instance count (16 cards x 10 shares = 160).
DEFAULT_MAX_ENTRIES = 4096
DEFAULT_MAX_BYTES = 16 * 1024 * 1024


class JournalFull(PluginError):
    """The journal holds ``max_entries`` grants; refuse new ones instead of growing."""


class JournalCorrupt(ValueError):
    """Raised by ``decode`` with the reason the file cannot be trusted."""


def encode(entries: Iterable[JournalEntry]) -> bytes:
    body = [e.to_json() for e in entries]
    return json.dumps(
        {"version": VERSION, "checksum": _checksum(body), "entries": body}, sort_keys=True, indent=1
    ).encode()


def decode(data: bytes) -> list[JournalEntry]:
    """Parse and verify a journal file's bytes, or raise ``JournalCorrupt``."""
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise JournalCorrupt(f"not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise JournalCorrupt("top level is not an object")
    if doc.get("version") != VERSION:
        raise JournalCorrupt(f"version {doc.get('version')!r}, expected {VERSION}")
    body = doc.get("entries")
    if not isinstance(body, list):
        raise JournalCorrupt("'entries' is not a list")
    if doc.get("checksum") != _checksum(body):
        raise JournalCorrupt("checksum mismatch")
    entries: list[JournalEntry] = []
    seen: set[str] = set()
    for i, raw in enumerate(body):
        try:
            entry = JournalEntry.from_json(raw)
        except ValueError as exc:
            raise JournalCorrupt(f"entry {i}: {exc}") from None
        if entry.grant_id in seen:
            raise JournalCorrupt(f"entry {i}: duplicate grant id {entry.grant_id}")
        seen.add(entry.grant_id)
        entries.append(entry)
    return entries


def _checksum(body: list[Any]) -> str:
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return "sha256:" + hashlib.sha256(canonical).hexdigest()


def _sync(fd: int) -> None:
    """fdatasync where there is one: a new file's data and size, without the atime churn."""
    sync = getattr(os, "fdatasync", os.fsync)
    sync(fd)


class Journal:
    """Thread-safe map grant id -> entry, persisted before each call returns."""

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        self.dir = Path(data_dir)
        self.path = self.dir / FILE_NAME
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.corrupt_set_aside: Path | None = None
        self._lock = threading.Lock()
        self._entries: dict[str, JournalEntry] = {}
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
        with self._lock:
            return list(self._entries.values())

    def get(self, grant_id: str) -> JournalEntry | None:
        with self._lock:
            return self._entries.get(grant_id)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    # -- writing (each durable before it returns) ----------------------------
    def put(self, entry: JournalEntry) -> None:
        with self._lock:
            if entry.grant_id not in self._entries and len(self._entries) >= self.max_entries:
                raise JournalFull(
                    f"the grant journal holds {len(self._entries)} grants (limit {self.max_entries}); "
                    "grants are not being released - check the reconciler and the Nomad API"
                )
            new = dict(self._entries)
            new[entry.grant_id] = entry
            self._write(new.values())
            self._entries = new

    def remove(self, grant_id: str) -> bool:
        with self._lock:
            if grant_id not in self._entries:
                return False
            new = {k: v for k, v in self._entries.items() if k != grant_id}
            self._write(new.values())
            self._entries = new
            return True

    # -- internals -------------------------------------------------------------
    def _open(self) -> None:
        self._prepare_dir()
        for stale in self.dir.glob(FILE_NAME + ".tmp-*"):
            stale.unlink(missing_ok=True)
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            self._write([])
            return
        try:
            if size > self.max_bytes:
                raise JournalCorrupt(f"{size} bytes, over the {self.max_bytes}-byte bound")
            entries = decode(self.path.read_bytes())
        except JournalCorrupt as exc:
            self._set_aside(str(exc))
            self._write([])
            return
        self._entries = {e.grant_id: e for e in entries}

    def _prepare_dir(self) -> None:
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        mode = stat.S_IMODE(self.dir.stat().st_mode)
        if mode & 0o077:
            os.chmod(self.dir, 0o700)
            log.warning("journal directory %s had mode %o; set to 0700", self.dir, mode)

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

    def _write(self, entries: Iterable[JournalEntry]) -> None:
        data = encode(entries)
        tmp = self.dir / f"{FILE_NAME}.tmp-{os.getpid()}-{threading.get_ident()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            _sync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        dir_fd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
