"""Who may write the journal: the running plugin, or (while it is stopped) one operator command.

The plugin holds an exclusive ``flock`` on ``<data_dir>/plugin.lock`` for its
whole life; the kernel drops it when the process dies, even by SIGKILL, so
a stale lock cannot exist. ``nomad-device-lingjun grants release`` tries the
same lock without waiting: if it gets it, no plugin runs and it releases
the grant itself (holding the lock, so a plugin that starts meanwhile waits
for it before opening the journal); if not, it asks the running plugin
through a request file (``reconcile/requests.py``) and the plugin does the
release. Either way exactly one process writes the journal: no lost update.
A second plugin process on the same ``data_dir`` never opens the journal
while another process holds the lock: it serves fingerprints, refuses
Reserve and waits for the lock (``app.py``).
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

from nomad_plugin.journal import datadir

LOCK_NAME = "plugin.lock"


class OwnerLock:
    def __init__(self, data_dir: str | os.PathLike[str]) -> None:
        self.path = Path(data_dir) / LOCK_NAME
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, timeout: float = 0.0, poll: float = 0.05) -> bool:
        """Take the lock, waiting up to ``timeout`` seconds; False if another process keeps it."""
        if self._fd is not None:
            return True
        datadir.prepare(self.path.parent)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    return False
                time.sleep(poll)
                continue
            break
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return True

    def holder(self) -> int | None:
        """The pid the lock file names (the process holding the lock, or its last holder); None if unreadable."""
        try:
            text = self.path.read_text(errors="replace").strip()
        except OSError:
            return None
        return int(text) if text.isdigit() else None

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def __enter__(self) -> OwnerLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def plugin_running(data_dir: str | os.PathLike[str]) -> bool:
    """True when another process (the plugin) holds the owner lock of ``data_dir``.

    Read-only: the lock file is opened for reading, never created or written, so an
    operator command that only looks (doctor, ``grants`` listing) leaves the data dir as found.
    A shared lock conflicts with the plugin's exclusive one and with nothing else."""
    try:
        fd = os.open(Path(data_dir) / LOCK_NAME, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)
