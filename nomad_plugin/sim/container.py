"""The container spec an Allocate response carries, in one of three styles.

What real XDM returns is unknown (R5). The simulator can answer the way a
k8s-style device plugin would ("env+devices": env vars, device nodes and a
read-only driver mount), the way an annotation-driven OCI shim would
("annotations": only ``xdm.amp.com/...`` keys), or both. All names are GUESS.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nomad_plugin.sim.grants import GrantedSlot
from nomad_plugin.sim.profiles import CardSpec

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
