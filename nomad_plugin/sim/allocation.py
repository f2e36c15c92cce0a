"""What XDM grants: the Allocate rules, the grant records, the container spec of a grant, the state file.

The rules are those the XDM API reference states for Allocate (ranges, homogeneous elements, whole
cards exclusive, TDM and MIG never on one card, per-card sums) plus NVIDIA's MIG placement. :func:`plan`
touches no state, so a refused request grants nothing.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from nomad_plugin._proto.lingjun import api_outer_pb2 as pb
from nomad_plugin.sim.profiles import CardSpec

VALID_SLICES = (0, 1, 2, 3, 4, 7)
MAX_SLICES = 7
# Memory eighths an NVIDIA MIG profile takes on an A100/H100-class card
# (1g.10gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb on an 80 GB card).
MIG_EIGHTHS = {1: 1, 2: 2, 3: 4, 4: 4, 7: 8}

STYLES = ("env+devices", "annotations", "both")
ANNOTATION_PREFIX = "xdm.amp.com/"
NVIDIA_CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
PPU_NODES = ("/dev/alixpu", "/dev/alixpu_ctl")
NVIDIA_DRIVER_DIR = "/usr/local/nvidia"
PPU_DRIVER_DIR = "/usr/local/PPU_SDK"


class Refusal(Exception):
    """A request XDM would refuse; ``code`` is a gRPC status code name."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Ask:
    """One ``devices[]`` element; ``minor`` None asks XDM to choose the card."""

    minor: int | None
    core: int = 0
    memory: int = 0
    slice: int = 0


@dataclass(frozen=True)
class GrantedSlot:
    """One card's part of a grant: ``memory`` GiB, ``core`` percent, ``slice`` MIG slices."""

    minor: int
    uuid: str
    core: int = 0
    memory: int = 0
    slice: int = 0
    mig_uuid: str = ""


@dataclass(frozen=True)
class GrantRecord:
    """One allocation as the simulator holds it (homogeneous: one core/memory/slice for all its cards)."""

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
        return "whole" if self.core == 0 and self.memory == 0 else "tdm"

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GrantRecord:
        devices = tuple(GrantedSlot(**d) for d in data.get("devices", ()))
        return cls(**{**data, "minors": tuple(data.get("minors", ())), "devices": devices})


def mig_profile_gib(card_gib: int, slices: int) -> int:
    """Memory of the MIG profile with ``slices`` compute slices on a card of ``card_gib``."""
    return card_gib * MIG_EIGHTHS.get(slices, slices) // 8


def _check_elements(asks: list[Ask]) -> None:
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
    for i, ask in enumerate(asks):
        first = asks[0]
        if (ask.core, ask.memory, ask.slice) != (first.core, first.memory, first.slice):
            raise Refusal(
                "INVALID_ARGUMENT",
                f"devices[{i}]: core/memory/slice {ask.core}/{ask.memory}/{ask.slice} differ from devices[0] "
                f"{first.core}/{first.memory}/{first.slice}; only homogeneous requests are supported",
            )


