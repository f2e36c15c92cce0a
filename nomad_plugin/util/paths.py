"""Path rules that need no disk: which ``data_dir`` values can never be the plugin's own directory.

Pure (no I/O), so SetConfig's decoder can refuse them before anything runs;
``journal/datadir.py`` applies the same rules again to the path a symlink
resolves to, and adds what only the disk can tell (owner, mode).

A ``data_dir`` is a directory the plugin creates and owns (0700). It must
therefore be an absolute, normalised path, free of control characters and
``..``, and neither a directory the system owns nor a shared scratch
directory: ``data_dir = ""`` once put the journal in the agent's working
directory (typically ``/``), and start-up changed that directory's mode.
"""

from __future__ import annotations

import posixpath
import re

#: Directories the system owns: never the plugin's own directory (a directory below them is fine).
SYSTEM_DIRS = frozenset(
    {
        "/",
        "/bin",
        "/boot",
        "/etc",
        "/home",
        "/lib",
        "/lib32",
        "/lib64",
        "/libx32",
        "/media",
        "/mnt",
        "/opt",
        "/root",
        "/run",
        "/sbin",
        "/srv",
        "/tmp",  # noqa: S108 - named to be refused, never used
        "/usr",
        "/usr/bin",
        "/usr/lib",
        "/usr/lib64",
        "/usr/libexec",
        "/usr/local",
        "/usr/local/bin",
        "/usr/local/lib",
        "/usr/local/sbin",
        "/usr/sbin",
        "/usr/share",
        "/var",
        "/var/cache",
        "/var/lib",
        "/var/local",
        "/var/lock",
        "/var/log",
        "/var/mail",
        "/var/opt",
        "/var/run",
        "/var/spool",
        "/var/tmp",  # noqa: S108 - named to be refused, never used
        "/run/lock",
        "/run/user",
    }
)
#: Kernel and device filesystems: nothing below them can hold a journal.
PSEUDO_TREES = ("/proc", "/sys", "/dev")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def under(path: str, tree: str) -> bool:
    """``path`` is ``tree`` or lies below it (both absolute and normalised)."""
    return path == tree or tree == "/" or path.startswith(tree.rstrip("/") + "/")


def data_dir_problem(path: str) -> str | None:
    """Why ``path`` can never be the plugin's data directory, or None when it may be."""
    if not path:
        return "is empty (the journal would land in the agent's working directory)"
    if _CONTROL.search(path):
        return "holds a control character"
    if not path.startswith("/"):
        return "is relative (it would resolve against the agent's working directory)"
    if ".." in path.split("/"):
        return "has a '..' component"
    normal = posixpath.normpath(path)
    if normal.startswith("//"):
        normal = normal[1:]
    if normal in SYSTEM_DIRS:
        return f"is the system directory {normal} (use a directory of the plugin's own below it)"
    for tree in PSEUDO_TREES:
        if under(normal, tree):
            return f"lies in {tree}, a kernel or device filesystem"
    return None
