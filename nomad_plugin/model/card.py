"""The node's accelerator cards as a backend sees them, the node metadata made of them, and the Backend port.

Topology levels (XDM's ``extenderResources["topology"]``) are kept by *name*
(``numaNodes``, ``leafSwitch``): level numbers differ between models, and the
JSON is loose (any order, optional ``peers``, ``topo<level>`` an int list or a
string). A bad topology never drops the card: :func:`parse_topology` never
raises, it returns what it read plus an ``error``.

Nomad evaluates ``constraint``, ``affinity`` and ``spread`` outside a ``device``
block on node attributes and meta only, so the topology also becomes node meta
(:func:`node_meta`, keys in docs/topology.md), which the publisher and
``nomad-device-lingjun node-meta`` both call.

``Backend`` is the contract XDM and NVML fulfil (``xdm.backend``,
``nvml.backend``; ``backend_select`` picks one): each owns its I/O and threads.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

from nomad_plugin.model.grant import Grant, GrantRequest
from nomad_plugin.model.metrics import MetricSample

if TYPE_CHECKING:
    from nomad_plugin.config.model import PluginConfig


@dataclass(frozen=True)
class TopologyLevel:
    level: int
    name: str
    # ``topo<level>`` value: an int tuple for intra-node levels, a string
    # for rack and network levels.
    domain: tuple[int, ...] | str
    peers: tuple[int, ...] | None = None

    @property
    def domain_text(self) -> str:
        """The domain as one attribute-friendly string ("0", "0,1", "asw-001")."""
        if isinstance(self.domain, str):
            return self.domain
        return ",".join(str(v) for v in self.domain)


@dataclass(frozen=True)
class Topology:
    levels: tuple[TopologyLevel, ...] = ()
    # Set when the JSON could not be (fully) parsed; the card is kept anyway.
    error: str = ""

    def level(self, name: str) -> TopologyLevel | None:
        for lvl in self.levels:
            if lvl.name == name:
                return lvl
        return None

    def domain(self, name: str) -> str | None:
        lvl = self.level(name)
        return None if lvl is None else lvl.domain_text


_MAX_TEXT = 1 << 20  # 1 MiB: a topology is a few hundred bytes; refuse absurd input


def parse_topology(text: str | None) -> Topology:
    """Return the levels sorted by ``level`` (nearest first); never raises."""
    if text is None or not str(text).strip():
        return Topology()
    if len(text) > _MAX_TEXT:
        return Topology(error=f"topology JSON too large ({len(text)} chars)")
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:
        return Topology(error=f"topology is not valid JSON: {exc}")
    if not isinstance(doc, dict):
        return Topology(error=f"topology must be a JSON object, got {type(doc).__name__}")
    raw_levels = doc.get("levels")
    if raw_levels is None:
        return Topology(error='topology has no "levels" list')
    if not isinstance(raw_levels, list):
        return Topology(error=f'topology "levels" must be a list, got {type(raw_levels).__name__}')
    levels: list[TopologyLevel] = []
    problems: list[str] = []
    for index, raw in enumerate(raw_levels):
        level, problem = _parse_level(raw)
        if level is not None:
            levels.append(level)
        if problem:
            problems.append(f"levels[{index}]: {problem}")
    levels.sort(key=lambda lvl: (lvl.level, lvl.name))
    return Topology(levels=tuple(levels), error="; ".join(problems))


def _parse_level(raw: Any) -> tuple[TopologyLevel | None, str]:
    """One level element -> (level or None when skipped, problem text)."""
    if not isinstance(raw, dict):
        return None, f"not an object ({type(raw).__name__}), skipped"
    number = _as_int(raw.get("level"))
    name = raw.get("name")
    if number is None:
        return None, f"missing or non-integer level {raw.get('level')!r}, skipped"
    if not isinstance(name, str) or not name.strip():
        return None, f"level {number} has no name, skipped"
    key = f"topo{number}"
    value = raw.get(key)
    if isinstance(value, str):
        domain: tuple[int, ...] | str | None
        domain, problem = value, ""
    else:
        domain, problem = _ints(value, key) if value is not None else (None, f"{key} missing")
    peers, peer_problem = _ints(raw["peers"], "peers") if raw.get("peers") is not None else (None, "")
    text = "; ".join(p for p in (problem, peer_problem) if p)
    return TopologyLevel(level=number, name=name, domain=() if domain is None else domain, peers=peers), text


def _ints(value: Any, key: str) -> tuple[tuple[int, ...] | None, str]:
    """An int or a list of ints (None if neither), and the problem with it."""
    single = _as_int(value)
    if single is not None:
        return (single,), ""
    if not isinstance(value, list):
        return None, f"{key} has unsupported type {type(value).__name__}"
    ints = tuple(i for i in map(_as_int, value) if i is not None)
    return ints, f"{key} has non-integer entries {value!r}" if len(ints) != len(value) else ""


def _as_int(value: Any) -> int | None:
    """An int (not bool); integral floats and digit strings are accepted too."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value.strip())
    return None


