"""The simulator's own record of allocations, and its JSON state file.

The state file stands in for XDM's persistent allocation store: grants (and
the config-daemon's enabled flag) survive a simulated restart because they
are written on every change and read back when the service comes back.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class GrantedSlot:
    """One card's part of a grant. ``memory`` is GiB, ``core`` percent, ``slice`` MIG slices."""

    minor: int
    uuid: str
    core: int = 0
    memory: int = 0
    slice: int = 0
    mig_uuid: str = ""


@dataclass(frozen=True)
class GrantRecord:
    """One allocation as the simulator holds it (homogeneous: one core/memory/slice for all cards)."""

    id: str
    minors: tuple[int, ...]
    core: int
    memory: int
    slice: int
    created: float
    devices: tuple[GrantedSlot, ...] = ()
    annotations: dict[str, str] = field(default_factory=dict)
    request_key: str = ""

    @property
    def kind(self) -> str:
        """ "cpu" (no card), "whole", "mig" or "tdm"."""
        if not self.minors:
            return "cpu"
        if self.slice > 0:
            return "mig"
        if self.core == 0 and self.memory == 0:
            return "whole"
        return "tdm"

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["minors"] = list(self.minors)
        data["devices"] = [asdict(d) for d in self.devices]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GrantRecord:
        return cls(
            id=str(data["id"]),
            minors=tuple(int(m) for m in data.get("minors", [])),
            core=int(data.get("core", 0)),
            memory=int(data.get("memory", 0)),
            slice=int(data.get("slice", 0)),
            created=float(data.get("created", 0.0)),
            devices=tuple(GrantedSlot(**d) for d in data.get("devices", [])),
            annotations={str(k): str(v) for k, v in dict(data.get("annotations", {})).items()},
            request_key=str(data.get("request_key", "")),
        )


@dataclass
class PersistentState:
    """What survives a restart: grants and the config-daemon flag."""

    grants: dict[str, GrantRecord] = field(default_factory=dict)
    enabled: bool = True


def load_state(path: Path | None, default_enabled: bool = True) -> PersistentState:
    """Read a state file; a missing file is a fresh node. A corrupt file is an error naming it."""
    if path is None or not path.exists():
        return PersistentState(enabled=default_enabled)
    try:
        data = json.loads(path.read_text())
        grants = {g["id"]: GrantRecord.from_json(g) for g in data.get("grants", [])}
        return PersistentState(grants=grants, enabled=bool(data.get("enabled", default_enabled)))
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"state_file: {path} is not a simulator state file: {exc}") from exc


def save_state(path: Path | None, state: PersistentState) -> None:
    """Write the state file atomically (temp file + rename)."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"version": 1, "enabled": state.enabled, "grants": [g.to_json() for g in state.grants.values()]}
    fd, tmp = tempfile.mkstemp(prefix=".xdm-sim-state.", dir=str(path.parent))
    with os.fdopen(fd, "w") as fh:
        json.dump(body, fh, indent=1, sort_keys=True)
    os.replace(tmp, path)
