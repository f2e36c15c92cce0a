"""The shipped executable (a PyInstaller bundle, ``make dist``): its children's environment and its self-check.

PyInstaller's bootloader puts the bundle's own library directory first on ``LD_LIBRARY_PATH``
(keeping the old value in ``LD_LIBRARY_PATH_ORIG``) before Python starts. This process has loaded
its libraries by then, but every child inherits the variable, and a node program (``nvidia-smi``,
``nomad``) would load the bundle's libstdc++ or OpenSSL instead of its own. A child that is this
same executable (the launcher starts the plugin for ``doctor``, ``check-job``, ``demo``) must also
start as a new top-level instance, which PyInstaller does when ``PYINSTALLER_RESET_ENVIRONMENT`` is set.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager


def restore_child_environment(environ: MutableMapping[str, str]) -> None:
    """Give children the node's library path, not the bundle's (no-op outside the bundle)."""
    if not getattr(sys, "frozen", False):
        return
    original = environ.pop("LD_LIBRARY_PATH_ORIG", None)
    if original is None:
        environ.pop("LD_LIBRARY_PATH", None)
    else:
        environ["LD_LIBRARY_PATH"] = original
    environ["PYINSTALLER_RESET_ENVIRONMENT"] = "1"


def self_check() -> int:
    """``--self-check`` (hidden; tests/operator/test_dist.py): one JSON object on stdout about the
    interpreter pieces the shipped file must carry (tools/build_python.py); 0 only when all passed."""
    result: dict[str, object] = {"python": sys.version.split()[0], "frozen": bool(getattr(sys, "frozen", False))}
    failed: list[str] = []

    @contextmanager
    def check(name: str) -> Iterator[None]:
        try:
            yield
        except Exception as e:  # reported, not raised: this is a diagnostic
            result[f"{name}_error"] = repr(e)
            failed.append(name)

    with check("ssl"):  # httpx to an https Nomad
        import ssl

        result["openssl"] = ssl.OPENSSL_VERSION
        result["tls_minimum"] = ssl.create_default_context().minimum_version.name
    with check("ctypes"):  # NVML through nvidia-ml-py
        import ctypes

        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version.restype = ctypes.c_char_p
        result["glibc"] = libc.gnu_get_libc_version().decode()
    with check("pynvml"):
        import pynvml  # noqa: F401 (imported, not initialised: no driver needed)

        result["pynvml"] = True
    with check("zlib"):
        import zlib

        result["zlib"] = zlib.ZLIB_RUNTIME_VERSION
    with check("re2"):  # check-job's regexp operator (jobspec/golang.py): RE2's C++ extension
        import re2

        options = re2.Options()
        options.log_errors = False
        result["re2"] = re2.compile("^[[:alpha:]]+$", options).search("abc") is not None
    result["ok"] = not failed and result.get("re2") is True
    sys.stdout.write(json.dumps(result, sort_keys=True) + os.linesep)
    return 0 if result["ok"] else 1