@dataclass(frozen=True)
class MigInstance:
    """A MIG instance that already exists on a card (NVML backend only)."""

    uuid: str
    profile: str  # e.g. "1g.10gb"
    slices: int  # compute slices (1..7)
    memory_mib: int
    gpu_instance_id: int = -1
    compute_instance_id: int = -1
    #: NVML's name of the MIG device ("NVIDIA A100-SXM4-80GB MIG 1g.10gb"); "" when unknown
    name: str = ""


@dataclass(frozen=True)
class Card:
    """One physical card: ``memory_mib`` in XDM's ``totalMemory`` unit, ``total_core`` in percent of
    a card, ``healthy`` the backend's raw verdict before hysteresis."""

    minor: int
    uuid: str
    model: str
    vendor: str
    xpu_type: str
    memory_mib: int
    total_core: int = 100
    pci_bus_id: str = ""
    healthy: bool = True
    health_reason: str = ""
    driver_version: str = ""
    #: XDM ListGpuInfo's SDK version (CUDA on NVIDIA cards, the PPU SDK on Alibaba's)
    sdk_version: str = ""
    numa_node: int | None = None
    mig_capable: bool = False
    #: MIG mode is on now (NVML backend): only the card's MIG instances can be handed out
    mig_enabled: bool = False
    topology: Topology = field(default_factory=Topology)
    mig_instances: tuple[MigInstance, ...] = ()
    extra: Mapping[str, str] = field(default_factory=dict)

    @property
    def memory_gib(self) -> int:
        """Whole GiB, floor division (R10: 81920 MiB -> 80 GiB)."""
        return self.memory_mib // 1024

    @property
    def vendor_name(self) -> str:
        """The vendor as the node offers it (Nomad's device vendor)."""
        return self.vendor.strip().lower() or "unknown"

    @property
    def family(self) -> str:
        """The device family (Nomad's device type): gpu for NVIDIA (drop-in), ppu for Alibaba."""
        if self.vendor_name == "nvidia":
            return "gpu"
        return self.xpu_type.strip().lower() or ("ppu" if self.vendor_name == "alibaba" else "xpu")

    @property
    def model_name(self) -> str:
        return self.model.strip() or "N/A"

    @property
    def label(self) -> str:
        """How problems name the card."""
        return f"card {self.minor} ({self.uuid or 'no uuid'}, {self.model_name!r})"


@dataclass(frozen=True)
class Inventory:
    """A complete snapshot (each push replaces the last). While unreachable the cards are the last
    known ones; ``unreachable_since`` is unix seconds. ``node``: node-wide facts as strings."""

    cards: tuple[Card, ...] = ()
    reachable: bool = True
    unreachable_reason: str = ""
    unreachable_since: float = 0.0
    node: Mapping[str, str] = field(default_factory=dict)
    generation: int = 0

    def by_minor(self, minor: int) -> Card | None:
        for card in self.cards:
            if card.minor == minor:
                return card
        return None

    def by_uuid(self, uuid: str) -> Card | None:
        for card in self.cards:
            if card.uuid == uuid:
                return card
        return None


#: Keys of ``Inventory.node``.
NODE_DRIVER_VERSION = "driver_version"
#: The CUDA driver API version ("12.4"): a node fact on NVML nodes, a ``Card.extra`` from the NVML companion.
CUDA_VERSION = "cuda_version"
NODE_RUNTIME_KIT = "runtime_kit"
#: Which backend read the cards; "nvml" lists NVIDIA devices in UUID order, as nomad-device-nvidia does.
NODE_SOURCE = "source"
SOURCE_NVML = "nvml"


def _ids(values: tuple[str, ...]) -> set[str]:
    return {v.strip().casefold() for v in values if v.strip()}


