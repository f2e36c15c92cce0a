"""The shipped executable (a PyInstaller bundle, ``make dist``): its children's environment, its self-check,
and how a file is recognised as this plugin.

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
import re
import sys
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from nomad_plugin import PLUGIN_NAME


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


# The shipped file is tools/launcher.c compiled, the bundle as a gzip'd archive, and this last line
# (tools/build_dist.py writes it; the launcher reads it on each launch, and quotes its start).
_LAUNCHER_MARK = PLUGIN_NAME.encode() + b" bundle version="
_SHIPPED_TRAILER = re.compile(
    rb"\n"
    + re.escape(_LAUNCHER_MARK)
    + rb"([A-Za-z0-9.+_-]+) key=[0-9a-f]{16} glibc=2\.\d+ offset=(\d+) size=(\d+)\n\Z"
)
_CONSOLE_SCRIPT = re.compile(rb"#!(\S+)\n(?:.*\n)?from nomad_plugin\.cli\.main import main\n")
_NEITHER = "is neither the shipped file (launcher and bundle) nor the console script of a pip install"


def _shipped_identity(f: BinaryIO) -> tuple[str, str, str]:
    """The shipped file's version, or why its bundle cannot be where its last line says."""
    size = f.seek(0, os.SEEK_END)
    f.seek(max(0, size - 512))
    line = _SHIPPED_TRAILER.search(f.read())
    if line is None:
        return "", "", "its bundle is missing or damaged (no bundle line at its end)"
    offset, length = int(line[2]), int(line[3])
    f.seek(offset)
    if offset + length + len(line[0]) != size or f.read(2) != b"\x1f\x8b":
        return "", "", "its bundle is missing or damaged (the file is not as long as its last line says)"
    return "the shipped file", line[1].decode(), ""


def plugin_file_identity(path: Path) -> tuple[str, str, str]:
    """(what the file is, its version if it says, the problem): the shipped file, whose launcher quotes
    the line that ends the file, or the console script of a pip install."""
    with path.open("rb") as f:
        head = f.read(1 << 20)
        if head.startswith(b"\x7fELF"):
            if _LAUNCHER_MARK not in head:
                return "", "", _NEITHER
            return _shipped_identity(f)
    script = _CONSOLE_SCRIPT.match(head)
    if script is None:
        return "", "", _NEITHER
    interpreter = script[1].decode(errors="replace")
    if not os.access(interpreter, os.X_OK):
        return "", "", f"is a console script whose interpreter {interpreter} is missing"
    return f"the console script of {interpreter}", "", ""
