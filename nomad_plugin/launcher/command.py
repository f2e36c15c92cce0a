"""Which executable the launcher starts as "the plugin".

Operator commands run inside the plugin's own file (the console script, the
shipped executable in plugin_dir), so by default they launch that same file: what runs
is exactly what Nomad would run. Run from elsewhere (pytest, ``python -m``),
they fall back to ``<this interpreter> -m nomad_plugin`` with this package on
``PYTHONPATH``. ``--plugin PATH`` or ``$NOMAD_DEVICE_LINGJUN_PLUGIN`` picks
another file.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from nomad_plugin import PLUGIN_NAME

PLUGIN_ENV = "NOMAD_DEVICE_LINGJUN_PLUGIN"
PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])


def is_plugin_file(path: str) -> bool:
    p = Path(path)
    return p.name.startswith(PLUGIN_NAME) and p.is_file() and os.access(p, os.X_OK)


def plugin_command(explicit: str | None = None, argv0: str | None = None) -> list[str]:
    """The argv that starts the plugin (no arguments: Nomad passes none unless ``args`` is set)."""
    chosen = explicit or os.environ.get(PLUGIN_ENV)
    if chosen:
        return [str(Path(chosen).absolute())]
    own = sys.argv[0] if argv0 is None else argv0
    if own and is_plugin_file(own):
        return [str(Path(own).absolute())]
    return [sys.executable, "-m", "nomad_plugin"]


def plugin_env(command: list[str], base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for the plugin: ours, plus PYTHONPATH for the ``-m`` fallback."""
    env = dict(os.environ if base is None else base)
    if command[1:2] == ["-m"]:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (PACKAGE_PARENT, env.get("PYTHONPATH", "")) if p)
    return env
