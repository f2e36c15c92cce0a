"""Grant -> Nomad ``ContainerReservation``: what the task needs to see its devices.

Pure and defensive: everything XDM returns is validated here, because a path
in a ``Mount`` becomes a host bind mount and an env value goes through
Nomad's ``${...}`` interpolation. A grant that fails validation raises
``GrantRejected``; the reserver then releases it (a malformed response never
reaches a task). The env names and the annotation mapping are documented in
``docs/reserve.md``.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from nomad_plugin._proto.nomad import device_pb2
from nomad_plugin.goplugin.logging import get_logger
from nomad_plugin.model.errors import PluginError
from nomad_plugin.model.grant import DeviceNode, Grant, MountSpec
from nomad_plugin.model.instances import GroupKey, Instance, Kind

log = get_logger(__name__)

ENV_GRANT_ID = "LINGJUN_GRANT_ID"
ENV_DEVICE_IDS = "LINGJUN_DEVICE_IDS"
ENV_MINORS = "LINGJUN_DEVICE_MINORS"
ENV_CARD_UUIDS = "LINGJUN_CARD_UUIDS"
ENV_MODE = "LINGJUN_MODE"
# LINGJUN_MODE uses the config's names for the modes: a share of a card is "tdm", as in default_mode.
MODE_NAMES = {Kind.SHARE: "tdm"}
ENV_CORE = "LINGJUN_CORE_LIMIT_PERCENT"
ENV_MEMORY = "LINGJUN_MEMORY_LIMIT_GIB"
ENV_SLICES = "LINGJUN_MIG_SLICES"
ENV_NVIDIA_VISIBLE = "NVIDIA_VISIBLE_DEVICES"
ENV_PPU_VISIBLE = "PPU_VISIBLE_DEVICES"
#: A MIG card's compute is split in sevenths (catalog.MIG_UNITS; kept local: nomad/ imports no catalog).
MIG_COMPUTE_SLICES = 7
#: Prefix the plugin reserves for itself: XDM may not override these.
OWN_PREFIX = "LINGJUN_"

_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
#: Annotation keys carried over as env: DNS-ish names with an optional prefix.
_ANNOTATION_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,252}\Z")
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # control chars except TAB
_PERMISSIONS = re.compile(r"(?!.*(.).*\1)[rwm]{1,3}\Z")

#: Host device nodes derived when XDM returns none (only those that exist are used).
NVIDIA_CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
PPU_NODES = ("/dev/alixpu", "/dev/alixpu_ctl")


class GrantRejected(PluginError):
    """The backend's grant cannot be handed to a task safely (and is released)."""


