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

import json
import os
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


# ``nomad-device-lingjun --self-check``: the interpreter pieces the shipped executable must carry.
#
# Hidden (not a subcommand in the usage text): tests/operator/test_dist.py runs
# it against ``dist/nomad-device-lingjun`` to show that the bundled interpreter,
# built for an old glibc (tools/build_python.py), still has a working ``ssl``
# (httpx to an https Nomad), ``ctypes`` (NVML through nvidia-ml-py),
# ``zlib`` and inotify (operator requests, ``util/dirwatch.py``, which would
# otherwise fall back to polling without a word in the bundle), whatever the
# node has installed.
#


def self_check() -> int:
    """Print one JSON object on stdout; exit 0 only when every check passed."""
    result: dict[str, object] = {"python": sys.version.split()[0], "frozen": bool(getattr(sys, "frozen", False))}
    ok = True
    try:
        import ssl

        context = ssl.create_default_context()
        result["openssl"] = ssl.OPENSSL_VERSION
        result["tls_minimum"] = context.minimum_version.name
    except Exception as e:  # reported, not raised: this is a diagnostic
        result["ssl_error"] = repr(e)
        ok = False
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version.restype = ctypes.c_char_p
        result["glibc"] = libc.gnu_get_libc_version().decode()
    except Exception as e:
        result["ctypes_error"] = repr(e)
        ok = False
    try:
        import pynvml  # noqa: F401 (the NVML bindings: imported, not initialised: no driver needed)

        result["pynvml"] = True
    except Exception as e:
        result["pynvml_error"] = repr(e)
        ok = False
    try:
        import zlib

        result["zlib"] = zlib.ZLIB_RUNTIME_VERSION
    except Exception as e:
        result["zlib_error"] = repr(e)
        ok = False
    try:
        from inotify_simple import INotify

        INotify().close()
        result["inotify"] = True
    except Exception as e:
        result["inotify_error"] = repr(e)
        ok = False
    try:
        import re2  # check-job's regexp operator (jobspec/regex.py): RE2's C++ extension

        options = re2.Options()
        options.log_errors = False
        result["re2"] = re2.compile("^[[:alpha:]]+$", options).search("abc") is not None
        ok = ok and bool(result["re2"])
    except Exception as e:
        result["re2_error"] = repr(e)
        ok = False
    result["ok"] = ok
    sys.stdout.write(json.dumps(result, sort_keys=True) + os.linesep)
    return 0 if ok else 1
