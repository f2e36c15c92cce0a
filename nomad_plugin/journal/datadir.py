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

import os
import stat
from pathlib import Path

from nomad_plugin.model.errors import PluginError
from nomad_plugin.util.text import data_dir_problem

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
