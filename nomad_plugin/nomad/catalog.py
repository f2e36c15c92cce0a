"""Turn a card inventory plus the config into Nomad instances and groups (pure).

Nomad fills one ``device`` request from ONE group and gives each instance whole
to one allocation, so the grouping *is* the placement policy: whole cards form
one group per model (nomad-device-nvidia's vendor/type/name and attribute
names) or per topology domain with ``group_by`` (``<model> numa0``); tdm shares
and MIG slice units form one group per card (``<vendor>/<type>-share/<model>
card<minor>``), so ``count = k`` never straddles two cards.

A card's mode comes from ``cards`` rules (UUID > minor > exact model) or
``default_mode``; a mode it cannot run falls back to whole and is reported by
:func:`check_modes`. Units follow Nomad's ``plugins/shared/structs/units.go``:
``memory`` MiB (the card total, as nomad-device-nvidia), ``share_memory`` and
``slice_memory`` GiB. MIG splits memory in eighths and compute in sevenths.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from nomad_plugin.config.model import MIN_FINGERPRINT_PERIOD_S, CardRule, PluginConfig
from nomad_plugin.model.card import (
    CUDA_VERSION,
    NODE_DRIVER_VERSION,
    NODE_RUNTIME_KIT,
    NODE_SOURCE,
    SOURCE_NVML,
    Card,
    Inventory,
    offered_cards,
)
from nomad_plugin.model.instances import (
    Attr,
    Catalog,
    GroupKey,
    Instance,
    InstanceGroup,
    Kind,
    mig_unit_id,
    share_id,
)

MODE_WHOLE = "whole"
MODE_TDM = "tdm"
MODE_MIG = "mig"
MODE_MIG_INSTANCE = "mig-instance"  # MIG instances that already exist (NVML)
MODES = (MODE_WHOLE, MODE_TDM, MODE_MIG)

MIG_UNITS = 7  # compute is split in sevenths
MIG_MEMORY_PARTS = 8  # memory is split in eighths
MIG_SLICE_SIZES = (1, 2, 3, 4, 7)  # what XDM accepts as ``slice``

# group_by spellings accepted besides XDM's own level names.
GROUP_BY_ALIASES: Mapping[str, str] = {
    "numa": "numaNodes",
    "numa_node": "numaNodes",
    "pcie": "pcieSwitches",
    "pcie_switch": "pcieSwitches",
    "socket": "cpuSockets",
    "cpu_socket": "cpuSockets",
}
# Short group-name prefixes for well-known levels; others use "<levelName>-".
_DOMAIN_PREFIX: Mapping[str, str] = {"numaNodes": "numa", "pcieSwitches": "pcie", "cpuSockets": "socket"}
# Rack and network levels, exported by name on every group (node-wide facts).
NETWORK_LEVEL_ATTRS: Mapping[str, str] = {
    "hyperNode": "hyper_node",
    "leafSwitch": "leaf_switch",
    "pointOfDelivery": "point_of_delivery",
}
# ``Card.extra`` keys surfaced as attributes, with their Nomad unit ("" = text): nomad-device-nvidia's
# names, which the NVML code writes and an XDM ``extenderResources`` entry of that name passes through.
EXTRA_UNITS: Mapping[str, str] = {
    "power": "W",
    "power_limit": "W",
    "bar1": "MiB",
    "cores_clock": "MHz",
    "memory_clock": "MHz",
    "pci_bandwidth": "MB/s",
    "display_state": "",
    "persistence_mode": "",
    "compute_capability": "",
    "architecture": "",
    "mig_capable": "",
}
#: Unit-suffixed spellings of the same readings, accepted under the names above.
EXTRA_ALIASES: Mapping[str, str] = {
    "power_limit_w": "power_limit",
    "bar1_mib": "bar1",
    "cores_clock_mhz": "cores_clock",
    "memory_clock_mhz": "memory_clock",
    "pci_bandwidth_mbps": "pci_bandwidth",
}
# nomad-device-nvidia's attributes: a multi-card group takes them from its first card in UUID order,
# as that plugin does ("the same DeviceName has the same attributes"), so ``${device.attr.memory}``
# holds even when one card's ECC or persistence setting differs. Ours need every card to agree.
FIRST_CARD_ATTRS = frozenset(
    {"memory", "power", "bar1", "driver_version", "cores_clock", "memory_clock", "pci_bandwidth"}
    | {"display_state", "persistence_mode"}
)
# Facts of one card that never go on a whole-card group (it may hold more cards later).
PER_CARD_ONLY = frozenset({"minor", "uuid", "pci_bus_id"})

_ONE_DIGIT_MINOR = re.compile(r"^[0-9]{1,3}\.[0-9]$")
_ATTR_KEY_RE = re.compile(r"^[A-Za-z0-9_.\-]+$")
_PCI_RE = re.compile(r"^(?:([0-9A-Fa-f]{1,8}):)?([0-9A-Fa-f]{1,2}):([0-9A-Fa-f]{1,2})\.([0-7])$")


@dataclass(frozen=True)
class CardPlan:
    """The mode a card is advertised in, after rules and capability checks."""

    card: Card
    mode: str
    shares: int = 0


# --- small helpers -------------------------------------------------------------


def normalize_pci_bus_id(raw: str) -> str:
    """``00000000:3B:00.0`` (NVML) -> ``0000:3b:00.0``, the kernel's name, which Nomad's NUMA matcher
    compares with its bus -> NUMA map case-sensitively; "" for text that is no PCI address (an instance
    without an address is never NUMA-matched, as one with a wrong address would not be either)."""
    match = _PCI_RE.match(raw.strip())
    if match is None:
        return ""
    domain, bus, device, function = match.groups()
    return f"{int(domain or '0', 16):04x}:{int(bus, 16):02x}:{int(device, 16):02x}.{function}"


def resolve_group_by(name: str) -> str:
    """The XDM level name a ``group_by`` value means ("" for none)."""
    value = name.strip()
    if value.lower() in ("", "none"):
        return ""
    return GROUP_BY_ALIASES.get(value.lower(), value)


def matching_rules(card: Card, rules: Iterable[CardRule]) -> tuple[list[CardRule], list[CardRule]]:
    """Rules naming this card (UUID first, then minor) and rules naming its model."""
    rules = tuple(rules)
    uuid = card.uuid.casefold()
    by_uuid = [r for r in rules if uuid and r.match.strip().casefold() == uuid]
    by_minor = [r for r in rules if r.match.strip() == str(card.minor)]
    by_model = [r for r in rules if card.model and r.match.strip() == card.model.strip()]
    return by_uuid + by_minor, by_model


def tdm_share_count(rule: CardRule | None, config: PluginConfig) -> int:
    if rule is not None and rule.shares > 0:
        count = rule.shares
    elif rule is not None and rule.share_percent > 0:
        count = 100 // rule.share_percent
    else:
        count = config.tdm_shares
    return max(1, min(100, count))


# --- planning ------------------------------------------------------------------


def _plan_card(card: Card, config: PluginConfig, problems: list[str]) -> CardPlan:
    specific, by_model = matching_rules(card, config.cards)
    tier = specific or by_model
    rule = tier[0] if tier else None
    if len({(r.mode, r.shares, r.share_percent) for r in tier}) > 1:
        listed = ", ".join(f"match={r.match!r} mode={r.mode}" for r in tier)
        problems.append(f"{card.label}: conflicting card rules ({listed}); using the first")
    mode = rule.mode.strip().lower() if rule is not None else config.default_mode.strip().lower()
    source = f"rule match={rule.match!r}" if rule is not None else "default_mode"
    label = card.label

    if card.mig_instances or card.mig_enabled:
        if mode not in (MODE_WHOLE, MODE_MIG):
            problems.append(f"{label}: mode {mode} ({source}) impossible, the card is in MIG mode")
        if not card.mig_instances:
            problems.append(
                f"{label}: MIG mode is on but the card holds no MIG instance, so nothing of it is offered (as "
                "nomad-device-nvidia does; a task could not use the card whole); create instances with "
                "`nvidia-smi mig -cgi ... -C` or turn MIG off with `nvidia-smi -mig 0`"
            )
        return CardPlan(card, MODE_MIG_INSTANCE)
    if mode not in MODES:
        problems.append(f"{label}: unknown mode {mode!r} ({source}); advertised whole")
        return CardPlan(card, MODE_WHOLE)
    if mode == MODE_MIG:
        model = card.model.casefold()
        if not card.mig_capable and not any(m.strip() and m.strip().casefold() in model for m in config.mig_models):
            problems.append(
                f"{label}: mode mig ({source}) but the model is not MIG-capable "
                f"(mig_models={list(config.mig_models)}); advertised whole"
            )
            return CardPlan(card, MODE_WHOLE)
        if card.memory_gib // MIG_MEMORY_PARTS == 0:
            problems.append(f"{label}: mode mig but {card.memory_gib} GiB is too little for slices; advertised whole")
            return CardPlan(card, MODE_WHOLE)
        return CardPlan(card, MODE_MIG)
    if mode == MODE_TDM:
        shares = tdm_share_count(rule, config)
        if rule is not None and rule.shares <= 0 and rule.share_percent > 0 and 100 % rule.share_percent:
            problems.append(
                f"{label}: share_percent {rule.share_percent} does not divide 100; "
                f"using {shares} shares of {100 // shares}%"
            )
        if card.memory_gib // shares == 0:
            problems.append(
                f"{label}: mode tdm with {shares} shares but only {card.memory_gib} GiB "
                "(a share needs at least 1 GiB); advertised whole"
            )
            return CardPlan(card, MODE_WHOLE)
        return CardPlan(card, MODE_TDM, shares)
    return CardPlan(card, MODE_WHOLE)


def plan_cards(inventory: Inventory, config: PluginConfig) -> tuple[tuple[CardPlan, ...], list[str]]:
    """Choose each offered card's mode; return the plans and every problem found."""
    cards, problems = offered_cards(inventory, config)
    if not config.enabled:
        return (), problems
    problems = _period_problems(config) + problems
    return tuple(_plan_card(card, config, problems) for card in cards), problems


