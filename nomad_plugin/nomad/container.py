"""What a task may receive from a grant: the policy XDM's answer must pass, and the ``ContainerReservation`` built from it.

Everything XDM returns passes the Reserve content policy (``ReservePolicy``,
docs/reserve.md "What XDM may hand a task") before it reaches a task: a mount
becomes a host bind mount, a device spec opens a host device, an env value goes
through Nomad's ``${...}`` interpolation. A grant that fails raises
``GrantRejected`` (its ``rule`` a bounded metric label); the reserve flow
(``nomad/reserve.py``) then releases it.
"""

from __future__ import annotations

import logging
import os
import posixpath
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from nomad_plugin._proto.nomad import device_pb2
from nomad_plugin.model.errors import PluginError
from nomad_plugin.model.grant import DeviceNode, Grant, MountSpec
from nomad_plugin.model.instances import GroupKey, Instance, Kind
from nomad_plugin.nomad.catalog import MIG_UNITS
from nomad_plugin.util.text import SYSTEM_DIRS

log = logging.getLogger(__name__)

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


#: ``GrantRejected.rule`` values (the label of ``lingjun_plugin_reserve_policy_violations_total``).
RULES = ("path", "size", "device", "env", "visibility", "mount")


class GrantRejected(PluginError):
    """The backend's grant cannot be handed to a task safely (and is released); ``rule`` says which rule."""

    def __init__(self, message: str, rule: str = "path") -> None:
        super().__init__(message)
        self.rule = rule if rule in RULES else "path"


# --- the Reserve content policy -------------------------------------------------------------
#: Bounds on one grant, above what a 16-card MIG grant needs: execve fails with E2BIG past 128 KiB
#: for one string and past the stack limit / 4 for all of them.
MAX_ENV = 256
MAX_ENV_VALUE = 32 * 1024
MAX_ENV_TOTAL = 128 * 1024
MAX_DEVICE_NODES = 512
MAX_MOUNTS = 256
MAX_PATH = 4096
#: Env names a grant may never set, unless ``xdm_env_allow`` names them.
PROTECTED_ENV = re.compile(r"(?:NOMAD_.*|PATH|LD_.*)\Z")
#: Env variables that decide which cards a container runtime exposes: exactly the granted cards.
VISIBILITY_ENV = frozenset(
    {"NVIDIA_VISIBLE_DEVICES", "NVIDIA_MIG_CONFIG_DEVICES", "NVIDIA_MIG_MONITOR_DEVICES", "PPU_VISIBLE_DEVICES"}
)
#: Host trees (secrets, sockets, others' state, devices) a mount may not show nor hold, unless ``xdm_mount_allow``.
PROTECTED_HOST_TREES = ("/etc", "/root", "/home", "/boot", "/proc", "/sys", "/dev", "/run", "/var/run", "/var/lib")
#: Task trees a mount may not land in (the runtime writes hosts and resolv.conf to /etc).
PROTECTED_TASK_TREES = ("/proc", "/sys", "/dev", "/etc", "/alloc", "/local", "/secrets")
#: Per accelerator family: (node pattern, whether its number must be a granted minor, offset from the minor).
_NODE_FAMILIES: dict[str, tuple[tuple[re.Pattern[str], bool, int], ...]] = {
    "nvidia": (
        (re.compile(r"/dev/nvidia(\d+)\Z"), True, 0),
        (re.compile(r"/dev/nvidia(?:ctl|-uvm|-uvm-tools|-modeset)\Z"), False, 0),
        (re.compile(r"/dev/nvidia-caps/nvidia-cap(\d+)\Z"), False, 0),  # MIG capabilities
    ),
    "amd": (
        (re.compile(r"/dev/kfd\Z"), False, 0),
        (re.compile(r"/dev/dri/card(\d+)\Z"), True, 0),
        (re.compile(r"/dev/dri/renderD(\d+)\Z"), True, 128),
    ),
    "ppu": (
        (re.compile(r"/dev/alixpu(?:_ctl)?\Z"), False, 0),
        (re.compile(r"/dev/alixpu(\d+)\Z"), True, 0),
    ),
}


