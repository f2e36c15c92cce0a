"""The plugin's own data directory: created 0700 and owned by the plugin, or refused.

``data_dir`` holds the grant journal, the grant-id leases, the owner lock,
the reconciler's state and the operator's release requests. The plugin never
changes the mode of a directory it did not create: a ``data_dir`` naming a
directory that exists must already be the plugin's kind of directory (owned
by the plugin's user, writable by nobody else, not sticky, not a system
directory once symlinks are followed), else it is refused with the reason.
One that does not exist is created: missing parents 0755, itself 0700, both
set exactly (whatever the umask), because the plugin made them.

``problem`` only looks (SetConfig may not create anything: Nomad's first two
launches of the plugin are killed at once); ``prepare`` creates or checks.
"""

from __future__ import annotations

import fcntl
import os
import stat
import time
from pathlib import Path

from nomad_plugin.model.errors import PluginError
from nomad_plugin.util.paths import data_dir_problem

DIR_MODE = 0o700
PARENT_MODE = 0o755


class DataDirRefused(PluginError):
    """``data_dir`` cannot be the plugin's own directory; the message says why."""


def _existing_problem(path: Path, st: os.stat_result) -> str | None:
    if not stat.S_ISDIR(st.st_mode):
        return "exists but is not a directory"
    real = os.path.realpath(path)
    if real != str(path):
        found = data_dir_problem(real)
        if found is not None:
            return f"resolves to {real}, which {found}"
    mode = stat.S_IMODE(st.st_mode)
    if mode & stat.S_ISVTX:
        return f"is a sticky shared directory (mode {mode:04o}): a directory of the plugin's own is needed"
    if mode & 0o022:
        return f"is writable by other users (mode {mode:04o}); the plugin never changes the mode of a directory it did not create"
    if st.st_uid != os.geteuid():
        return f"is owned by uid {st.st_uid}, not the plugin's uid {os.geteuid()}"
    return None


def problem(data_dir: str | os.PathLike[str]) -> str | None:
    """Why ``data_dir`` cannot be used, looking at the disk but changing nothing (None: usable or creatable)."""
    text = os.fspath(data_dir)
    found = data_dir_problem(text)
    if found is not None:
        return found
    path = Path(text)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot be read: {exc.strerror or exc}"
    return _existing_problem(path, st)


def prepare(data_dir: str | os.PathLike[str]) -> Path:
    """Create ``data_dir`` (0700, parents 0755) or check the existing one; ``DataDirRefused`` if it cannot be used."""
    text = os.fspath(data_dir)
    found = data_dir_problem(text)
    if found is not None:
        raise DataDirRefused(f"data_dir {text!r} {found}")
    path = Path(text)
    missing: list[Path] = []
    for candidate in (path, *path.parents):
        if os.path.lexists(candidate):
            break
        missing.append(candidate)
    for directory in reversed(missing):
        mode = DIR_MODE if directory == path else PARENT_MODE
        try:
            os.mkdir(directory, mode)
        except FileExistsError:
            continue  # made by someone else meanwhile: checked below like any existing directory
        except OSError as exc:
            raise DataDirRefused(f"data_dir {text!r}: cannot create {directory}: {exc.strerror or exc}") from None
        os.chmod(directory, mode)  # ours: exactly this mode, whatever the umask
    try:
        st = os.stat(path)
    except OSError as exc:
        raise DataDirRefused(f"data_dir {text!r} cannot be used: {exc.strerror or exc}") from None
    found = _existing_problem(path, st)
    if found is not None:
        raise DataDirRefused(f"data_dir {text!r} {found}")
    return path


# -- who may write the journal ----------------------------------------
# Who may write the journal: the running plugin, or (while it is stopped) one operator command.
#
# The plugin holds an exclusive ``flock`` on ``<data_dir>/plugin.lock`` for its
# whole life; the kernel drops it when the process dies, even by SIGKILL, so
# a stale lock cannot exist. ``nomad-device-lingjun grants release`` tries the
# same lock without waiting: if it gets it, no plugin runs and it releases
# the grant itself (holding the lock, so a plugin that starts meanwhile waits
# for it before opening the journal); if not, it asks the running plugin
# through a request file (``reconcile/requests.py``) and the plugin does the
# release. Either way exactly one process writes the journal: no lost update.
# A second plugin process on the same ``data_dir`` never opens the journal
# while another process holds the lock: it serves fingerprints, refuses
# Reserve and waits for the lock (``app.py``).

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
        prepare(self.path.parent)
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