def _fit(card: CardSpec, healthy: bool, ask: Ask, held: list[GrantRecord], mig_placement: bool) -> None:
    """Raise if ``ask`` cannot go on ``card`` next to the grants it ``held`` already."""
    name = f"card {card.minor}"
    whole = next((g.id for g in held if g.kind == "whole"), "")
    shares = [g for g in held if g.kind == "tdm"]
    migs = [g for g in held if g.kind == "mig"]
    core, memory = sum(g.core for g in shares), sum(g.memory for g in shares)
    slices, eighths = sum(g.slice for g in migs), sum(MIG_EIGHTHS.get(g.slice, g.slice) for g in migs)
    if not healthy:
        raise Refusal("FAILED_PRECONDITION", f"{name} is unhealthy")
    if ask.slice > 0 and not card.mig_capable:
        raise Refusal("FAILED_PRECONDITION", f"{name} ({card.model}) does not support MIG (slice {ask.slice})")
    cap = card.memory_gib if ask.slice == 0 else mig_profile_gib(card.memory_gib, ask.slice)
    if ask.memory > cap:
        what = "the card" if ask.slice == 0 else f"a {ask.slice}-slice MIG instance"
        raise Refusal("INVALID_ARGUMENT", f"memory: {ask.memory} GiB exceeds {what} on {name} ({cap} GiB)")
    if whole:
        raise Refusal("RESOURCE_EXHAUSTED", f"{name} is held whole by allocation {whole}")
    if ask.core == ask.memory == ask.slice == 0:
        if held:
            raise Refusal("RESOURCE_EXHAUSTED", f"{name} has {len(held)} allocation(s); a whole card needs it free")
    elif ask.slice > 0:
        if shares:
            raise Refusal("FAILED_PRECONDITION", f"{name} has time-division grants; TDM and MIG cannot share a card")
        if slices + ask.slice > MAX_SLICES:
            raise Refusal(
                "RESOURCE_EXHAUSTED",
                f"{name}: {slices} of {MAX_SLICES} MIG slices used, {ask.slice} more do not fit",
            )
        if mig_placement and eighths + MIG_EIGHTHS[ask.slice] > 8:
            raise Refusal(
                "RESOURCE_EXHAUSTED",
                f"{name}: no MIG placement for a {ask.slice}-slice instance next to the existing ones",
            )
    elif migs:
        raise Refusal("FAILED_PRECONDITION", f"{name} has MIG grants; TDM and MIG cannot share a card")
    elif core + ask.core > 100:
        raise Refusal("RESOURCE_EXHAUSTED", f"{name}: core {core}% used, {ask.core}% more exceeds 100%")
    elif memory + ask.memory > card.memory_gib:
        raise Refusal(
            "RESOURCE_EXHAUSTED",
            f"{name}: memory {memory} GiB used, {ask.memory} GiB more exceeds {card.memory_gib} GiB",
        )


def plan(
    cards: Mapping[int, CardSpec],
    healthy: Mapping[int, bool],
    grants: Collection[GrantRecord],
    asks: list[Ask],
    *,
    mig_placement: bool = True,
) -> list[int]:
    """The card of each element, in request order ([] for a CPU container); ``cards`` are the present ones.

    Elements naming a card are placed first; the others go to the lowest healthy card that fits.
    """
    _check_elements(asks)
    if all(a.minor is None and a.core == a.memory == a.slice == 0 for a in asks):
        return []  # no devices, or all-zero elements without a minor: a CPU container
    explicit = [a.minor for a in asks if a.minor is not None]
    dupes = sorted({m for m in explicit if explicit.count(m) > 1})
    if dupes:
        raise Refusal("INVALID_ARGUMENT", f"devices: minor {dupes[0]} appears more than once")
    held = {m: [g for g in grants if m in g.minors] for m in cards}
    chosen: dict[int, int] = {}
    for i, ask in enumerate(asks):
        if ask.minor is not None:
            if ask.minor not in cards:
                raise Refusal("NOT_FOUND", f"devices[{i}].minor: no card {ask.minor} on this node")
            _fit(cards[ask.minor], healthy[ask.minor], ask, held[ask.minor], mig_placement)
            chosen[i] = ask.minor
    for i, ask in enumerate(asks):
        if ask.minor is not None:
            continue
        reasons = []
        for minor in sorted(set(cards) - set(chosen.values())):
            try:
                _fit(cards[minor], healthy[minor], ask, held[minor], mig_placement)
            except Refusal as why:
                reasons.append(why)
                continue
            chosen[i] = minor
            break
        else:
            same = reasons and all(r.code == reasons[0].code for r in reasons)
            detail = "; ".join(r.message for r in reasons[:4]) or "no free card"
            raise Refusal(
                reasons[0].code if same else "RESOURCE_EXHAUSTED",
                f"devices[{i}]: auto-assign found no card that fits ({detail})",
            )
    return [chosen[i] for i in range(len(asks))]


