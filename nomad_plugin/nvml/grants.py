"""Turning a ``GrantRequest`` into what a task needs to use NVIDIA cards.

NVML has no server-side grant: a grant is the env var the NVIDIA container
runtime reads plus the device nodes an ``exec`` task needs. Whole cards and
MIG instances that already exist can be granted; shares cannot (NVML has no
time-division multiplexing) and MIG instances cannot be created.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from nomad_plugin.model.card import Card, Inventory, MigInstance
from nomad_plugin.model.errors import BackendRefused, GrantMismatch, ReservationRejected
from nomad_plugin.model.grant import DeviceAsk, DeviceNode, Grant, GrantedDevice, GrantRequest

VISIBLE_DEVICES_ENV = "NVIDIA_VISIBLE_DEVICES"
#: Request annotation naming the MIG instances (comma-separated MIG UUIDs) an ask means.
MIG_UUIDS_ANNOTATION = "nvml.mig_uuids"
_CONTROL_NODES = ("nvidiactl",)
_OPTIONAL_NODES = ("nvidia-uvm", "nvidia-uvm-tools")


def _requested_migs(request: GrantRequest) -> list[str]:
    named = [u.strip() for u in request.annotations.get(MIG_UUIDS_ANNOTATION, "").split(",") if u.strip()]
    for ask in request.asks:
        extra = getattr(ask, "mig_uuid", "")  # honoured if DeviceAsk ever grows this field
        if isinstance(extra, str) and extra and extra not in named:
            named.append(extra)
    return named


def _locate_migs(inventory: Inventory, mig_uuids: Iterable[str]) -> dict[str, tuple[Card, MigInstance]]:
    where: dict[str, tuple[Card, MigInstance]] = {}
    for card in inventory.cards:
        for mig in card.mig_instances:
            where[mig.uuid] = (card, mig)
    missing = [u for u in mig_uuids if u not in where]
    if missing:
        raise ReservationRejected(f"{MIG_UUIDS_ANNOTATION}: unknown MIG instance(s) {', '.join(missing)}")
    return where


def _check_ask(ask: DeviceAsk, card: Card | None, minors: list[int]) -> Card:
    if card is None:
        raise ReservationRejected(f"minor: card {ask.minor} is not on this node (NVML sees {minors})")
    if ask.core or ask.memory_gib:
        raise BackendRefused(
            f"card {ask.minor}: shares are not available with the NVML backend "
            f"(asked core={ask.core}%, memory_gib={ask.memory_gib}); NVML has no time-division "
            "sharing, ask for a whole card or an existing MIG instance, or use the XDM backend"
        )
    return card


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


def build_grant(request: GrantRequest, inventory: Inventory, proc_root: str = "/proc", dev_root: str = "/dev") -> Grant:
    """Exactly what was asked, or a ``PluginError`` naming the offending field."""
    if not request.asks:
        return Grant(grant_id=request.grant_id)
    mig_uuids = _requested_migs(request)
    mig_where = _locate_migs(inventory, mig_uuids)
    minors = sorted(c.minor for c in inventory.cards)
    devices: list[GrantedDevice] = []
    visible: list[str] = []
    nodes: list[DeviceNode] = []
    asked_minors: set[int] = set()
    for ask in request.asks:
        card = _check_ask(ask, inventory.by_minor(ask.minor), minors)
        asked_minors.add(card.minor)
        nodes.append(DeviceNode(container_path=f"/dev/nvidia{card.minor}", host_path=f"{dev_root}/nvidia{card.minor}"))
        if not ask.slices:
            devices.append(GrantedDevice(minor=card.minor, uuid=card.uuid))
            visible.append(card.uuid)
            continue
        on_card = [mig_where[u][1] for u in mig_uuids if mig_where[u][0].minor == card.minor]
        if not on_card:
            raise BackendRefused(
                f"card {card.minor}: asked for {ask.slices} MIG slice(s) without naming an existing MIG "
                f"instance ({MIG_UUIDS_ANNOTATION}); NVML cannot create MIG instances"
            )
        for mig in on_card:
            if mig.uuid in visible:
                continue
            devices.append(GrantedDevice(minor=card.minor, uuid=card.uuid, slices=mig.slices, mig_uuid=mig.uuid))
            visible.append(mig.uuid)
            nodes.extend(mig_cap_nodes(card, mig, proc_root, dev_root))
    strays = [u for u in mig_uuids if mig_where[u][0].minor not in asked_minors]
    if strays:
        raise ReservationRejected(f"{MIG_UUIDS_ANNOTATION}: {', '.join(strays)} not on any card that was asked for")
    for name in _CONTROL_NODES:
        nodes.append(DeviceNode(container_path=f"/dev/{name}", host_path=f"{dev_root}/{name}"))
    for name in _OPTIONAL_NODES:
        if Path(dev_root, name).exists():
            nodes.append(DeviceNode(container_path=f"/dev/{name}", host_path=f"{dev_root}/{name}"))
    unique = list(dict.fromkeys(nodes))
    return Grant(
        grant_id=request.grant_id,
        devices=tuple(devices),
        envs={VISIBLE_DEVICES_ENV: ",".join(visible)},
        device_nodes=tuple(unique),
    )
