"""Running from the shipped executable (a PyInstaller bundle, ``make dist``).

PyInstaller's bootloader puts the bundle's own library directory first on
``LD_LIBRARY_PATH`` (the old value kept in ``LD_LIBRARY_PATH_ORIG``) before
Python starts. The dynamic loader read it at start-up, so this process keeps
loading its bundled libraries; but every child inherits the variable, and a
node program (``nvidia-smi``, ``nomad``) would then load our libstdc++ or
OpenSSL instead of its own. A child that is this same executable (the
launcher starts the plugin for ``doctor``, ``check-job``, ``demo``) must also
start as a new top-level instance, which PyInstaller does when
``PYINSTALLER_RESET_ENVIRONMENT`` is set.
"""

from __future__ import annotations

import sys
from collections.abc import MutableMapping


def frozen() -> bool:
    """True inside the shipped executable."""
    return bool(getattr(sys, "frozen", False))


def restore_child_environment(environ: MutableMapping[str, str]) -> None:
    """Give children the node's library path, not the bundle's (no-op outside the bundle)."""
    if not frozen():
        return
    original = environ.pop("LD_LIBRARY_PATH_ORIG", None)
    if original is None:
        environ.pop("LD_LIBRARY_PATH", None)
    else:
        environ["LD_LIBRARY_PATH"] = original
    environ["PYINSTALLER_RESET_ENVIRONMENT"] = "1"