def _is_filtered(card: Card, config: PluginConfig) -> bool:
    """Whether the whole card is hidden. ``ignored_gpu_ids`` hides what nomad-device-nvidia
    fingerprints: a card in MIG mode is not, its MIG instances are, so it stays."""
    ours = _ids(config.ignored_ids)
    if card.uuid.casefold() in ours or str(card.minor) in ours:
        return True
    if not card.mig_enabled and card.uuid.casefold() in _ids(config.ignored_gpu_ids):
        return True
    vendor = card.vendor_name
    families = {card.family, card.xpu_type.strip().lower()}
    if config.include_vendors and vendor not in {v.strip().lower() for v in config.include_vendors}:
        return True
    if vendor in {v.strip().lower() for v in config.exclude_vendors}:
        return True
    if config.include_types and not families & {t.strip().lower() for t in config.include_types}:
        return True
    return bool(families & {t.strip().lower() for t in config.exclude_types})


def offered_cards(inventory: Inventory, config: PluginConfig) -> tuple[tuple[Card, ...], list[str]]:
    """The cards the plugin offers (by minor), and every problem found on the way.

    MIG instances are hidden by their own UUID in either ignore list, as
    nomad-device-nvidia does; a card without or with a duplicate UUID is skipped.
    """
    if not config.enabled:
        return (), []
    ignored = _ids((*config.ignored_ids, *config.ignored_gpu_ids))
    problems: list[str] = []
    for card in inventory.cards:
        if card.mig_enabled and card.uuid.casefold() in _ids(config.ignored_gpu_ids):
            kept = ", ".join(m.uuid for m in card.mig_instances) or "none yet"
            problems.append(
                f"ignored_gpu_ids names {card.label}, which is in MIG mode: as in nomad-device-nvidia this "
                f"hides none of its MIG instances ({kept}); list their MIG UUIDs there, or the card in ignored_ids"
            )
    offered: list[Card] = []
    seen_uuids: set[str] = set()
    seen_minors: set[int] = set()
    for card in sorted(inventory.cards, key=lambda c: (c.minor, c.uuid)):
        if _is_filtered(card, config):
            continue
        if not card.uuid:
            problems.append(f"card {card.minor}: no UUID, cannot form a stable device ID; skipped")
            continue
        if card.uuid in seen_uuids:
            problems.append(f"{card.label}: duplicate UUID; skipped")
            continue
        if card.minor in seen_minors:
            problems.append(f"{card.label}: duplicate minor {card.minor}")
        seen_uuids.add(card.uuid)
        seen_minors.add(card.minor)
        kept_migs = tuple(m for m in card.mig_instances if m.uuid.casefold() not in ignored)
        offered.append(card if len(kept_migs) == len(card.mig_instances) else replace(card, mig_instances=kept_migs))
    return tuple(offered), problems


# --- node metadata ---------------------------------------------------------------

#: The summary keys (after the prefix); a topology level of the same name is left out.
MODEL_KEY = "model"
CARD_COUNT_KEY = "card_count"
RUNTIME_KIT_KEY = "runtime_kit"
SUMMARY_KEYS = (MODEL_KEY, CARD_COUNT_KEY, RUNTIME_KIT_KEY)

_IDENTIFIER = re.compile(r"[a-z][a-z0-9_]*")
_WORD_BOUNDARY = (re.compile(r"([a-z0-9])([A-Z])"), re.compile(r"([A-Z]+)([A-Z][a-z])"))


def level_key(name: str) -> str:
    """XDM's level name in snake_case: ``pointOfDelivery`` -> ``point_of_delivery``; "" if it cannot be a key."""
    text = name.strip()
    for pattern in _WORD_BOUNDARY:
        text = pattern.sub(r"\1_\2", text)
    text = re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_").lower()
    return text if _IDENTIFIER.fullmatch(text) else ""


def joined(values: Iterable[str]) -> str:
    """One value for all cards: the shared value, or the sorted distinct values joined by ``,``."""
    return ",".join(sorted({v.strip() for v in values if v.strip()}))


@dataclass(frozen=True)
class NodeMeta:
    """The keys to publish (full names, prefix included) and what had to be left out, and why."""

    keys: Mapping[str, str] = field(default_factory=dict)
    problems: tuple[str, ...] = ()
    #: Whether any card carries a topology level. When none does, the inventory says nothing about
    #: the topology (XDM's first ListAndWatch push, which carries it, has not come yet): the
    #: publisher then keeps the level keys it finds instead of unsetting them.
    topology_known: bool = True


