"""Grant ids leased in durable blocks, so a Reserve needs only one ``fdatasync``.

Why: a Reserve used to sync twice, the intent before ``Allocate`` and the
grant after it (issue 14: the p99 of two syncs on a shared disk is what kept
Reserve above x3 a raw Allocate). XDM has no RPC that lists grants, but the
plugin chooses every grant's id and XDM's ``Release`` of an id it does not
hold answers "not found", which counts as released (docs/reserve.md, route
(d)). So the plugin can name, durably and ahead of time, every id it may
hand to ``Allocate``: a *lease* is a random seed and a counter range, and
its ids are derived from them (``derive``), in order. The intent record is
then appended without its own sync:

- a crash of the plugin process (SIGKILL, OOM kill) keeps the intent: the
  ``write`` is in the page cache, which the kernel writes out;
- a crash of the machine (power loss) may lose it, but the boot id changes
  (``/proc/sys/kernel/random/boot_id``); at start-up, every id of a lease
  taken in an earlier boot that the journal does not name is released
  (``stale_ids``): that includes any grant whose intent was lost. Leases of
  this boot need nothing: their intents are in the journal.

One lease covers ``DEFAULT_BLOCK`` ids; the next one is written in the
background when half of the current one is used, so no Reserve waits for it
(only when ids run out faster than a lease is written does ``take`` wait for
that write, or write one itself after a failed one). A lease leaves the file when it is used up and none of its ids
is still in flight (``settled``): by then every intent it gave out was
synced with a later journal record.

File: ``<data_dir>/grant-ids.json`` (0600), replaced atomically (temp file,
fsync, rename, directory fsync) under an exclusive ``flock`` on
``grant-ids.lock``, so several processes (tests, an operator command) may
share the data directory without losing each other's leases.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nomad_plugin.goplugin.logging import get_logger

log = get_logger(__name__)

FILE_NAME = "grant-ids.json"
LOCK_NAME = "grant-ids.lock"
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
#: Ids per lease: after a power loss, at most this many ``Release`` calls per lease left behind.
DEFAULT_BLOCK = 256
VERSION = 1


def read_boot_id(path: str = BOOT_ID_PATH) -> str:
    """This boot's id (changes at every boot); "" where the kernel has none (never treated as this boot)."""
    try:
        with open(path) as fh:
            return fh.read().strip()
    except OSError:
        return ""


def derive(seed: str, counter: int) -> str:
    """The grant id number ``counter`` of the lease ``seed``: a UUID4-shaped string, unguessable without the seed."""
    digest = hashlib.sha256(f"{seed}/{counter}".encode()).digest()[:16]
    return str(uuid.UUID(bytes=digest, version=4))


@dataclass(frozen=True)
class Lease:
    """Ids ``derive(seed, start)`` .. ``derive(seed, end - 1)``, taken in boot ``boot_id``."""

    seed: str
    start: int
    end: int
    boot_id: str

    def ids(self) -> list[str]:
        return [derive(self.seed, n) for n in range(self.start, self.end)]

    def to_json(self) -> dict[str, Any]:
        return {"seed": self.seed, "start": self.start, "end": self.end, "boot_id": self.boot_id}

    @classmethod
    def from_json(cls, raw: Any) -> Lease:
        if not isinstance(raw, dict):
            raise ValueError(f"lease {raw!r} is not an object")
        seed, start, end, boot = raw.get("seed"), raw.get("start"), raw.get("end"), raw.get("boot_id")
        if not isinstance(seed, str) or not seed:
            raise ValueError(f"lease seed {seed!r} is not a non-empty string")
        if not isinstance(start, int) or not isinstance(end, int) or not 0 <= start <= end:
            raise ValueError(f"lease range {start!r}..{end!r} is not 0 <= start <= end")
        if not isinstance(boot, str):
            raise ValueError(f"lease boot_id {boot!r} is not a string")
        return cls(seed, start, end, boot)