def _period_problems(config: PluginConfig) -> list[str]:
    """``fingerprint_period`` under the floor: it was raised to it (decode), which the operator should know."""
    period = config.fingerprint_period
    if period >= MIN_FINGERPRINT_PERIOD_S or config.inventory_resync_period == period:
        return []
    return [
        f"fingerprint_period = {period:g}s: cards are re-read every {config.inventory_resync_period:g} s "
        "(nomad-device-nvidia re-reads NVML without pause at a period of 0 or less)"
    ]


def unmatched_settings(inventory: Inventory, config: PluginConfig) -> list[str]:
    """Card blocks and type/vendor filters that name nothing on this node (else silently without
    effect: a typo in a model name); empty for an empty inventory."""
    cards = inventory.cards
    if not cards or not config.enabled:
        return []
    problems: list[str] = []
    for index, rule in enumerate(config.cards):
        if not any(any(matching_rules(card, [rule])) for card in cards):
            models = sorted({c.model_name for c in cards})
            problems.append(
                f"card[{index}] match = {rule.match!r} matches no card on this node "
                f"(a card minor {min(c.minor for c in cards)}..{max(c.minor for c in cards)}, a card UUID, "
                f"or an exact model: {', '.join(repr(m) for m in models)}); the block has no effect"
            )
    families = sorted({f for c in cards for f in (c.family, c.xpu_type.strip().lower()) if f})
    vendors = sorted({c.vendor_name for c in cards})
    for option, values, known in (
        ("include_types", config.include_types, families),
        ("exclude_types", config.exclude_types, families),
        ("include_vendors", config.include_vendors, vendors),
        ("exclude_vendors", config.exclude_vendors, vendors),
    ):
        for value in values:
            if value.strip().lower() not in known:
                problems.append(
                    f"{option} value {value!r} names no card on this node (known here: {', '.join(known)})"
                    + ("; every card is filtered out" if option.startswith("include") and len(values) == 1 else "")
                )
    return problems


