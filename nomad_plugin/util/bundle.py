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


# The first lines of the header tools/build_dist.py writes, up to where its payload starts.
_SHIPPED_HEADER = re.compile(rb"#!/bin/sh\n# " + PLUGIN_NAME.encode() + rb' (\S+): .*?tail -c \+(\d+) "\$0"', re.S)
_CONSOLE_SCRIPT = re.compile(rb"#!(\S+)\n(?:.*\n)?from nomad_plugin\.cli\.main import main\n")


def plugin_file_identity(path: Path) -> tuple[str, str, str]:
    """(what the file is, its version if it says, the problem): the shipped file, whose sh header
    names the plugin and where its gzip'd bundle starts, or the console script of a pip install."""
    with path.open("rb") as f:
        head = f.read(8192)
        shipped = _SHIPPED_HEADER.match(head)
        if shipped is not None:
            f.seek(int(shipped[2]) - 1)
            if f.read(2) != b"\x1f\x8b":
                return "", "", "its bundle is missing or damaged (no gzip'd tar where its header says)"
            return "the shipped file", shipped[1].decode(errors="replace"), ""
    script = _CONSOLE_SCRIPT.match(head)
    if script is None:
        return "", "", "is neither the shipped file (sh header and bundle) nor the console script of a pip install"
    interpreter = script[1].decode(errors="replace")
    if not os.access(interpreter, os.X_OK):
        return "", "", f"is a console script whose interpreter {interpreter} is missing"
    return f"the console script of {interpreter}", "", ""
