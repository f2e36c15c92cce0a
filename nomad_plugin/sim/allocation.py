"""Allocate rules (xdm-api.md §5.4) as pure functions over cards and grants.

:func:`plan` returns the per-card placement for a request or raises
:class:`Refusal` naming the rule that failed. Nothing here touches state: the
caller commits the plan only when the whole request fits (atomicity).
Refusal codes are gRPC status code names; the server turns them into an
in-band ``status`` (the code's number) or a real gRPC status.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from nomad_plugin.sim.profiles import CardSpec

VALID_SLICES = (0, 1, 2, 3, 4, 7)
MAX_SLICES = 7
# Memory eighths an NVIDIA MIG profile takes on an A100/H100-class card
# (1g.10gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb on an 80 GB card).
MIG_EIGHTHS = {1: 1, 2: 2, 3: 4, 4: 4, 7: 8}


class Refusal(Exception):
    """A request XDM would refuse. ``code`` is a gRPC status code name."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Ask:
    """One ``devices[]`` element: ``minor`` None means "auto-assign"."""

    minor: int | None
    core: int = 0
    memory: int = 0
    slice: int = 0

    @property
    def is_zero(self) -> bool:
        return self.core == 0 and self.memory == 0 and self.slice == 0


@dataclass(frozen=True)
class CardView:
    """What the rules need to know about a card."""

    minor: int
    memory_gib: int
    mig_capable: bool
    healthy: bool
    model: str = ""


@dataclass(frozen=True)
class Placement:
    minor: int
    core: int
    memory: int
    slice: int


@dataclass
class _Usage:
    whole: str = ""
    core: int = 0
    memory: int = 0
    slices: int = 0
    eighths: int = 0
    tdm: int = 0
    mig: int = 0
    count: int = 0

    def add(self, core: int, memory: int, slices: int, grant_id: str, sign: int = 1) -> None:
        """Count one grant's part of this card in (``sign`` 1) or out (-1)."""
        self.count += sign
        if slices > 0:
            self.mig += sign
            self.slices += sign * slices
            self.eighths += sign * MIG_EIGHTHS.get(slices, slices)
        elif core == 0 and memory == 0:
            if sign > 0:
                self.whole = grant_id
            elif self.whole == grant_id:
                self.whole = ""
        else:
            self.tdm += sign
            self.core += sign * core
            self.memory += sign * memory


class UsageIndex:
    """Per-card usage kept in step with the grants, so placing a grant never scans them.

    XDM's own Allocate cost should not grow with the live grants, and the
    simulator ships with the plugin as its stand-in (issue 14: a scan made
    the simulator's Allocate 54 % slower at 1,024 grants than at 1).
    """

    def __init__(self, grants: Iterable[GrantRecord] = ()) -> None:
        self.by_minor: dict[int, _Usage] = {}
        for grant in grants:
            self.add(grant)

    def add(self, grant: GrantRecord) -> None:
        for minor in grant.minors:
            self.by_minor.setdefault(minor, _Usage()).add(grant.core, grant.memory, grant.slice, grant.id)

    def remove(self, grant: GrantRecord) -> None:
        for minor in grant.minors:
            use = self.by_minor.get(minor)
            if use is None:
                continue
            use.add(grant.core, grant.memory, grant.slice, grant.id, sign=-1)
            if use.count <= 0:
                del self.by_minor[minor]


def mig_profile_gib(card_gib: int, slices: int) -> int:
    """Memory of the MIG profile with ``slices`` compute slices on a card of ``card_gib``."""
    return card_gib * MIG_EIGHTHS.get(slices, slices) // 8


def validate_elements(asks: list[Ask]) -> None:
    """Range and shape rules that need no card."""
    for i, ask in enumerate(asks):
        where = f"devices[{i}]"
        if ask.minor is not None and ask.minor < 0:
            raise Refusal("INVALID_ARGUMENT", f"{where}.minor: {ask.minor} is negative")
        if not 0 <= ask.core <= 100:
            raise Refusal("INVALID_ARGUMENT", f"{where}.core: {ask.core} is outside 0..100")
        if ask.slice not in VALID_SLICES:
            raise Refusal("INVALID_ARGUMENT", f"{where}.slice: {ask.slice} is not one of 1, 2, 3, 4, 7 (0 = no MIG)")
        if ask.memory < 0:
            raise Refusal("INVALID_ARGUMENT", f"{where}.memory: {ask.memory} GiB is negative")
        if ask.core > 0 and ask.slice > 0:
            raise Refusal(
                "INVALID_ARGUMENT",
                f"{where}: core {ask.core} with slice {ask.slice}: time-division (core) and MIG (slice) "
                "cannot be mixed in one element",
            )
    first = asks[0] if asks else None
    for i, ask in enumerate(asks[1:], start=1):
        assert first is not None
        if (ask.core, ask.memory, ask.slice) != (first.core, first.memory, first.slice):
            raise Refusal(
                "INVALID_ARGUMENT",
                f"devices[{i}]: core/memory/slice {ask.core}/{ask.memory}/{ask.slice} differ from devices[0] "
                f"{first.core}/{first.memory}/{first.slice}; only homogeneous requests are supported",
            )