def topology_values(cards: Iterable[Card]) -> tuple[dict[str, str], list[str]]:
    """Snake-case level name -> joined value, for every string level of ``cards``; plus problems."""
    values: dict[str, set[str]] = {}
    names: dict[str, set[str]] = {}
    problems: list[str] = []
    for card in cards:
        for level in card.topology.levels:
            if not isinstance(level.domain, str) or not level.domain.strip():
                continue
            key = level_key(level.name)
            if not key:
                problems.append(f"topology level {level.name!r} cannot be a Nomad meta key; left out")
                continue
            values.setdefault(key, set()).add(level.domain)
            names.setdefault(key, set()).add(level.name)
    for key, spelled in names.items():
        if len(spelled) > 1:
            problems.append(f"topology levels {', '.join(sorted(spelled))} share the meta key {key!r}; values merged")
    return {key: joined(found) for key, found in sorted(values.items())}, sorted(set(problems))


def node_meta(inventory: Inventory, config: PluginConfig) -> NodeMeta:
    """The prefixed keys for this inventory (see the module docstring)."""
    cards, _ = offered_cards(inventory, config)
    prefix = config.node_meta_prefix
    levels, problems = topology_values(cards)
    out: dict[str, str] = {}
    for key, value in levels.items():
        if key in SUMMARY_KEYS:
            problems.append(f"topology level {key!r} would hide the summary key {prefix}{key}; left out")
            continue
        out[prefix + key] = value
    models = joined(card.model_name for card in cards)
    if models:
        out[prefix + MODEL_KEY] = models
    out[prefix + CARD_COUNT_KEY] = str(len(cards))
    status = inventory.node.get(NODE_RUNTIME_KIT, "").strip()
    if status:
        out[prefix + RUNTIME_KIT_KEY] = status
    known = any(card.topology.levels for card in cards)
    return NodeMeta(dict(sorted(out.items())), tuple(problems), known)


def meta_changes(
    wanted: Mapping[str, str], current: Mapping[str, str], prefix: str, *, topology_known: bool = True
) -> dict[str, str | None]:
    """The smallest update from ``current`` (the node's merged Meta) to ``wanted``: a key under
    ``prefix`` no longer wanted is None (Nomad unsets it), but level keys stay while the topology is
    unknown; keys outside ``prefix`` are never touched."""
    changes: dict[str, str | None] = {k: v for k, v in wanted.items() if current.get(k) != v}
    summary = {prefix + key for key in SUMMARY_KEYS}
    for key in current:
        if key.startswith(prefix) and key not in wanted and (topology_known or key in summary):
            changes[key] = None
    return dict(sorted(changes.items()))


def client_meta_block(keys: Mapping[str, str]) -> str:
    """The keys as the agent configuration's ``client { meta = { } }``: a map assignment with quoted
    keys, as Nomad's command/agent/command_test.go (TestCommand_MetaConfigValidation) writes dotted
    keys; HCL1 and python-hcl2 both read it (python-hcl2 refuses a quoted block name)."""
    width = max((len(k) + 2 for k in keys), default=0)
    lines = ["client {", "  meta = {"]
    for key, value in keys.items():
        lines.append(f"    {_quoted(key):<{width}} = {_quoted(value)}")
    lines += ["  }", "}"]
    return "\n".join(lines) + "\n"


def _quoted(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


# --- the Backend port ------------------------------------------------------------

InventoryListener = Callable[[Inventory], None]


class Backend(Protocol):
    #: "xdm" or "nvml": goes into attributes and logs.
    name: str

    def start(self) -> None:
        """Begin watching (threads, streams). Must not block on the device."""

    def stop(self) -> None:
        """Stop all threads and close channels; idempotent."""

    def inventory(self) -> Inventory:
        """The latest complete snapshot (possibly stale, see ``reachable``)."""

    def subscribe(self, listener: InventoryListener) -> Callable[[], None]:
        """Call ``listener`` with every new snapshot; returns an unsubscribe."""

    def allocate(self, request: GrantRequest) -> Grant:
        """Grant exactly what is asked, verified, or release what it got and raise a ``PluginError``."""

    def release(self, grant_id: str) -> None:
        """Release a grant; "not found" counts as released (idempotent)."""

    def metrics_snapshot(self) -> Sequence[MetricSample]:
        """One poll of current metrics; raises ``BackendUnavailable``."""

    def metrics_stream(self, cancel: threading.Event) -> Iterator[Sequence[MetricSample]]:
        """One metrics subscription; ends or raises when it breaks (the caller resubscribes)."""