def grant_response(style: str, grant: GrantRecord, nvidia: bool) -> pb.AllocateResponse:
    """The successful Allocate answer for ``grant``, request annotations echoed. What real XDM puts in it
    is unknown (docs/xdm-risks.md): ``env+devices`` answers as a Kubernetes device plugin does (env, device
    nodes, a read-only driver mount), ``annotations`` as an annotation-driven OCI shim would, ``both`` both.
    """
    slots = grant.devices
    envs: dict[str, str] = {}
    nodes: list[str] = []
    mounts: list[pb.Mount] = []
    annotations = dict(grant.annotations)
    first = slots[0] if slots else GrantedSlot(-1, "")
    if slots and style in ("env+devices", "both"):
        envs["NVIDIA_VISIBLE_DEVICES" if nvidia else "PPU_VISIBLE_DEVICES"] = ",".join(
            s.mig_uuid or s.uuid for s in slots
        )
        if first.slice == 0 and (first.core > 0 or first.memory > 0):
            envs["AMP_VGPU_ENABLE"] = "1"
            if first.memory > 0:
                envs["GPU_MEM_PER_DEVICE"] = str(first.memory * 1024**3)
            if first.core > 0:
                envs["GPU_UTIL_PER_DEVICE"] = str(first.core)
        nodes = [*(f"/dev/nvidia{s.minor}" for s in slots), *NVIDIA_CONTROL_NODES] if nvidia else list(PPU_NODES)
        driver = NVIDIA_DRIVER_DIR if nvidia else PPU_DRIVER_DIR
        mounts.append(pb.Mount(containerPath=driver, hostPath=driver, readOnly=True))
    if slots and style in ("annotations", "both"):
        keys = {
            "allocation-id": grant.id,
            "devices": ",".join(s.uuid for s in slots),
            "minors": ",".join(str(s.minor) for s in slots),
            "core": str(first.core),
            "memory": str(first.memory),
        }
        if first.slice:
            keys |= {"slice": str(first.slice), "mig-devices": ",".join(s.mig_uuid for s in slots)}
        annotations |= {ANNOTATION_PREFIX + k: v for k, v in keys.items()}
    return pb.AllocateResponse(
        status=0, id=grant.id, envs=envs, mounts=mounts, annotations=annotations,
        devices=[
            pb.AllocatedDevice(minor=s.minor, uuid=s.uuid, core=s.core, memory=s.memory, slice=s.slice, migUuid=s.mig_uuid)
            for s in slots
        ],
        deviceSpecs=[pb.DeviceSpec(containerPath=n, hostPath=n, permissions="rw") for n in nodes],
    )  # fmt: skip


# ---------------------------------------------------------------- the state file
# It stands in for XDM's persistent allocation store: grants and the config-daemon's
# enabled flag are written on every change and read back when the service comes back.


@dataclass
class PersistentState:
    grants: dict[str, GrantRecord] = field(default_factory=dict)
    enabled: bool = True


def load_state(path: Path | None, default_enabled: bool = True) -> PersistentState:
    """A missing file is a fresh node; a corrupt one is an error naming it."""
    if path is None or not path.exists():
        return PersistentState(enabled=default_enabled)
    try:
        data = json.loads(path.read_text())
        grants = {g["id"]: GrantRecord.from_json(g) for g in data.get("grants", [])}
        return PersistentState(grants=grants, enabled=bool(data.get("enabled", default_enabled)))
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"state_file: {path} is not a simulator state file: {exc}") from exc


def save_state(path: Path | None, state: PersistentState) -> None:
    """Atomically: a temp file renamed over the old one."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"version": 1, "enabled": state.enabled, "grants": [asdict(g) for g in state.grants.values()]}
    fd, tmp = tempfile.mkstemp(prefix=".xdm-sim-state.", dir=str(path.parent))
    with os.fdopen(fd, "w") as fh:
        json.dump(body, fh, indent=1, sort_keys=True)
    os.replace(tmp, path)