@dataclass(frozen=True)
class ReservePolicy:
    """The operator's exceptions to the content policy (``xdm_env_allow``, ``xdm_mount_allow``)."""

    env_allow: frozenset[str] = frozenset()
    mount_allow: tuple[str, ...] = ()
    #: The plugin's own directory: never shown to a task.
    data_dir: str = ""

    def mount_allowed(self, host_path: str) -> bool:
        return any(_under(host_path, allowed) for allowed in self.mount_allow)


def _under(path: str, tree: str) -> bool:
    return path == tree or tree == "/" or path.startswith(tree.rstrip("/") + "/")


def _shown(value: str, limit: int = 80) -> str:
    """A value as an error repeats it: repr (control characters escaped), bounded."""
    text = repr(value[: limit + 1])
    return text if len(value) <= limit else text[:-1] + f"...' ({len(value)} chars)"


def family_of(group: GroupKey) -> str:
    vendor = group.vendor.lower()
    return vendor if vendor in ("nvidia", "amd") else "ppu"


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
    if len(path) > MAX_PATH:
        raise GrantRejected(f"XDM returned a {what} of {len(path)} characters (at most {MAX_PATH})", "size")
    if "\x00" in path or _CONTROL.search(path) or "\t" in path:
        raise GrantRejected(f"XDM returned a {what} with a control character: {_shown(path)}")
    if not path.startswith("/") or path.startswith("//"):
        raise GrantRejected(f"XDM returned a {what} that is not a plain absolute path: {_shown(path)}")
    if ".." in path.split("/"):
        raise GrantRejected(f"XDM returned a {what} containing '..': {_shown(path)}")
    if posixpath.normpath(path) != path:
        raise GrantRejected(f"XDM returned a {what} that is not normalised: {_shown(path)}")
    if under_dev and not path.startswith("/dev/"):
        raise GrantRejected(f"XDM returned a {what} outside /dev/: {_shown(path)}")
    return path


def check_env(key: str, value: str, source: str) -> None:
    if not _ENV_KEY.match(key):
        raise GrantRejected(
            f"{source} env name {_shown(key)} is not a valid variable name ([A-Za-z_][A-Za-z0-9_]*)", "env"
        )
    if _CONTROL.search(value):
        raise GrantRejected(f"{source} env {key} has a control character (NUL or newline) in its value", "env")
    if "${" in value:
        raise GrantRejected(f"{source} env {key}={_shown(value)} contains '${{', which Nomad would interpolate", "env")


def annotation_env_name(key: str) -> str | None:
    """``xdm.amp.com/allocation-id`` -> ``XDM_AMP_COM_ALLOCATION_ID``; None if the key is not allowed."""
    if not _ANNOTATION_KEY.match(key):
        return None
    name = re.sub(r"[^A-Z0-9]", "_", key.upper())
    return name if _ENV_KEY.match(name) else None


def _check_sizes(grant: Grant) -> None:
    """Counts first, so that a grant of 10,000 specs is refused before it is walked."""
    counts = (
        ("device specs", len(grant.device_nodes), MAX_DEVICE_NODES),
        ("mounts", len(grant.mounts), MAX_MOUNTS),
        ("env variables", len(grant.envs), MAX_ENV),
        ("annotations", len(grant.annotations), MAX_ENV),
    )
    for what, count, limit in counts:
        if count > limit:
            raise GrantRejected(f"XDM's grant {grant.grant_id} carries {count} {what} (at most {limit})", "size")


