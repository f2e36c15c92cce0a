"""Loading the optional NVML bindings (``nvidia-ml-py``) lazily, and telling NVML errors apart.

Every NVML user receives the module as a value (``Nvml``), so tests inject a double.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import importlib.util
from typing import Any

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

NVML_LIBRARY = "libnvidia-ml.so.1"


class NvmlMissing(RuntimeError):
    """The bindings or the NVML library itself are not present on this node."""


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
    """``load``, once the file pynvml opens (its ``_LoadNvmlLibrary``) opens, else ``NvmlMissing``.

    On a node without NVIDIA's driver (every Lingjun node) the bindings are then never imported:
    once imported, their code would stay in the plugin's memory for good.
    """
    try:
        if importlib.util.find_spec("pynvml") is not None:
            ctypes.CDLL(NVML_LIBRARY)
    except (ImportError, ValueError):
        pass  # no bindings: ``load`` says so
    except OSError as exc:
        raise NvmlMissing(f"NVML Shared Library Not Found ({exc})") from None
    return load()


def nvml_unavailable_reason(nvml: Nvml | None = None) -> str:
    """ "" if NVML initialises here (then shut down again), else why not; never raises."""
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
    value = getattr(exc, "value", None) if isinstance(exc, nvml.NVMLError) else None
    return value if isinstance(value, int) else None


def describe(nvml: Nvml, exc: BaseException) -> str:
    code = error_code(nvml, exc)
    return f"{type(exc).__name__}: {exc}" if code is None else f"{exc} (NVML error {code})"


def text(value: object) -> str:
    """NVML strings are ``str`` or ``bytes``, by binding version."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def read(nvml: Nvml, function: str, *args: Any) -> tuple[Any, int | None]:
    """``(value, None)``, or ``(None, code)`` when the reading does not exist here.

    ``ERROR_NOT_SUPPORTED`` (which nomad-device-nvidia shows as 0) is told from the other
    ``MISSING_CODES``. Card faults and other errors propagate: a missing reading must never hide a
    broken card.
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
    return read(nvml, function, *args)[0]
