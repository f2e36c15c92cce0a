"""Turning a ``GrantRequest`` into what a task needs to use NVIDIA cards.

NVML has no server-side grant: a grant is the env var the NVIDIA container
runtime reads plus the device nodes an ``exec`` task needs. Whole cards and
MIG instances that already exist can be granted; shares cannot (NVML has no
time-division multiplexing) and MIG instances cannot be created.

A MIG instance is asked for by its MIG UUID (``DeviceAsk.mig_uuid``, what
the reserve layer sets for the NVML backend's MIG-instance groups). Its
memory and slices come with the ask for the record; the instance itself is
what NVML made, so they are not limits to check here.

Device nodes, as the NVIDIA container toolkit gives a container: the card's
``/dev/nvidia<minor>`` (a MIG instance's parent card), ``/dev/nvidiactl``,
``/dev/nvidia-uvm`` and ``/dev/nvidia-uvm-tools`` where they exist, and per
MIG instance the two capability nodes ``/dev/nvidia-caps/nvidia-cap<N>`` of
its GPU instance and compute instance, ``N`` being the ``DeviceFileMinor`` of
``/proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<g>/access`` and of
``.../gi<g>/ci<c>/access`` (NVIDIA's MIG user guide, "Device Nodes and
Capabilities").
"""

from __future__ import annotations

from pathlib import Path

from nomad_plugin.model.card import Card, Inventory, MigInstance
from nomad_plugin.model.errors import BackendRefused, GrantMismatch, ReservationRejected
from nomad_plugin.model.grant import DeviceAsk, DeviceNode, Grant, GrantedDevice, GrantRequest

VISIBLE_DEVICES_ENV = "NVIDIA_VISIBLE_DEVICES"
#: Where the driver's capability files are; a test shim may point this elsewhere.
PROC_ROOT = "/proc"
_CONTROL_NODES = ("nvidiactl",)
_OPTIONAL_NODES = ("nvidia-uvm", "nvidia-uvm-tools")


def _card_of(ask: DeviceAsk, inventory: Inventory) -> Card:
    card = inventory.by_minor(ask.minor)
    if card is None:
        minors = sorted(c.minor for c in inventory.cards)
        raise ReservationRejected(f"minor: card {ask.minor} is not on this node (NVML sees {minors})")
    return card


def _mig_of(ask: DeviceAsk, card: Card, inventory: Inventory) -> MigInstance:
    for mig in card.mig_instances:
        if mig.uuid == ask.mig_uuid:
            return mig
    elsewhere = [c.minor for c in inventory.cards for m in c.mig_instances if m.uuid == ask.mig_uuid]
    if elsewhere:
        raise ReservationRejected(
            f"mig_uuid: MIG instance {ask.mig_uuid} is on card {elsewhere[0]}, not on card {card.minor} as asked"
        )
    raise ReservationRejected(
        f"mig_uuid: unknown MIG instance {ask.mig_uuid} on card {card.minor} "
        f"(NVML sees {', '.join(m.uuid for m in card.mig_instances) or 'none'}); it was removed since the job was placed"
    )


def _refuse_share(ask: DeviceAsk) -> None:
    if ask.core or ask.memory_gib:
        raise BackendRefused(
            f"card {ask.minor}: shares are not available with the NVML backend "
            f"(asked core={ask.core}%, memory_gib={ask.memory_gib}); NVML has no time-division "
            "sharing, ask for a whole card or an existing MIG instance, or use the XDM backend"
        )
    if ask.slices:
        raise BackendRefused(
            f"card {ask.minor}: asked for {ask.slices} MIG slice(s) without naming an existing MIG "
            "instance; NVML cannot create MIG instances (create them with nvidia-smi mig)"
        )


def read_cap_minor(path: Path) -> int:
    """The ``DeviceFileMinor:`` value of one NVIDIA capability ``access`` file."""
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise GrantMismatch(f"MIG capability file {path} cannot be read: {exc.strerror or exc}") from exc
    for line in lines:
        key, _, value = line.partition(":")
        if key.strip() == "DeviceFileMinor":
            try:
                return int(value.strip())
            except ValueError:
                break
    raise GrantMismatch(f"MIG capability file {path} has no DeviceFileMinor line")


def mig_cap_nodes(card: Card, mig: MigInstance, proc_root: str, dev_root: str) -> list[DeviceNode]:
    """The two ``/dev/nvidia-caps`` nodes (GPU instance, compute instance) one MIG instance needs."""
    base = Path(proc_root) / "driver" / "nvidia" / "capabilities" / f"gpu{card.minor}" / "mig"
    gi_dir = base / f"gi{mig.gpu_instance_id}"
    nodes = []
    for access in (gi_dir / "access", gi_dir / f"ci{mig.compute_instance_id}" / "access"):
        name = f"nvidia-caps/nvidia-cap{read_cap_minor(access)}"
        nodes.append(DeviceNode(container_path=f"/dev/{name}", host_path=f"{dev_root}/{name}"))
    return nodes


def _node(dev_root: str, name: str) -> DeviceNode:
    return DeviceNode(container_path=f"/dev/{name}", host_path=f"{dev_root}/{name}")


def build_grant(
    request: GrantRequest, inventory: Inventory, proc_root: str = PROC_ROOT, dev_root: str = "/dev"
) -> Grant:
    """Exactly what was asked, in the asks' order, or a ``PluginError`` naming the offending field."""
    if not request.asks:
        return Grant(grant_id=request.grant_id)
    devices: list[GrantedDevice] = []
    visible: list[str] = []
    nodes: list[DeviceNode] = []
    for ask in request.asks:
        card = _card_of(ask, inventory)
        nodes.append(_node(dev_root, f"nvidia{card.minor}"))
        if ask.mig_uuid:
            mig = _mig_of(ask, card, inventory)
            if mig.uuid in visible:
                continue
            devices.append(
                GrantedDevice(
                    minor=card.minor,
                    uuid=card.uuid,
                    memory_gib=mig.memory_mib // 1024,
                    slices=mig.slices,
                    mig_uuid=mig.uuid,
                )
            )
            visible.append(mig.uuid)
            nodes.extend(mig_cap_nodes(card, mig, proc_root, dev_root))
            continue
        _refuse_share(ask)
        if card.mig_enabled:
            raise BackendRefused(
                f"card {card.minor} ({card.uuid}) is in MIG mode: only its MIG instances can be handed out"
            )
        if card.uuid not in visible:
            devices.append(GrantedDevice(minor=card.minor, uuid=card.uuid))
            visible.append(card.uuid)
    nodes.extend(_node(dev_root, name) for name in _CONTROL_NODES)
    nodes.extend(_node(dev_root, name) for name in _OPTIONAL_NODES if Path(dev_root, name).exists())
    return Grant(
        grant_id=request.grant_id,
        devices=tuple(devices),
        envs={VISIBLE_DEVICES_ENV: ",".join(visible)},
        device_nodes=tuple(dict.fromkeys(nodes)),
    )
