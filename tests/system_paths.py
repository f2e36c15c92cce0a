"""The system paths the product uses, watched so that no test changes them.

Tests write only under temporary directories. A test that takes a default
(``data_dir``, the XDM socket directory, the unpack cache) writes where a real
node keeps its state, so tests/conftest.py snapshots these paths when the
session starts and fails the run when any of them differs at its end.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from nomad_plugin.config.options import DEFAULT_SOCKET_DIR, OPTIONS

_DEFAULT_DATA_DIR = next(o.default for o in OPTIONS if o.name == "data_dir")

SYSTEM_PATHS: tuple[str, ...] = (
    str(_DEFAULT_DATA_DIR),  # data_dir's default: the grant journal
    "/var/cache/nomad-device-lingjun",  # the shipped file's unpack cache without HOME
    "/run/amp",  # XDM's socket tree (DEFAULT_SOCKET_DIR lives under it)
    str(Path(DEFAULT_SOCKET_DIR)),
    "/etc/nomad",
    "/etc/nomad.d",  # the agent's configuration
    "/opt/nomad",  # the agent's data_dir and plugin_dir in the docs
    "/var/lib/nomad",
    "/usr/local/harp",  # lj-runtime's install directory (doctor reads it)
    "/etc/containerd",
)
# More roots, for the test that proves the guard fails a run (tests/test_system_paths.py).
EXTRA_ENV = "LINGJUN_TEST_GUARD_EXTRA_PATHS"
MAX_ENTRIES = 5000  # per root: enough for these trees, bounded if one is huge


def guarded() -> tuple[str, ...]:
    extra = [p for p in os.environ.get(EXTRA_ENV, "").split(os.pathsep) if p]
    return (*SYSTEM_PATHS, *extra)


def snapshot(roots: tuple[str, ...] | None = None) -> dict[str, tuple[object, ...]]:
    """path -> (type, mode, uid, size, mtime_ns, inode) for each root and what lies under it."""
    roots = guarded() if roots is None else roots
    seen: dict[str, tuple[object, ...]] = {}
    for root in roots:
        count = 0
        stack = [Path(root)]
        while stack and count < MAX_ENTRIES:
            path = stack.pop()
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                seen[str(path)] = ("absent",)
                continue
            except OSError as exc:
                seen[str(path)] = ("unreadable", exc.errno)
                continue
            count += 1
            seen[str(path)] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_uid, st.st_size,
                               st.st_mtime_ns, st.st_ino)  # fmt: skip
            if stat.S_ISDIR(st.st_mode):
                try:
                    stack.extend(sorted(path.iterdir()))
                except OSError:
                    pass
    return seen


def changes(before: dict[str, tuple[object, ...]], after: dict[str, tuple[object, ...]]) -> list[str]:
    """What differs, one line per path ("created", "removed", "changed")."""
    lines = []
    for path in sorted(set(before) | set(after)):
        old, new = before.get(path, ("absent",)), after.get(path, ("absent",))
        if old == new:
            continue
        if old == ("absent",):
            lines.append(f"created {path}")
        elif new == ("absent",):
            lines.append(f"removed {path}")
        else:
            lines.append(f"changed {path}")
    return lines