def _checked_mounts(grant: Grant, policy: ReservePolicy) -> tuple[MountSpec, ...]:
    out = []
    for m in grant.mounts:
        host = check_path(m.host_path, "mount host path")
        task = check_path(m.container_path, "mount container path")
        if host == "/":
            raise GrantRejected("XDM returned a mount of the host root '/'", "mount")
        allowed = policy.mount_allowed(host)
        if not m.read_only and not allowed:
            raise GrantRejected(
                f"XDM returned a read-write mount of {_shown(host)}; mounts are read-only unless "
                "xdm_mount_allow names the host path",
                "mount",
            )
        if not allowed:
            for tree in (*PROTECTED_HOST_TREES, *((policy.data_dir,) if policy.data_dir else ())):
                if _under(host, tree) or _under(tree, host):
                    raise GrantRejected(
                        f"XDM returned a mount of host path {_shown(host)}, which "
                        f"{'lies in' if _under(host, tree) else 'holds'} {tree}; allowed only with xdm_mount_allow",
                        "mount",
                    )
        if task in SYSTEM_DIRS or any(_under(d, task) for d in SYSTEM_DIRS if d != "/"):
            raise GrantRejected(
                f"XDM returned a mount onto {_shown(task)} in the task, which would cover a system directory", "mount"
            )
        for tree in PROTECTED_TASK_TREES:
            if _under(task, tree):
                raise GrantRejected(f"XDM returned a mount onto {_shown(task)} in the task, inside {tree}", "mount")
        out.append(m)
    return tuple(out)


def _checked_nodes(grant: Grant, group: GroupKey) -> tuple[DeviceNode, ...]:
    family = _NODE_FAMILIES[family_of(group)]
    minors = {d.minor for d in grant.devices}
    for d in grant.device_nodes:
        check_path(d.host_path, "device host path", under_dev=True)
        check_path(d.container_path, "device container path", under_dev=True)
        if not _PERMISSIONS.match(d.permissions):
            raise GrantRejected(f"XDM returned device permissions {_shown(d.permissions)} (allowed: r, w, m)", "device")
        if not _node_of(d.host_path, family, minors):
            raise GrantRejected(
                f"XDM returned device node {_shown(d.host_path)}, which is not a {family_of(group)} device node "
                f"of the granted card(s) {sorted(minors)}",
                "device",
            )
        if not _node_of(d.container_path, family, None):
            raise GrantRejected(
                f"XDM returned device node {_shown(d.host_path)} as {_shown(d.container_path)} in the task, "
                f"which is not a {family_of(group)} device node name",
                "device",
            )
    return grant.device_nodes


def _node_of(path: str, family: tuple[tuple[re.Pattern[str], bool, int], ...], minors: set[int] | None) -> bool:
    """``path`` is a node of ``family``; for a per-card node, of one of ``minors`` (None: any card)."""
    for pattern, per_card, offset in family:
        match = pattern.match(path)
        if match is None:
            continue
        if not per_card or minors is None:
            return True
        return int(match.group(1)) - offset in minors
    return False


def _check_env_policy(key: str, value: str, source: str, policy: ReservePolicy) -> None:
    if len(value) > MAX_ENV_VALUE:
        raise GrantRejected(f"{source} env {key} is {len(value)} characters long (at most {MAX_ENV_VALUE})", "size")
    if PROTECTED_ENV.match(key) and key not in policy.env_allow:
        raise GrantRejected(
            f"{source} env {key} would override the task's own {key} (NOMAD_*, PATH and LD_* are protected; "
            "xdm_env_allow lists the names XDM may set)",
            "env",
        )


def _check_visibility(envs: Mapping[str, str], grant: Grant, instances: Sequence[Instance]) -> None:
    """Each visibility variable names exactly the granted cards (by card UUID, MIG UUID or minor)."""
    cards: dict[str, int] = {}  # name -> minor
    for d in grant.devices:
        for name in (d.uuid or _uuid_of(d.minor, instances), d.mig_uuid, str(d.minor)):
            if name:
                cards[name] = d.minor
    if not grant.devices:  # an env- or annotation-only grant: the cards asked for
        for inst in instances:
            for name in (inst.card_uuid, inst.mig_uuid, str(inst.minor)):
                if name:
                    cards[name] = inst.minor
    granted = set(cards.values())
    for key in sorted(VISIBILITY_ENV & envs.keys()):
        tokens = [t.strip() for t in envs[key].split(",")]
        unknown = [t for t in tokens if t not in cards]
        if unknown:
            raise GrantRejected(
                f"XDM's env {key}={_shown(envs[key])} names {_shown(', '.join(unknown[:3]))}, which "
                f"{'is' if len(unknown) == 1 else 'are'} not among the granted card(s) {sorted(granted)}",
                "visibility",
            )
        named = {cards[t] for t in tokens}
        if named != granted:
            raise GrantRejected(
                f"XDM's env {key}={_shown(envs[key])} names card(s) {sorted(named)}, not exactly the granted "
                f"card(s) {sorted(granted)}",
                "visibility",
            )