def _usage(grants: Iterable[GrantRecord] | UsageIndex) -> dict[int, _Usage]:
    if isinstance(grants, UsageIndex):
        return grants.by_minor
    return UsageIndex(grants).by_minor


def _fit(card: CardView, ask: Ask, use: _Usage, *, mig_placement: bool) -> None:
    """Raise if ``ask`` cannot go on ``card`` given what it already holds."""
    name = f"card {card.minor}"
    if not card.healthy:
        raise Refusal("FAILED_PRECONDITION", f"{name} is unhealthy")
    if ask.slice > 0 and not card.mig_capable:
        raise Refusal("FAILED_PRECONDITION", f"{name} ({card.model}) does not support MIG (slice {ask.slice})")
    cap = card.memory_gib if ask.slice == 0 else mig_profile_gib(card.memory_gib, ask.slice)
    if ask.memory > cap:
        what = "the card" if ask.slice == 0 else f"a {ask.slice}-slice MIG instance"
        raise Refusal("INVALID_ARGUMENT", f"memory: {ask.memory} GiB exceeds {what} on {name} ({cap} GiB)")
    if use.whole:
        raise Refusal("RESOURCE_EXHAUSTED", f"{name} is held whole by allocation {use.whole}")
    if ask.is_zero:
        if use.count:
            raise Refusal("RESOURCE_EXHAUSTED", f"{name} has {use.count} allocation(s); a whole card needs it free")
        return
    if ask.slice > 0:
        if use.tdm:
            raise Refusal("FAILED_PRECONDITION", f"{name} has time-division grants; TDM and MIG cannot share a card")
        if use.slices + ask.slice > MAX_SLICES:
            raise Refusal(
                "RESOURCE_EXHAUSTED",
                f"{name}: {use.slices} of {MAX_SLICES} MIG slices used, {ask.slice} more do not fit",
            )
        if mig_placement and use.eighths + MIG_EIGHTHS[ask.slice] > 8:
            raise Refusal(
                "RESOURCE_EXHAUSTED",
                f"{name}: no MIG placement for a {ask.slice}-slice instance next to the existing ones",
            )
        return
    if use.mig:
        raise Refusal("FAILED_PRECONDITION", f"{name} has MIG grants; TDM and MIG cannot share a card")
    if use.core + ask.core > 100:
        raise Refusal("RESOURCE_EXHAUSTED", f"{name}: core {use.core}% used, {ask.core}% more exceeds 100%")
    if use.memory + ask.memory > card.memory_gib:
        raise Refusal(
            "RESOURCE_EXHAUSTED",
            f"{name}: memory {use.memory} GiB used, {ask.memory} GiB more exceeds {card.memory_gib} GiB",
        )


def plan(
    cards: Mapping[int, CardView],
    grants: Iterable[GrantRecord] | UsageIndex,
    asks: list[Ask],
    *,
    mig_placement: bool = True,
) -> list[Placement]:
    """Where each element goes (in request order); [] for a CPU container.

    ``grants`` is the live grants, or (constant time) a ``UsageIndex`` of them.
    """
    validate_elements(asks)
    if all(a.minor is None and a.is_zero for a in asks):
        return []  # no devices, or all-zero elements without minor: a CPU container
    explicit = [a.minor for a in asks if a.minor is not None]
    dupes = sorted({m for m in explicit if explicit.count(m) > 1})
    if dupes:
        raise Refusal("INVALID_ARGUMENT", f"devices: minor {dupes[0]} appears more than once")
    usage = _usage(grants)
    chosen: dict[int, Placement] = {}
    for i, ask in enumerate(asks):
        if ask.minor is None:
            continue
        card = cards.get(ask.minor)
        if card is None:
            raise Refusal("NOT_FOUND", f"devices[{i}].minor: no card {ask.minor} on this node")
        _fit(card, ask, usage.get(ask.minor, _Usage()), mig_placement=mig_placement)
        chosen[i] = Placement(ask.minor, ask.core, ask.memory, ask.slice)
    taken = {p.minor for p in chosen.values()}
    for i, ask in enumerate(asks):
        if ask.minor is not None:
            continue
        reasons = []
        for minor in sorted(cards):
            if minor in taken:
                continue
            try:
                _fit(cards[minor], ask, usage.get(minor, _Usage()), mig_placement=mig_placement)
            except Refusal as why:
                reasons.append(why)
                continue
            chosen[i] = Placement(minor, ask.core, ask.memory, ask.slice)
            taken.add(minor)
            break
        else:
            code = (
                reasons[0].code if reasons and all(r.code == reasons[0].code for r in reasons) else "RESOURCE_EXHAUSTED"
            )
            detail = "; ".join(r.message for r in reasons[:4]) or "no free card"
            raise Refusal(code, f"devices[{i}]: auto-assign found no card that fits ({detail})")
    return [chosen[i] for i in range(len(asks))]


