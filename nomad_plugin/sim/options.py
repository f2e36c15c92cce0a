"""Simulator options (the ``**options`` of :class:`~nomad_plugin.sim.Simulator`)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from nomad_plugin.sim.container import STYLES
from nomad_plugin.sim.profiles import TOPOLOGY_VARIANTS
from nomad_plugin.sim.schema import SCHEMAS

ERROR_MODES = ("inband", "grpc")
DUPLICATE_ID_MODES = ("reject", "idempotent")
RELEASE_UNKNOWN_MODES = ("not-found", "ok")
DISABLED_EFFECTS = ("refuse", "none")
UNKNOWN_FILTER_MODES = ("empty", "error")
EXPORTER_STATES = ("running", "stopped", "error")


@dataclass
class SimOptions:
    """Behaviour switches; every one has the default a plain ``xdm-sim`` run uses."""

    style: str = "env+devices"  # container spec style in Allocate responses
    collect_interval_ms: int = 1000  # exporter collection interval
    initial_push: bool = True  # ListAndWatch sends the list at once on subscribe
    push_on_allocation: bool = False  # ListAndWatch pushes after Allocate/Release too
    repush_interval: float = 0.0  # seconds; > 0 re-sends the list periodically
    error_mode: str = "inband"  # "inband" status/message or "grpc" status codes
    duplicate_id_mode: str = "reject"
    release_unknown: str = "not-found"
    disabled_effect: str = "refuse"  # what Disable does to Allocate
    enabled: bool = True  # initial config-daemon flag (a state file overrides it)
    mig_placement: bool = True  # apply NVIDIA MIG placement (memory eighths) rules
    cpu_container: bool = True  # device-less requests succeed with an empty grant
    unknown_filter: str = "empty"  # exporter filter naming unknown devices/metrics
    topology_variant: str = "normal"  # "normal", "extra-level", "malformed"
    drift: str | None = None
    seed: int = 0  # metrics RNG seed
    control: bool = True  # serve the JSON-lines control socket
    version: str = "v1.13.0-sim"
    nvml_mirror: bool = False
    schema: str = "builtin"  # served schema: builtin, renumbered or foreign (nomad_plugin/sim/schema.py)
    reflection: bool = False  # serve gRPC server reflection (off: like the sim always was, and R1's likely case)

    def __post_init__(self) -> None:
        for name, allowed in (
            ("style", STYLES),
            ("error_mode", ERROR_MODES),
            ("duplicate_id_mode", DUPLICATE_ID_MODES),
            ("release_unknown", RELEASE_UNKNOWN_MODES),
            ("disabled_effect", DISABLED_EFFECTS),
            ("unknown_filter", UNKNOWN_FILTER_MODES),
            ("topology_variant", TOPOLOGY_VARIANTS),
            ("schema", SCHEMAS),
        ):
            check_choice(name, getattr(self, name), allowed)
        if self.collect_interval_ms < 10:
            raise ValueError(f"collect_interval_ms: {self.collect_interval_ms} is below 10 ms")
        if self.repush_interval < 0:
            raise ValueError(f"repush_interval: {self.repush_interval} is negative")

    @classmethod
    def from_kwargs(cls, options: dict[str, Any]) -> SimOptions:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise TypeError(f"Simulator: unknown option {unknown[0]!r} (known: {', '.join(sorted(known))})")
        return cls(**options)


def check_choice(name: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name}: {value!r} is not one of {', '.join(allowed)}")