# --- mapping -----------------------------------------------------------------
def build_container(
    grant: Grant,
    instances: Sequence[Instance],
    group: GroupKey,
    *,
    path_exists: Callable[[str], bool] = os.path.exists,
    policy: ReservePolicy = ReservePolicy(),
) -> ContainerSpec:
    """Validate ``grant`` (made for ``instances``, in request order) against the content policy and
    turn it into what Nomad gives the task, XDM's mounts included (the reserve flow's mount policy decides
    afterwards whether they reach the task)."""
    _check_sizes(grant)
    mounts = _checked_mounts(grant, policy)
    nodes = _checked_nodes(grant, group) or _derived_nodes(grant, group, path_exists)
    envs = _derived_envs(grant, instances, group)
    from_xdm: dict[str, str] = {}
    for key in sorted(grant.annotations):
        name = annotation_env_name(key)
        value = grant.annotations[key]
        if name is None or name.startswith(OWN_PREFIX) or name in envs or name in grant.envs:
            log.warning(
                "grant %s: annotation %s not carried as env (name not allowed or taken)", grant.grant_id, _shown(key)
            )
            continue
        try:
            check_env(name, value, "XDM annotation")
        except GrantRejected as exc:
            log.warning("grant %s: annotation %s not carried as env: %s", grant.grant_id, _shown(key), exc)
            continue
        _check_env_policy(name, value, f"XDM annotation {_shown(key)} as", policy)
        from_xdm[name] = value
    for key, value in grant.envs.items():
        check_env(key, value, "XDM")
        if key.startswith(OWN_PREFIX):
            log.warning("grant %s: XDM env %s ignored (prefix %s is the plugin's)", grant.grant_id, key, OWN_PREFIX)
            continue
        _check_env_policy(key, value, "XDM", policy)
        from_xdm[key] = value
    _check_visibility(from_xdm, grant, instances)
    envs.update(from_xdm)
    envs.update(_own_envs(grant, instances))
    if ENV_NVIDIA_VISIBLE in envs:
        envs[ENV_NVIDIA_VISIBLE] = in_request_order(envs[ENV_NVIDIA_VISIBLE], instances)
    total = sum(len(k) + len(v) + 2 for k, v in envs.items())
    if total > MAX_ENV_TOTAL or len(envs) > MAX_ENV:
        raise GrantRejected(
            f"XDM's grant {grant.grant_id} makes {len(envs)} env variables of {total} bytes in all "
            f"(at most {MAX_ENV} and {MAX_ENV_TOTAL} bytes)",
            "size",
        )
    return ContainerSpec(envs=envs, mounts=mounts, devices=nodes)


def in_request_order(visible: str, instances: Sequence[Instance]) -> str:
    """``NVIDIA_VISIBLE_DEVICES`` in the order Nomad asked (CUDA numbers devices so), as
    nomad-device-nvidia joins the IDs, when it lists exactly the requested IDs."""
    ids = [i.id for i in instances]
    listed = [v for v in visible.split(",") if v]
    return ",".join(ids) if sorted(listed) == sorted(ids) else visible


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
    return max(1, min(100, round(slices * 100 / MIG_UNITS)))


def _derived_nodes(grant: Grant, group: GroupKey, path_exists: Callable[[str], bool]) -> tuple[DeviceNode, ...]:
    """Fallback when XDM names no device nodes: the vendor's usual nodes that exist on this host."""
    if _is_nvidia(group):
        paths = [f"/dev/nvidia{d.minor}" for d in grant.devices] + list(NVIDIA_CONTROL_NODES)
    else:
        paths = list(PPU_NODES)
    return tuple(DeviceNode(p, p, "rwm") for p in _unique(paths) if path_exists(p))


def _uuid_of(minor: int, instances: Sequence[Instance]) -> str:
    return next((inst.card_uuid for inst in instances if inst.minor == minor), "")


def _unique(values: Iterable[str]) -> list[str]:
    """The non-empty values, first occurrence first."""
    return list(dict.fromkeys(v for v in values if v))
