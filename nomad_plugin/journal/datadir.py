"""The plugin's own data directory, and the one process that may write in it.

The plugin never changes the mode of a directory it did not create: an
existing ``data_dir`` must be owned by the plugin's user, writable by nobody
else, not sticky and not a system directory (symlinks followed); a missing
one is created 0700 (parents 0755). ``problem`` only looks (SetConfig creates
nothing: Nomad kills the plugin's first two launches at once).

The journal's one writer holds an exclusive ``flock`` on ``plugin.lock``,
which the kernel drops when it dies, even by SIGKILL: the plugin for its
whole life, or ``grants release`` while no plugin runs (else it asks the
plugin, ``reconcile/requests.py``).
"""

from __future__ import annotations

import fcntl
import itertools
import json
import os
import stat
import threading
import time
from pathlib import Path
from typing import Any

from nomad_plugin.model.errors import PluginError
from nomad_plugin.util.text import data_dir_problem

DIR_MODE = 0o700
PARENT_MODE = 0o755


class DataDirRefused(PluginError):
    """``data_dir`` cannot be the plugin's own directory; the message says why."""


def problem(data_dir: str | os.PathLike[str]) -> str | None:
    """Why ``data_dir`` cannot be used (None: usable or creatable); changes nothing."""
    text = os.fspath(data_dir)
    found = data_dir_problem(text)
    if found is not None:
        return found
    try:
        st = os.stat(text)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot be read: {exc.strerror or exc}"
    if not stat.S_ISDIR(st.st_mode):
        return "exists but is not a directory"
    real = os.path.realpath(text)
    if real != os.path.normpath(text) and (found := data_dir_problem(real)) is not None:
        return f"resolves to {real}, which {found}"
    mode = stat.S_IMODE(st.st_mode)
    if mode & stat.S_ISVTX:
        return f"is a sticky shared directory (mode {mode:04o}): a directory of the plugin's own is needed"
    if mode & 0o022:
        return f"is writable by other users (mode {mode:04o}); the plugin never changes the mode of a directory it did not create"
    if st.st_uid != os.geteuid():
        return f"is owned by uid {st.st_uid}, not the plugin's uid {os.geteuid()}"
    return None


def prepare(data_dir: str | os.PathLike[str]) -> Path:
    """Create ``data_dir`` or check the existing one; ``DataDirRefused`` if it cannot be used."""
    text = os.fspath(data_dir)
    path = Path(text)
    if data_dir_problem(text) is None:
        for directory in reversed(list(itertools.takewhile(lambda p: not os.path.lexists(p), (path, *path.parents)))):
            mode = DIR_MODE if directory == path else PARENT_MODE
            try:
                os.mkdir(directory, mode)
                os.chmod(directory, mode)  # ours: exactly this mode, whatever the umask
            except FileExistsError:
                pass  # made by someone else meanwhile: checked below like any existing directory
            except OSError as exc:
                raise DataDirRefused(f"data_dir {text!r}: cannot create {directory}: {exc.strerror or exc}") from None
    found = problem(text) or (None if path.is_dir() else "cannot be created")
    if found is not None:
        raise DataDirRefused(f"data_dir {text!r} {found}")
    return path


OWNER_LOCK = "plugin.lock"


class OwnerLock:
    def __init__(self, data_dir: str | os.PathLike[str]) -> None:
        self.path = Path(data_dir) / OWNER_LOCK
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
        while not _try_flock(fd, fcntl.LOCK_EX):
            if time.monotonic() >= deadline:
                os.close(fd)
                return False
            time.sleep(poll)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return True

    def holder(self) -> int | None:
        """The pid the lock file names (its holder, or its last one)."""
        try:
            text = self.path.read_text(errors="replace").strip()
        except OSError:
            return None
        return int(text) if text.isdigit() else None

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # drops the flock

    def __enter__(self) -> OwnerLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _try_flock(fd: int, kind: int) -> bool:
    try:
        fcntl.flock(fd, kind | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def plugin_running(data_dir: str | os.PathLike[str]) -> bool:
    """Whether another process (the plugin) holds ``plugin.lock``; creates nothing."""
    try:
        fd = os.open(Path(data_dir) / OWNER_LOCK, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        return not _try_flock(fd, fcntl.LOCK_SH)
    finally:
        os.close(fd)


def write_state(path: Path, doc: Any) -> None:
    """A small JSON file (0600), replaced whole by a rename: a reader never sees half of it."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, json.dumps(doc, sort_keys=True).encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)