@dataclass(frozen=True)
class ContainerSpec:
    envs: Mapping[str, str]
    mounts: tuple[MountSpec, ...]
    devices: tuple[DeviceNode, ...]

    def to_proto(self) -> device_pb2.ContainerReservation:
        return device_pb2.ContainerReservation(
            envs=dict(self.envs),
            mounts=[
                device_pb2.Mount(task_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
                for m in self.mounts
            ],
            devices=[
                device_pb2.DeviceSpec(task_path=d.container_path, host_path=d.host_path, permissions=d.permissions)
                for d in self.devices
            ],
        )


# --- validation --------------------------------------------------------------
def check_path(path: str, what: str, *, under_dev: bool = False) -> str:
    """Return ``path`` if it is absolute, normalised and clean, else raise ``GrantRejected``."""
    if not isinstance(path, str) or not path:
        raise GrantRejected(f"XDM returned an empty {what}")
    if "\x00" in path or _CONTROL.search(path) or "\t" in path:
        raise GrantRejected(f"XDM returned a {what} with a control character: {path!r}")
    if not path.startswith("/") or path.startswith("//"):
        raise GrantRejected(f"XDM returned a {what} that is not a plain absolute path: {path!r}")
    if ".." in path.split("/"):
        raise GrantRejected(f"XDM returned a {what} containing '..': {path!r}")
    if posixpath.normpath(path) != path:
        raise GrantRejected(f"XDM returned a {what} that is not normalised: {path!r}")
    if under_dev and not path.startswith("/dev/"):
        raise GrantRejected(f"XDM returned a {what} outside /dev/: {path!r}")
    return path


def check_env(key: str, value: str, source: str) -> None:
    if not _ENV_KEY.match(key):
        raise GrantRejected(f"{source} env name {key!r} is not a valid variable name ([A-Za-z_][A-Za-z0-9_]*)")
    if _CONTROL.search(value):
        raise GrantRejected(f"{source} env {key} has a control character (NUL or newline) in its value")
    if "${" in value:
        raise GrantRejected(f"{source} env {key}={value!r} contains '${{', which Nomad would interpolate")


def annotation_env_name(key: str) -> str | None:
    """``xdm.amp.com/allocation-id`` -> ``XDM_AMP_COM_ALLOCATION_ID``; None if the key is not allowed."""
    if not _ANNOTATION_KEY.match(key):
        return None
    name = re.sub(r"[^A-Z0-9]", "_", key.upper())
    return name if _ENV_KEY.match(name) else None


def _checked_mounts(grant: Grant) -> tuple[MountSpec, ...]:
    out = []
    for m in grant.mounts:
        host = check_path(m.host_path, "mount host path")
        check_path(m.container_path, "mount container path")
        if host == "/":
            raise GrantRejected("XDM returned a mount of the host root '/'")
        out.append(m)
    return tuple(out)


def _checked_nodes(grant: Grant) -> tuple[DeviceNode, ...]:
    for d in grant.device_nodes:
        check_path(d.host_path, "device host path", under_dev=True)
        check_path(d.container_path, "device container path", under_dev=True)
        if not _PERMISSIONS.match(d.permissions):
            raise GrantRejected(f"XDM returned device permissions {d.permissions!r} (allowed: r, w, m)")
    return grant.device_nodes


# --- mapping -----------------------------------------------------------------
def build_container(
    grant: Grant,
    instances: Sequence[Instance],
    group: GroupKey,
    *,
    include_mounts: bool = False,
    path_exists: Callable[[str], bool] = os.path.exists,
) -> ContainerSpec:
    """Validate ``grant`` and turn it into what Nomad gives the task.

    ``instances`` are the Nomad instances the grant was made for (in request
    order). Mounts are validated always but passed on only with
    ``include_mounts`` (a non-empty mount list replaces the task's volume
    mounts in Nomad, §5.5).
    """
    mounts = _checked_mounts(grant)
    nodes = _checked_nodes(grant) or _derived_nodes(grant, group, path_exists)
    envs = _derived_envs(grant, instances, group)
    for key in sorted(grant.annotations):
        name = annotation_env_name(key)
        value = grant.annotations[key]
        if name is None or name.startswith(OWN_PREFIX) or name in envs:
            log.warning("grant %s: annotation %r not carried as env (name not allowed or taken)", grant.grant_id, key)
            continue
        try:
            check_env(name, value, "XDM annotation")
        except GrantRejected as exc:
            log.warning("grant %s: annotation %r not carried as env: %s", grant.grant_id, key, exc)
            continue
        envs[name] = value
    for key, value in grant.envs.items():
        check_env(key, value, "XDM")
        if key.startswith(OWN_PREFIX):
            log.warning("grant %s: XDM env %s ignored (prefix %s is the plugin's)", grant.grant_id, key, OWN_PREFIX)
            continue
        envs[key] = value
    envs.update(_own_envs(grant, instances))
    return ContainerSpec(envs=envs, mounts=mounts if include_mounts else (), devices=nodes)


def _is_nvidia(group: GroupKey) -> bool:
    return group.vendor.lower() == "nvidia"


def _derived_envs(grant: Grant, instances: Sequence[Instance], group: GroupKey) -> dict[str, str]:
    """Visible-devices env; XDM's own envs (applied after) override it."""
    if _is_nvidia(group):
        migs = [d.mig_uuid for d in grant.devices if d.mig_uuid]
        visible = migs or _unique(d.uuid or _uuid_of(d.minor, instances) for d in grant.devices)
        return {ENV_NVIDIA_VISIBLE: ",".join(visible)} if visible else {}
    minors = _unique(str(d.minor) for d in grant.devices)
    return {ENV_PPU_VISIBLE: ",".join(minors)} if minors else {}


def _own_envs(grant: Grant, instances: Sequence[Instance]) -> dict[str, str]:
    kinds = {i.kind for i in instances}
    kind = kinds.pop() if len(kinds) == 1 else Kind.WHOLE
    first = grant.devices[0] if grant.devices else None
    on_first = [i for i in instances if first and i.minor == first.minor]
    core = (first.core if first else 0) or min(100, sum(i.core for i in on_first)) or 100
    memory = (first.memory_gib if first else 0) or sum(i.memory_gib for i in on_first)
    slices = (first.slices if first else 0) or sum(max(1, i.slices) for i in on_first)
    if kind in (Kind.MIG, Kind.MIG_INSTANCE) and first and not first.core:
        core = mig_core_percent(slices)
    envs = {
        ENV_GRANT_ID: grant.grant_id,
        ENV_DEVICE_IDS: ",".join(i.id for i in instances),
        ENV_MINORS: ",".join(_unique(str(d.minor) for d in grant.devices)),
        ENV_CARD_UUIDS: ",".join(_unique(d.uuid or _uuid_of(d.minor, instances) for d in grant.devices)),
        ENV_MODE: MODE_NAMES.get(kind, kind.value),
        ENV_CORE: str(core),
        ENV_MEMORY: str(memory),
    }
    if kind in (Kind.MIG, Kind.MIG_INSTANCE) and first:
        envs[ENV_SLICES] = str(slices)
    for key, value in envs.items():
        check_env(key, value, "plugin")
    return envs


def mig_core_percent(slices: int) -> int:
    """A MIG slice's share of the card's compute: ``slices`` of the card's 7, rounded (3 -> 43)."""
    return max(1, min(100, round(slices * 100 / MIG_COMPUTE_SLICES)))


def _derived_nodes(grant: Grant, group: GroupKey, path_exists: Callable[[str], bool]) -> tuple[DeviceNode, ...]:
    """Fallback when XDM names no device nodes: the vendor's usual nodes that exist on this host."""
    if _is_nvidia(group):
        paths = [f"/dev/nvidia{d.minor}" for d in grant.devices] + list(NVIDIA_CONTROL_NODES)
    else:
        paths = list(PPU_NODES)
    return tuple(DeviceNode(p, p, "rwm") for p in _unique(paths) if path_exists(p))


def _uuid_of(minor: int, instances: Sequence[Instance]) -> str:
    for inst in instances:
        if inst.minor == minor:
            return inst.card_uuid
    return ""


def _unique(values: Iterable[str]) -> list[str]:
    seen: dict[str, None] = {}
    for v in values:
        if v:
            seen.setdefault(v, None)
    return list(seen)