class GrantIds:
    """Hands out grant ids from durable leases; thread-safe. Creating one does no I/O."""

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        block: int = DEFAULT_BLOCK,
        boot_id: Callable[[], str] = read_boot_id,
    ) -> None:
        if block < 2:
            raise ValueError(f"block: {block} ids per lease; at least 2")
        self.dir = Path(data_dir)
        self.path = self.dir / FILE_NAME
        self.block = block
        self._boot_id = boot_id
        self._lock = threading.Lock()
        self._prefetched = threading.Condition(self._lock)  # a prefetch finished (well or not)
        self._current: Lease | None = None
        self._next_counter = 0
        self._upcoming: Lease | None = None  # written ahead, used when the current one runs out
        self._prefetching = False
        #: seed -> ids taken and not yet settled (their intent may not be durable yet).
        self._in_flight: dict[str, int] = {}
        self._seed_of: dict[str, str] = {}
        self._retired: set[str] = set()  # seeds used up in this process, dropped at the next write

    # -- handing out ---------------------------------------------------------------
    def take(self) -> str:
        """The next grant id; its lease is durable before this returns. Call ``settled`` when done."""
        with self._lock:
            if self._current is None or self._next_counter >= self._current.end:
                self._switch()
            lease = self._current
            assert lease is not None
            grant_id = derive(lease.seed, self._next_counter)
            self._next_counter += 1
            self._in_flight[lease.seed] = self._in_flight.get(lease.seed, 0) + 1
            self._seed_of[grant_id] = lease.seed
            if lease.end - self._next_counter <= self.block // 2 and self._upcoming is None and not self._prefetching:
                self._prefetching = True
                threading.Thread(target=self._prefetch, name="grant-ids-lease", daemon=True).start()
            return grant_id

    def settled(self, grant_id: str) -> None:
        """``grant_id``'s Reserve made a durable journal write after its intent (or ended before Allocate)."""
        with self._lock:
            seed = self._seed_of.pop(grant_id, None)
            if seed is None:
                return
            left = self._in_flight[seed] - 1
            if left:
                self._in_flight[seed] = left
            else:
                del self._in_flight[seed]

    def prepare(self) -> None:
        """Write the first lease now (at start-up), so the first Reserve does not."""
        with self._lock:
            if self._current is None:
                self._switch()

    def _switch(self) -> None:
        """Move to the upcoming lease, writing one now if none is ready (caller holds ``_lock``)."""
        if self._current is not None:
            self._retired.add(self._current.seed)
        while self._prefetching:  # one is being written: use it rather than write another
            self._prefetched.wait()
        lease = self._upcoming
        if lease is None:
            lease = self._new_lease()
            drop = self._droppable()
            self._write(add=lease, drop=drop)
            self._retired -= drop
        self._upcoming = None
        self._current, self._next_counter = lease, lease.start

    def _prefetch(self) -> None:
        lease = self._new_lease()
        with self._lock:
            drop = self._droppable()
        try:
            self._write(add=lease, drop=drop)
        except Exception:
            log.exception("writing the next grant-id lease failed; the Reserve that needs it writes it")
            with self._lock:
                self._prefetching = False
                self._prefetched.notify_all()
            return
        with self._lock:
            self._retired -= drop
            self._upcoming = lease
            self._prefetching = False
            self._prefetched.notify_all()

    def _new_lease(self) -> Lease:
        return Lease(os.urandom(16).hex(), 0, self.block, self._boot_id())

    def _droppable(self) -> set[str]:
        """Seeds of this process's leases that are used up with nothing in flight (caller holds ``_lock``)."""
        return {seed for seed in self._retired if seed not in self._in_flight}

    # -- start-up ------------------------------------------------------------------
    def stale_ids(self, journalled: Callable[[str], bool]) -> list[str]:
        """Ids that may hold a grant nobody journalled: from leases of an earlier boot, not named by the journal.

        Call ``forget_stale`` once they are released. Leases of this boot are
        left alone here: their intents reached the journal (the page cache
        survives a process crash).
        """
        out: list[str] = []
        boot = self._boot_id()
        for lease in self._read():
            if not boot or lease.boot_id != boot:
                out.extend(gid for gid in lease.ids() if not journalled(gid))
        return out

    def forget_stale(self) -> None:
        """Drop every lease not held by this process: those of an earlier boot (released) and of dead processes.

        Call only at start-up, as the journal's single owner (``plugin.lock``),
        after ``stale_ids`` were released.

        Runs beside Reserves (the startup thread): it holds ``_lock`` through
        the write and waits out a prefetch, so no lease this process is writing
        can be left out of ``mine``, and it removes temp files only under the
        flock, where no writer can be between creating one and renaming it.
        """
        with self._lock:
            while self._prefetching:
                self._prefetched.wait()
            mine = {lease.seed for lease in (self._current, self._upcoming) if lease is not None}
            mine |= set(self._in_flight)
            self._write(keep=lambda lease: lease.seed in mine, sweep=True)

    # -- the file ------------------------------------------------------------------
    @contextmanager
    def _flock(self) -> Iterator[None]:
        fd = os.open(self.dir / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # drops the flock

    def _read(self) -> list[Lease]:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return []
        try:
            doc = json.loads(data)
            if not isinstance(doc, dict) or doc.get("version") != VERSION:
                raise ValueError(f"version {doc.get('version') if isinstance(doc, dict) else doc!r}")
            raw = doc.get("leases")
            if not isinstance(raw, list):
                raise ValueError("'leases' is not a list")
            return [Lease.from_json(item) for item in raw]
        except ValueError as exc:
            # Written only by atomic rename, so this is outside damage; refuse rather than forget ids.
            raise OSError(f"grant-id lease file {self.path} is unreadable: {exc}") from None

    def _write(
        self,
        *,
        add: Lease | None = None,
        drop: frozenset[str] | set[str] = frozenset(),
        keep: Callable[[Lease], bool] | None = None,
        sweep: bool = False,
    ) -> None:
        """Read-modify-write the lease list atomically (temp file, fsync, rename, directory fsync), under the flock.

        ``sweep`` first removes temp files left by a writer that died: under the
        flock none is in use.
        """
        with self._flock():
            if sweep:
                for stale in self.dir.glob(FILE_NAME + ".tmp-*"):
                    stale.unlink(missing_ok=True)
            leases = [lease for lease in self._read() if lease.seed not in drop]
            if keep is not None:
                leases = [lease for lease in leases if keep(lease)]
            if add is not None:
                leases.append(add)
            body = json.dumps({"version": VERSION, "leases": [lease.to_json() for lease in leases]}).encode()
            tmp = self.dir / f"{FILE_NAME}.tmp-{os.getpid()}-{threading.get_ident()}"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                view = memoryview(body)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
            dir_fd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
