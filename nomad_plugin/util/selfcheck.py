"""``nomad-device-lingjun --self-check``: the interpreter pieces the shipped executable must carry.

Hidden (not a subcommand in the usage text): tests/operator/test_dist.py runs
it against ``dist/nomad-device-lingjun`` to show that the bundled interpreter,
built for an old glibc (tools/build_python.py), still has a working ``ssl``
(httpx to an https Nomad), ``ctypes`` (NVML through nvidia-ml-py) and
``zlib``, whatever the node has installed.
"""

from __future__ import annotations

import json
import os
import sys


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