def group_level(inventory: Inventory, config: PluginConfig) -> tuple[str, str | None]:
    """The topology level whole cards are grouped by ("" = by model), and a problem if any."""
    level = resolve_group_by(config.group_by)
    if not level:
        return "", None
    if any(card.topology.level(level) is not None for card in inventory.cards):
        return level, None
    if not inventory.cards:
        return level, None
    levels = sorted({lvl.name for card in inventory.cards for lvl in card.topology.levels})
    known = ", ".join(levels) if levels else "none (XDM reports no topology)"
    close = difflib.get_close_matches(level, levels, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return "", (
        f"group_by {config.group_by!r}: no card has a topology level named {level!r}{hint} (levels on this node: "
        f"{known}); whole cards are grouped by model"
    )


def check_modes(inventory: Inventory, config: PluginConfig) -> list[str]:
    """Every configuration problem this inventory reveals (empty = all as asked)."""
    _, problems = plan_cards(inventory, config)
    problems += unmatched_settings(inventory, config)
    _, level_problem = group_level(inventory, config)
    if level_problem:
        problems.append(level_problem)
    return problems


# --- attributes ----------------------------------------------------------------


def _extra_attr(value: str, unit: str) -> Attr | None:
    """A ``Card.extra`` reading as an attribute: a number when it has a unit (else it is dropped), or text."""
    text = value.strip()
    if not text or not unit:
        return Attr(text) if text else None
    for parse in (int, float):
        try:
            return Attr(parse(text), unit)
        except ValueError:
            pass
    return None


def typed_extra(name: str, attr: Attr) -> Attr:
    """The type a job's constraint compares as meant: Nomad reads ``value = "8.0"`` as a float and never
    orders a string against a number, so a one-digit-minor compute capability is a float (every one
    NVIDIA has defined is); ``mig_capable`` is a bool, as ``value = "true"`` reads."""
    text = str(attr.value)
    if name == "compute_capability" and _ONE_DIGIT_MINOR.match(text):
        return Attr(float(text))
    if name == "mig_capable" and text in ("true", "false"):
        return Attr(text == "true")
    return attr


def card_attributes(card: Card, inventory: Inventory) -> dict[str, Attr]:
    """Everything known about one card, as Nomad group attributes."""
    cuda = card.extra.get(CUDA_VERSION) or (card.sdk_version if card.vendor_name == "nvidia" else "")
    texts = {
        "model": card.model,
        "vendor": card.vendor,
        "xpu_type": card.xpu_type,
        "driver_version": card.driver_version or inventory.node.get(NODE_DRIVER_VERSION, ""),
        "cuda_driver_version": cuda or inventory.node.get(CUDA_VERSION, ""),
        NODE_RUNTIME_KIT: inventory.node.get(NODE_RUNTIME_KIT, ""),
    }
    attrs = {key: Attr(text.strip()) for key, text in texts.items() if text.strip()}
    if card.memory_mib > 0:
        attrs["memory"] = Attr(card.memory_mib, "MiB")
    for key, value in sorted(card.extra.items(), key=lambda item: item[0] in EXTRA_ALIASES):  # aliases win
        name = EXTRA_ALIASES.get(key, key)
        extra = _extra_attr(value, EXTRA_UNITS[name]) if name in EXTRA_UNITS else None
        if extra is not None:
            attrs[name] = typed_extra(name, extra)
    if "mig_capable" not in attrs and card.mig_capable:
        attrs["mig_capable"] = Attr(True)
    for level in card.topology.levels:
        domain = level.domain_text.strip()
        if not domain or not _ATTR_KEY_RE.match(level.name):
            continue
        # Nomad parses a constraint's literal "0" as an int and never compares an int with a string,
        # so a one-number domain is an int attribute (``topology.numaNodes = "0"`` matches it).
        one_number = isinstance(level.domain, tuple) and len(level.domain) == 1
        attrs[f"topology.{level.name}"] = Attr(level.domain[0]) if one_number else Attr(domain)
        if level.name in NETWORK_LEVEL_ATTRS:
            attrs[NETWORK_LEVEL_ATTRS[level.name]] = Attr(domain)
    if card.numa_node is not None and card.numa_node >= 0:
        attrs["numa_node"] = Attr(card.numa_node)
    attrs["minor"] = Attr(card.minor)
    attrs["uuid"] = Attr(card.uuid)
    if pci := normalize_pci_bus_id(card.pci_bus_id):
        attrs["pci_bus_id"] = Attr(pci)
    return attrs


def common_attributes(per_card: list[dict[str, Attr]]) -> dict[str, Attr]:
    """A multi-card group's attributes: nomad-device-nvidia's from the first card (the caller orders
    them by UUID, as that plugin does), ours where all agree; never per-card identity."""
    first = per_card[0]
    return {
        key: value
        for key, value in first.items()
        if key not in PER_CARD_ONLY and (key in FIRST_CARD_ATTRS or all(d.get(key) == value for d in per_card[1:]))
    }


# --- the catalog ---------------------------------------------------------------

_Member = tuple[Instance, dict[str, Attr]]


def build_catalog(inventory: Inventory, config: PluginConfig) -> Catalog:
    """Every instance Nomad should see, grouped; deterministic for equal input."""
    plans, _ = plan_cards(inventory, config)
    level, _ = group_level(inventory, config)
    by_uuid = inventory.node.get(NODE_SOURCE) == SOURCE_NVML  # NVML lists devices by UUID, as nomad-device-nvidia
    shared: dict[GroupKey, list[_Member]] = {}  # whole cards and existing MIG instances, gathered by name
    single: list[tuple[GroupKey, list[Instance], dict[str, Attr]]] = []  # one card's shares or MIG units
    for plan in plans:
        card = plan.card
        vendor, family, model = card.vendor_name, card.family, card.model_name
        attrs = card_attributes(card, inventory)
        pci = normalize_pci_bus_id(card.pci_bus_id)
        if plan.mode == MODE_WHOLE:
            domain = card.topology.domain(level) if level else None
            suffix = _DOMAIN_PREFIX.get(level, f"{level}-") + domain.replace(",", "-") if domain else ""
            key = GroupKey(vendor, family, f"{model} {suffix}" if domain else model)
            shared.setdefault(key, []).append(
                (Instance(card.uuid, Kind.WHOLE, card.uuid, card.minor, pci_bus_id=pci), attrs)
            )
        elif plan.mode == MODE_MIG_INSTANCE:  # one group per MIG device name, as nomad-device-nvidia
            for index, mig in enumerate(card.mig_instances):
                key = GroupKey(vendor, family, mig.name.strip() or f"{model} MIG {mig.profile}")
                inst = Instance(
                    mig.uuid,
                    Kind.MIG_INSTANCE,
                    card.uuid,
                    card.minor,
                    index,
                    0,
                    mig.memory_mib // 1024,
                    mig.slices,
                    pci,
                    mig.uuid,
                )
                mig_attrs = {
                    "memory": Attr(mig.memory_mib, "MiB"),
                    "mig_profile": Attr(mig.profile),
                    "mig_slices": Attr(mig.slices),
                }
                shared.setdefault(key, []).append((inst, {**attrs, **mig_attrs}))
        elif plan.mode == MODE_TDM:
            core, memory = 100 // plan.shares, card.memory_gib // plan.shares
            shares = [
                Instance(share_id(card.uuid, i), Kind.SHARE, card.uuid, card.minor, i, core, memory, 0, pci)
                for i in range(plan.shares)
            ]
            extra = {
                "share_count": Attr(plan.shares),
                "share_core_percent": Attr(core),
                "share_memory": Attr(memory, "GiB"),
            }
            single.append(
                (GroupKey(vendor, f"{family}-share", f"{model} card{card.minor}"), shares, {**attrs, **extra})
            )
        else:  # MODE_MIG: memory in eighths, compute in sevenths
            memory = card.memory_gib // MIG_MEMORY_PARTS
            units = [
                Instance(mig_unit_id(card.uuid, i), Kind.MIG, card.uuid, card.minor, i, 0, memory, 1, pci)
                for i in range(MIG_UNITS)
            ]
            extra = {
                "slice_units": Attr(MIG_UNITS),
                "slice_memory": Attr(memory, "GiB"),
                "slice_sizes": Attr(",".join(str(s) for s in MIG_SLICE_SIZES)),
            }
            single.append((GroupKey(vendor, f"{family}-mig", f"{model} card{card.minor}"), units, {**attrs, **extra}))
    drafts = []
    for key, members in shared.items():
        members.sort(key=lambda member: member[0].id)  # the first card in UUID order gives the attributes
        instances = [inst for inst, _ in members]
        drafts.append((key, instances, common_attributes([a for _, a in members]), by_uuid))
    drafts += [(key, instances, attrs, False) for key, instances, attrs in single]
    # Vendor, type, then lowest card minor, so ``card2`` sorts before ``card10``.
    drafts.sort(key=lambda d: (d[0].vendor, d[0].device_type, min((i.minor for i in d[1]), default=-1), d[0].name))
    groups: list[InstanceGroup] = []
    used: set[GroupKey] = set()
    for key, instances, attrs, in_uuid_order in drafts:
        unique, serial = key, 2
        while unique in used:  # only with broken inventories (duplicate minors)
            unique, serial = GroupKey(key.vendor, key.device_type, f"{key.name} #{serial}"), serial + 1
        used.add(unique)
        ordered = instances if in_uuid_order else sorted(instances, key=lambda i: (i.minor, i.index, i.id))
        groups.append(InstanceGroup(unique, tuple(ordered), dict(sorted(attrs.items()))))
    return Catalog(tuple(groups))
