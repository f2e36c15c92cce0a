"""Loading the NVML bindings lazily, and telling NVML errors apart.

``pynvml`` (package ``nvidia-ml-py``) is optional: the XDM backend must work
on nodes without it. Every NVML user in this package receives the module as
a value (``Nvml``), so tests inject ``tests.doubles.fake_pynvml``.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

#: The pynvml module, or a double with the same function names.
Nvml = Any

# NVML return codes we branch on (stable C API values, nvml.h).
ERROR_INVALID_ARGUMENT = 2
ERROR_NOT_SUPPORTED = 3
ERROR_NO_PERMISSION = 4
ERROR_ALREADY_INITIALIZED = 5
ERROR_NOT_FOUND = 6
ERROR_DRIVER_NOT_LOADED = 9
ERROR_TIMEOUT = 10
ERROR_LIBRARY_NOT_FOUND = 12
ERROR_FUNCTION_NOT_FOUND = 13
ERROR_GPU_IS_LOST = 15
ERROR_RESET_REQUIRED = 16

# nvmlMemoryLocation_t values (nvml.h) for nvmlDeviceGetMemoryErrorCounter.
LOCATION_L1_CACHE = 0
LOCATION_L2_CACHE = 1
LOCATION_DEVICE_MEMORY = 2

#: Codes meaning "this card is gone or broken", not "this reading is missing".
CARD_FAULT_CODES = frozenset({ERROR_GPU_IS_LOST, ERROR_RESET_REQUIRED})
#: Codes meaning NVML itself is gone (driver unloaded or upgraded underneath us): re-initialise.
NVML_GONE_CODES = frozenset({1, ERROR_DRIVER_NOT_LOADED, 18})
#: Codes meaning "this reading does not exist on this card/driver".
MISSING_CODES = frozenset({ERROR_NOT_SUPPORTED, ERROR_FUNCTION_NOT_FOUND, ERROR_NOT_FOUND, ERROR_NO_PERMISSION})


class NvmlMissing(RuntimeError):
    """The bindings or the NVML library itself are not present on this node."""


#: The file pynvml opens on Linux (its ``_LoadNvmlLibrary``); NVIDIA's driver installs it.
NVML_LIBRARY = "libnvidia-ml.so.1"


def bindings_installed() -> bool:
    """Whether ``pynvml`` could be imported, without importing it."""
    try:
        return importlib.util.find_spec("pynvml") is not None
    except (ImportError, ValueError):
        return False


def library_missing() -> str:
    """ "" when NVML's shared library opens, else why not; ``pynvml`` is not imported.

    Why: on a node without NVIDIA's driver (every Lingjun node) importing the
    bindings only to have ``nvmlInit`` fail kept 2.2 MiB of their code in the
    plugin for good, out of a 60 MiB budget (issue 14). This opens the same
    file pynvml would, so the answer is the one ``nvmlInit`` would give.
    """
    import ctypes

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


def error_code(nvml: Nvml, exc: BaseException) -> int | None:
    """The NVML return code carried by ``exc``, or None if it is no NVML error."""
    if isinstance(exc, nvml.NVMLError):
        value = getattr(exc, "value", None)
        return int(value) if isinstance(value, int) else None
    return None


def describe(nvml: Nvml, exc: BaseException) -> str:
    """A one-line operator message: NVML's text plus its code."""
    code = error_code(nvml, exc)
    if code is None:
        return f"{type(exc).__name__}: {exc}"
    return f"{exc} (NVML error {code})"


def text(value: object) -> str:
    """NVML strings arrive as ``str`` or ``bytes`` depending on the binding version."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def read(nvml: Nvml, function: str, *args: Any) -> tuple[Any, int | None]:
    """Like ``optional``, and says why a reading is missing: ``(value, None)`` or ``(None, code)``.

    The code tells "the card does not support this" (``ERROR_NOT_SUPPORTED``,
    which nomad-device-nvidia shows as 0) from "it could not be read" (the
    other ``MISSING_CODES``; ``ERROR_FUNCTION_NOT_FOUND`` when the bindings
    lack the function).
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
    """Call the NVML getter named ``function``; None when the reading does not exist here.

    "Does not exist" covers NOT_SUPPORTED-like codes and bindings too old to
    have the function. Card faults (GPU lost, reset required) and other
    errors propagate: a missing reading must never hide a broken card.
    """
    fn = getattr(nvml, function, None)
    if fn is None:
        return None
    try:
        return fn(*args)
    except nvml.NVMLError as exc:
        if error_code(nvml, exc) in MISSING_CODES:
            return None
        raise


def nvml_available(nvml: Nvml | None = None) -> bool:
    """True when the bindings import and ``nvmlInit`` succeeds (then shut down again).

    Cheap and side-effect free: never raises, prints nothing.
    """
    return nvml_unavailable_reason(nvml) == ""


def nvml_unavailable_reason(nvml: Nvml | None = None) -> str:
    """ "" if NVML works, else why not (for logs and ``doctor``-style output).

    Without ``nvml``, the bindings are imported only once NVML's library is
    known to open (``library_missing``).
    """
    if nvml is None and bindings_installed():
        missing = library_missing()
        if missing:
            return missing
    try:
        module = nvml if nvml is not None else load()
    except NvmlMissing as exc:
        return str(exc)
    try:
        module.nvmlInit()
    except Exception as exc:
        return f"nvmlInit failed: {describe(module, exc)}"
    try:
        module.nvmlShutdown()
    except Exception:  # a failed shutdown does not make NVML unusable
        return ""
    return ""