# ------------------------------------------------------------ (from grants.py)
# The simulator's own record of allocations, and its JSON state file.
#
# The state file stands in for XDM's persistent allocation store: grants (and
# the config-daemon's enabled flag) survive a simulated restart because they
# are written on every change and read back when the service comes back.


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


# ------------------------------------------------------------ (from container.py)
# The container spec an Allocate response carries, in one of three styles.
#
# What real XDM returns is unknown (R5). The simulator can answer the way a
# k8s-style device plugin would ("env+devices": env vars, device nodes and a
# read-only driver mount), the way an annotation-driven OCI shim would
# ("annotations": only ``xdm.amp.com/...`` keys), or both. All names are GUESS.


STYLES = ("env+devices", "annotations", "both")
ANNOTATION_PREFIX = "xdm.amp.com/"
NVIDIA_CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
PPU_NODES = ("/dev/alixpu", "/dev/alixpu_ctl")
NVIDIA_DRIVER_DIR = "/usr/local/nvidia"
PPU_DRIVER_DIR = "/usr/local/PPU_SDK"


@dataclass(frozen=True)
class ContainerSpec:
    envs: dict[str, str] = field(default_factory=dict)
    device_nodes: tuple[str, ...] = ()
    mounts: tuple[tuple[str, str, bool], ...] = ()  # (container path, host path, read only)
    annotations: dict[str, str] = field(default_factory=dict)


def build_spec(style: str, grant_id: str, slots: list[GrantedSlot], cards: dict[int, CardSpec]) -> ContainerSpec:
    """Container spec for granted ``slots`` (empty for a CPU container)."""
    if style not in STYLES:
        raise ValueError(f"style: {style!r} is not one of {', '.join(STYLES)}")
    if not slots:
        return ContainerSpec()
    envs: dict[str, str] = {}
    nodes: list[str] = []
    mounts: list[tuple[str, str, bool]] = []
    annotations: dict[str, str] = {}
    first = slots[0]
    nvidia = cards[first.minor].is_nvidia if first.minor in cards else True
    if style in ("env+devices", "both"):
        visible = ",".join(s.mig_uuid or s.uuid for s in slots)
        envs["NVIDIA_VISIBLE_DEVICES" if nvidia else "PPU_VISIBLE_DEVICES"] = visible
        if first.slice == 0 and (first.core > 0 or first.memory > 0):
            envs["AMP_VGPU_ENABLE"] = "1"
            if first.memory > 0:
                envs["GPU_MEM_PER_DEVICE"] = str(first.memory * 1024**3)
            if first.core > 0:
                envs["GPU_UTIL_PER_DEVICE"] = str(first.core)
        if nvidia:
            nodes.extend(f"/dev/nvidia{s.minor}" for s in slots)
            nodes.extend(NVIDIA_CONTROL_NODES)
            mounts.append((NVIDIA_DRIVER_DIR, NVIDIA_DRIVER_DIR, True))
        else:
            nodes.extend(PPU_NODES)
            mounts.append((PPU_DRIVER_DIR, PPU_DRIVER_DIR, True))
    if style in ("annotations", "both"):
        annotations[ANNOTATION_PREFIX + "allocation-id"] = grant_id
        annotations[ANNOTATION_PREFIX + "devices"] = ",".join(s.uuid for s in slots)
        annotations[ANNOTATION_PREFIX + "minors"] = ",".join(str(s.minor) for s in slots)
        annotations[ANNOTATION_PREFIX + "core"] = str(first.core)
        annotations[ANNOTATION_PREFIX + "memory"] = str(first.memory)
        if first.slice:
            annotations[ANNOTATION_PREFIX + "slice"] = str(first.slice)
            annotations[ANNOTATION_PREFIX + "mig-devices"] = ",".join(s.mig_uuid for s in slots)
    return ContainerSpec(envs=envs, device_nodes=tuple(nodes), mounts=tuple(mounts), annotations=annotations)
