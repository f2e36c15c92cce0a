"""Is NVML usable on this node? Used by backend "auto" with the XDM socket check."""

from __future__ import annotations

from nomad_plugin.nvml import lib
from nomad_plugin.nvml.lib import Nvml


def nvml_available(nvml: Nvml | None = None) -> bool:
    """True when the bindings import and ``nvmlInit`` succeeds (then shut down again).

    Cheap and side-effect free: never raises, prints nothing.
    """
    return nvml_unavailable_reason(nvml) == ""


def nvml_unavailable_reason(nvml: Nvml | None = None) -> str:
    """ "" if NVML works, else why not (for logs and ``doctor``-style output).

    Without ``nvml``, the bindings are imported only once NVML's library is
    known to open (``lib.library_missing``).
    """
    if nvml is None and lib.bindings_installed():
        missing = lib.library_missing()
        if missing:
            return missing
    try:
        module = nvml if nvml is not None else lib.load()
    except lib.NvmlMissing as exc:
        return str(exc)
    try:
        module.nvmlInit()
    except Exception as exc:
        return f"nvmlInit failed: {lib.describe(module, exc)}"
    try:
        module.nvmlShutdown()
    except Exception:  # a failed shutdown does not make NVML unusable
        return ""
    return ""
