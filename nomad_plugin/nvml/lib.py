"""Loading the NVML bindings lazily, probing NVML, and telling NVML errors apart.

``pynvml`` (package ``nvidia-ml-py``) is optional: the XDM backend must work
on nodes without it. Every NVML user in this package receives the module as
a value (``Nvml``), so tests inject a double with the same function names.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import importlib.util
from typing import Any

#: The pynvml module, or a double with the same function names.
Nvml = Any

# NVML return codes we branch on (stable C API values, nvml.h).
ERROR_INVALID_ARGUMENT = 2
ERROR_NOT_SUPPORTED = 3
ERROR_NO_PERMISSION = 4
ERROR_NOT_FOUND = 6
ERROR_DRIVER_NOT_LOADED = 9
ERROR_TIMEOUT = 10
ERROR_FUNCTION_NOT_FOUND = 13
ERROR_GPU_IS_LOST = 15
ERROR_RESET_REQUIRED = 16


#: Codes meaning "this card is gone or broken", not "this reading is missing".
CARD_FAULT_CODES = frozenset({ERROR_GPU_IS_LOST, ERROR_RESET_REQUIRED})
#: Codes meaning NVML itself is gone (uninitialised, driver unloaded or upgraded underneath us): re-initialise.
NVML_GONE_CODES = frozenset({1, ERROR_DRIVER_NOT_LOADED, 18})
#: Codes meaning "this reading does not exist on this card/driver".
MISSING_CODES = frozenset({ERROR_NOT_SUPPORTED, ERROR_FUNCTION_NOT_FOUND, ERROR_NOT_FOUND, ERROR_NO_PERMISSION})

#: The file pynvml opens on Linux (its ``_LoadNvmlLibrary``); NVIDIA's driver installs it.
NVML_LIBRARY = "libnvidia-ml.so.1"


class NvmlMissing(RuntimeError):
    """The bindings or the NVML library itself are not present on this node."""


def bindings_installed() -> bool:
    """Whether ``pynvml`` could be imported, without importing it."""
    try:
        return importlib.util.find_spec("pynvml") is not None
    except (ImportError, ValueError):
        return False


def library_missing() -> str:
    """ "" when NVML's shared library opens, else why not, without importing ``pynvml``.

    On a node without NVIDIA's driver (every Lingjun node) importing the
    bindings only to have ``nvmlInit`` fail would keep their code in the
    plugin's memory for good; this opens the file pynvml would open, so the
    answer is the one ``nvmlInit`` would give.
    """
    try:
        ctypes.CDLL(NVML_LIBRARY)
    except OSError as exc:
        return f"NVML Shared Library Not Found ({exc})"
    return ""


def load() -> Nvml:
    """Import ``pynvml`` now; raise ``NvmlMissing`` with an install hint."""
    try:
        return importlib.import_module("pynvml")
    except ImportError as exc:
        raise NvmlMissing(
            "the NVML backend needs the Python package nvidia-ml-py, which the shipped executable "
            "(make dist) includes; for a pip install: pip install 'nomad-device-lingjun[nvml]': " + str(exc)
        ) from exc


def load_if_library() -> Nvml:
    """``load``, once NVML's library is known to open (else ``NvmlMissing`` and nothing imported)."""
    missing = library_missing() if bindings_installed() else ""
    if missing:
        raise NvmlMissing(missing)
    return load()


def nvml_unavailable_reason(nvml: Nvml | None = None) -> str:
    """ "" if NVML initialises here (it is shut down again), else why not; never raises."""
    try:
        module = nvml if nvml is not None else load_if_library()
    except NvmlMissing as exc:
        return str(exc)
    try:
        module.nvmlInit()
    except Exception as exc:
        return f"nvmlInit failed: {describe(module, exc)}"
    with contextlib.suppress(Exception):  # a failed shutdown does not make NVML unusable
        module.nvmlShutdown()
    return ""


def nvml_available(nvml: Nvml | None = None) -> bool:
    return nvml_unavailable_reason(nvml) == ""


def error_code(nvml: Nvml, exc: BaseException) -> int | None:
    """The NVML return code carried by ``exc``, or None if it is no NVML error."""
    value = getattr(exc, "value", None) if isinstance(exc, nvml.NVMLError) else None
    return value if isinstance(value, int) else None


def describe(nvml: Nvml, exc: BaseException) -> str:
    """A one-line operator message: NVML's text plus its code."""
    code = error_code(nvml, exc)
    return f"{type(exc).__name__}: {exc}" if code is None else f"{exc} (NVML error {code})"


def text(value: object) -> str:
    """NVML strings arrive as ``str`` or ``bytes`` depending on the binding version."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def read(nvml: Nvml, function: str, *args: Any) -> tuple[Any, int | None]:
    """Call the NVML getter ``function``: ``(value, None)``, or ``(None, code)`` when the reading does not exist.

    The code tells "the card does not support this" (``ERROR_NOT_SUPPORTED``,
    which nomad-device-nvidia shows as 0) from "it could not be read" (the
    other ``MISSING_CODES``; ``ERROR_FUNCTION_NOT_FOUND`` when the bindings
    lack the function). Card faults and other errors propagate: a missing
    reading must never hide a broken card.
    """
    fn = getattr(nvml, function, None)
    if fn is None:
        return None, ERROR_FUNCTION_NOT_FOUND
    try:
        return fn(*args), None
    except nvml.NVMLError as exc:
        code = error_code(nvml, exc)
        if code in MISSING_CODES:
            return None, code
        raise


def optional(nvml: Nvml, function: str, *args: Any) -> Any:
    """``read``'s value alone: None when the reading does not exist here."""
    return read(nvml, function, *args)[0]
