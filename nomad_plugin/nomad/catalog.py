"""Turn a card inventory plus the config into Nomad instances and groups (pure).

Nomad fills one ``device`` request from ONE group and gives each instance
whole to one allocation, so the grouping *is* the placement policy:

- whole cards form one group per model (``nvidia/gpu/<model>``, the same
  vendor/type/name and attribute names as HashiCorp's NVIDIA plugin), or one
  group per topology domain with ``group_by`` (``<model> numa0``), so that
  ``count = 4`` lands inside one domain;
- time-division shares (tdm) and MIG slice units form one group *per card*
  (``<vendor>/<type>-share/<model> card<minor>``), so ``count = k`` buys k
  bundles of one card and never straddles two.

A card has exactly one mode, chosen by ``cards`` rules (UUID > minor > exact
model) or ``default_mode``. A mode the card cannot run (mig on a non-MIG model,
more shares than GiB of memory) falls back to whole and is reported by
:func:`check_modes`, which the caller logs after the first inventory.

Units follow Nomad's units table: ``memory`` MiB (the card total, as the
NVIDIA plugin), ``share_memory``/``slice_memory`` GiB, percentages unitless.
MIG splits memory in eighths and compute in sevenths, hence 7 units per card
each worth floor(memory_gib / 8) GiB.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from nomad_plugin.config.model import MIN_FINGERPRINT_PERIOD_S, CardRule, PluginConfig
from nomad_plugin.model.card import (
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
    whole_id,
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
# ``Card.extra`` keys surfaced as attributes: extra key -> (attribute, Nomad unit;
# "" = string). nomad-device-nvidia's names (what the NVML code writes, and what
# an XDM ``extenderResources`` entry of that name passes through), plus older
# unit-suffixed spellings; other extra keys (e.g. XDM's raw "topology") stay out.
EXTRA_ATTRS: Mapping[str, tuple[str, str]] = {
    "power": ("power", "W"),
    "power_limit": ("power_limit", "W"),
    "power_limit_w": ("power_limit", "W"),
    "bar1": ("bar1", "MiB"),
    "bar1_mib": ("bar1", "MiB"),
    "cores_clock": ("cores_clock", "MHz"),
    "cores_clock_mhz": ("cores_clock", "MHz"),
    "memory_clock": ("memory_clock", "MHz"),
    "memory_clock_mhz": ("memory_clock", "MHz"),
    "pci_bandwidth": ("pci_bandwidth", "MB/s"),
    "pci_bandwidth_mbps": ("pci_bandwidth", "MB/s"),
    "display_state": ("display_state", ""),
    "persistence_mode": ("persistence_mode", ""),
    "compute_capability": ("compute_capability", ""),
}
# nomad-device-nvidia's attributes: a multi-card group takes them from its first card in
# UUID order, as that plugin does ("the same DeviceName has the same attributes"), so
# ``${device.attr.memory}`` holds even when one card's ECC or persistence setting differs.
# Our own attributes appear on such a group only when every card agrees.
FIRST_CARD_ATTRS = frozenset(
    {
        "memory",
        "power",
        "bar1",
        "driver_version",
        "cores_clock",
        "memory_clock",
        "pci_bandwidth",
        "display_state",
        "persistence_mode",
    }
)
# Facts of one card that never go on a whole-card group (it may hold more cards later).
PER_CARD_ONLY = frozenset({"minor", "uuid", "pci_bus_id"})

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
    """``00000000:3B:00.0`` (NVML) -> ``0000:3b:00.0`` (sysfs form Nomad's NUMA matcher uses).

    Nomad compares bus IDs case-sensitively after trimming the domain's zeros,
    so lower case matters; unparseable input is returned stripped and lower-cased.
    """
    text = raw.strip()
    match = _PCI_RE.match(text)
    if match is None:
        return text.lower()
    domain, bus, device, function = match.groups()
    return f"{int(domain or '0', 16):04x}:{int(bus, 16):02x}:{int(device, 16):02x}.{function}"


def is_mig_capable(card: Card, config: PluginConfig) -> bool:
    if card.mig_capable:
        return True
    model = card.model.casefold()
    return any(sub.strip() and sub.strip().casefold() in model for sub in config.mig_models)


def resolve_group_by(name: str) -> str:
    """The XDM level name a ``group_by`` value means ("" for none)."""
    value = name.strip()
    if value.lower() in ("", "none"):
        return ""
    return GROUP_BY_ALIASES.get(value.lower(), value)


def _rule_key(rule: CardRule) -> tuple[str, int, int]:
    return (rule.mode, rule.shares, rule.share_percent)


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
    if len({_rule_key(r) for r in tier}) > 1:
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
        if not is_mig_capable(card, config):
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
    """Config values that name nothing on this node: card blocks, type and vendor filters.

    Each would otherwise be silently without effect (a typo in a model name
    leaves the card in its default mode). Empty when the inventory is empty.
    """
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


def _put_text(attrs: dict[str, Attr], key: str, value: str) -> None:
    text = value.strip()
    if text:
        attrs[key] = Attr(text)


def _extra_attr(value: str, unit: str) -> Attr | None:
    text = value.strip()
    if not text:
        return None
    if not unit:
        return Attr(text)
    try:
        return Attr(int(text), unit)
    except ValueError:
        try:
            return Attr(float(text), unit)
        except ValueError:
            return None


def _domain_attr(domain: tuple[int, ...] | str, text: str) -> Attr:
    """A one-number domain is an int attribute, anything else its text.

    Nomad parses a constraint's literal ``"0"`` as an int and never compares
    an int with a string, so ``topology.numaNodes = "0"`` only matches an int.
    """
    if isinstance(domain, tuple) and len(domain) == 1:
        return Attr(domain[0])
    return Attr(text)


def card_attributes(card: Card, inventory: Inventory) -> dict[str, Attr]:
    """Everything known about one card, as Nomad group attributes."""
    attrs: dict[str, Attr] = {}
    _put_text(attrs, "model", card.model)
    _put_text(attrs, "vendor", card.vendor)
    _put_text(attrs, "xpu_type", card.xpu_type)
    if card.memory_mib > 0:
        attrs["memory"] = Attr(card.memory_mib, "MiB")
    _put_text(attrs, "driver_version", card.driver_version or inventory.node.get(NODE_DRIVER_VERSION, ""))
    _put_text(attrs, NODE_RUNTIME_KIT, inventory.node.get(NODE_RUNTIME_KIT, ""))
    for extra_key, (name, unit) in EXTRA_ATTRS.items():
        extra = _extra_attr(card.extra.get(extra_key, ""), unit)
        if extra is not None:
            attrs[name] = extra
    for level in card.topology.levels:
        domain = level.domain_text.strip()
        if not domain or not _ATTR_KEY_RE.match(level.name):
            continue
        attrs[f"topology.{level.name}"] = _domain_attr(level.domain, domain)
        network_key = NETWORK_LEVEL_ATTRS.get(level.name)
        if network_key:
            attrs[network_key] = Attr(domain)
    if card.numa_node is not None and card.numa_node >= 0:
        attrs["numa_node"] = Attr(card.numa_node)
    attrs["minor"] = Attr(card.minor)
    attrs["uuid"] = Attr(card.uuid)
    if card.pci_bus_id:
        attrs["pci_bus_id"] = Attr(normalize_pci_bus_id(card.pci_bus_id))
    return attrs


def common_attributes(per_card: Iterable[Mapping[str, Attr]]) -> dict[str, Attr]:
    """A multi-card group's attributes: nomad-device-nvidia's from the first card, ours where all agree.

    Per-card identity never appears. The caller orders the cards (by UUID, as that plugin does).
    """
    dicts = list(per_card)
    if not dicts:
        return {}
    first = dicts[0]
    return {
        key: value
        for key, value in first.items()
        if key not in PER_CARD_ONLY and (key in FIRST_CARD_ATTRS or all(d.get(key) == value for d in dicts[1:]))
    }


# --- instances -----------------------------------------------------------------


def whole_instance(card: Card) -> Instance:
    pci = normalize_pci_bus_id(card.pci_bus_id) if card.pci_bus_id else ""
    return Instance(whole_id(card.uuid), Kind.WHOLE, card.uuid, card.minor, pci_bus_id=pci)


def share_instances(card: Card, shares: int) -> tuple[Instance, ...]:
    pci = normalize_pci_bus_id(card.pci_bus_id) if card.pci_bus_id else ""
    core, memory = 100 // shares, card.memory_gib // shares
    return tuple(
        Instance(share_id(card.uuid, i), Kind.SHARE, card.uuid, card.minor, i, core, memory, 0, pci)
        for i in range(shares)
    )


def mig_unit_instances(card: Card) -> tuple[Instance, ...]:
    pci = normalize_pci_bus_id(card.pci_bus_id) if card.pci_bus_id else ""
    memory = card.memory_gib // MIG_MEMORY_PARTS
    return tuple(
        Instance(mig_unit_id(card.uuid, i), Kind.MIG, card.uuid, card.minor, i, 0, memory, 1, pci)
        for i in range(MIG_UNITS)
    )


def _domain_suffix(level: str, domain: str) -> str:
    prefix = _DOMAIN_PREFIX.get(level, f"{level}-")
    return prefix + domain.replace(",", "-")


# --- the catalog ---------------------------------------------------------------


@dataclass
class _Draft:
    key: GroupKey
    instances: list[Instance]
    attrs: list[dict[str, Attr]]
    per_card: bool
    extra: dict[str, Attr]


def _draft_groups(plans: Iterable[CardPlan], inventory: Inventory, level: str) -> list[_Draft]:
    drafts: dict[GroupKey, _Draft] = {}
    singles: list[_Draft] = []
    for plan in plans:
        card = plan.card
        vendor, dtype, model = card.vendor_name, card.family, card.model_name
        attrs = card_attributes(card, inventory)
        if plan.mode == MODE_WHOLE:
            domain = card.topology.domain(level) if level else None
            name = f"{model} {_domain_suffix(level, domain)}" if domain else model
            key = GroupKey(vendor, dtype, name)
            draft = drafts.setdefault(key, _Draft(key, [], [], False, {}))
            draft.instances.append(whole_instance(card))
            draft.attrs.append(attrs)
        elif plan.mode == MODE_TDM:
            instances = share_instances(card, plan.shares)
            extra = {
                "share_count": Attr(plan.shares),
                "share_core_percent": Attr(instances[0].core),
                "share_memory": Attr(instances[0].memory_gib, "GiB"),
            }
            key = GroupKey(vendor, f"{dtype}-share", f"{model} card{card.minor}")
            singles.append(_Draft(key, list(instances), [attrs], True, extra))
        elif plan.mode == MODE_MIG:
            instances = mig_unit_instances(card)
            extra = {
                "slice_units": Attr(MIG_UNITS),
                "slice_memory": Attr(instances[0].memory_gib, "GiB"),
                "slice_sizes": Attr(",".join(str(s) for s in MIG_SLICE_SIZES)),
            }
            key = GroupKey(vendor, f"{dtype}-mig", f"{model} card{card.minor}")
            singles.append(_Draft(key, list(instances), [attrs], True, extra))
        else:  # MODE_MIG_INSTANCE: existing MIG instances, one group per MIG device name (NVIDIA plugin style)
            pci = normalize_pci_bus_id(card.pci_bus_id) if card.pci_bus_id else ""
            for index, mig in enumerate(card.mig_instances):
                key = GroupKey(vendor, dtype, mig.name.strip() or f"{model} MIG {mig.profile}")
                mig_attrs = dict(attrs)
                mig_attrs["memory"] = Attr(mig.memory_mib, "MiB")
                mig_attrs["mig_profile"] = Attr(mig.profile)
                mig_attrs["mig_slices"] = Attr(mig.slices)
                draft = drafts.setdefault(key, _Draft(key, [], [], False, {}))
                draft.instances.append(
                    Instance(
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
                )
                draft.attrs.append(mig_attrs)
    return [*drafts.values(), *singles]


def build_catalog(inventory: Inventory, config: PluginConfig) -> Catalog:
    """Every instance Nomad should see, grouped; deterministic for equal input."""
    plans, _ = plan_cards(inventory, config)
    level, _ = group_level(inventory, config)
    uuid_order = inventory.node.get(NODE_SOURCE) == SOURCE_NVML
    groups: list[InstanceGroup] = []
    used: set[GroupKey] = set()
    for draft in sorted(_draft_groups(plans, inventory, level), key=_draft_order):
        if draft.per_card:
            attrs = dict(draft.attrs[0])
        else:  # the first card in UUID order gives the group its attributes, as nomad-device-nvidia
            in_uuid_order = sorted(zip(draft.instances, draft.attrs, strict=True), key=lambda pair: pair[0].id)
            attrs = common_attributes(a for _, a in in_uuid_order)
        attrs.update(draft.extra)
        key = draft.key
        serial = 2
        while key in used:  # only with broken inventories (duplicate minors)
            key = GroupKey(draft.key.vendor, draft.key.device_type, f"{draft.key.name} #{serial}")
            serial += 1
        used.add(key)
        instances = tuple(sorted(draft.instances, key=_instance_order(draft, uuid_order)))
        groups.append(InstanceGroup(key, instances, dict(sorted(attrs.items()))))
    return Catalog(tuple(groups))


def _instance_order(draft: _Draft, by_uuid: bool) -> Callable[[Instance], tuple[int, int, str]]:
    """NVML's cards and MIG instances by UUID, as nomad-device-nvidia lists them; others by minor."""
    if by_uuid and not draft.per_card:
        return lambda i: (0, 0, i.id)
    return lambda i: (i.minor, i.index, i.id)


def _draft_order(draft: _Draft) -> tuple[str, str, int, str]:
    """Vendor, type, then lowest card minor, so ``card2`` sorts before ``card10``."""
    first_minor = min((i.minor for i in draft.instances), default=-1)
    return (draft.key.vendor, draft.key.device_type, first_minor, draft.key.name)
