"""``nomad-device-lingjun topology``: where does a job of N cards fit? The cluster by pod and leaf switch.

Reads every node and the device-holding allocations on each through Nomad's HTTP API as the token
sees it (``node:read``; Nomad leaves out namespaces the token cannot ``read-job``, so the view's
completeness is checked and said), then counts healthy and free cards by model and mode per point
of delivery and leaf switch. A snapshot, not a reservation: Nomad has no gang scheduling. Exit
status: 0 (with ``--need``: some domain fits), 1 none fits, 2 the cluster could not be read.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Mapping
from contextlib import closing
from dataclasses import asdict, dataclass, field
from typing import Any

from nomad_plugin.cli.common import command_parser, fail
from nomad_plugin.config.model import PluginConfig
from nomad_plugin.nomad_view.types import Style
from nomad_plugin.reconcile.nomad_api import NomadApiError, NomadApiSettings, NomadClient, check_visibility

# -- the cluster's cards by domain (pure) --------------------------------------------------
# A card's domain at a level is its group's attribute of that name, else the node's
# ``<prefix><level>`` meta. A value naming several domains (``a,b``) spans: which card is behind
# which is unknown, so it never counts as fitting one domain. A ``tdm`` or ``mig`` group is one card
# whose shares or slices are its ``units``. A card is free when healthy, unheld and on a node that
# takes work (ready, eligible, not draining).

LEVELS = ("point_of_delivery", "leaf_switch")
LEVEL_TITLES = {"point_of_delivery": "point of delivery", "leaf_switch": "leaf switch"}
MODES = ("whole", "tdm", "mig", "mig-instance")


class ClusterDataError(ValueError):
    """A node answer that does not have Nomad's shape."""


@dataclass(frozen=True)
class NodeGroup:
    """One ``NodeDeviceResource``: instances (id -> healthy) and string attributes."""

    vendor: str
    type: str
    name: str
    instances: tuple[tuple[str, bool], ...]
    attributes: Mapping[str, str] = field(default_factory=dict)

    @property
    def model(self) -> str:
        return self.attributes.get("model") or self.name

    @property
    def mode(self) -> str:
        if self.type.endswith("-share"):
            return "tdm"
        if self.type.endswith("-mig"):
            return "mig"
        if "mig_profile" in self.attributes:
            return "mig-instance"
        return "whole"


@dataclass(frozen=True)
class ClusterNode:
    id: str
    name: str
    status: str
    eligible: bool
    draining: bool
    meta: Mapping[str, str]
    groups: tuple[NodeGroup, ...]

    @property
    def unplaceable(self) -> str:
        """Why Nomad places nothing here ("" when it does)."""
        if self.status != "ready":
            return f"status {self.status}"
        if self.draining:
            return "draining"
        if not self.eligible:
            return "ineligible"
        return ""


def _attr_text(raw: Any) -> str | None:
    """A ``psstructs.Attribute`` JSON object's value as text (String, Int, Float or Bool)."""
    if not isinstance(raw, dict):
        return None
    for key in ("String", "Int", "Float", "Bool"):
        value = raw.get(key)
        if value is not None:
            return ("true" if value else "false") if isinstance(value, bool) else str(value)
    return None


def parse_node(raw: Any) -> ClusterNode:
    """One ``/v1/node/:id`` answer; ``ClusterDataError`` on a wrong shape."""
    if not isinstance(raw, dict) or not isinstance(raw.get("ID"), str):
        raise ClusterDataError("node answer without an ID")
    meta = raw.get("Meta") or {}
    resources = raw.get("NodeResources") or {}
    devices = resources.get("Devices") or [] if isinstance(resources, dict) else None
    if not isinstance(meta, dict) or not isinstance(devices, list):
        raise ClusterDataError(f"node {raw['ID']}: Meta or NodeResources.Devices has the wrong shape")
    groups = []
    for dev in devices:
        if not isinstance(dev, dict) or not isinstance(dev.get("Instances") or [], list):
            raise ClusterDataError(f"node {raw['ID']}: a device group has the wrong shape")
        instances = tuple(
            (str(i.get("ID")), i.get("Healthy") is True)  # anything but true is not healthy
            for i in dev.get("Instances") or []
            if isinstance(i, dict) and isinstance(i.get("ID"), str)
        )
        raw_attributes = (dev.get("Attributes") or {}).items()
        attributes = {str(k): text for k, v in raw_attributes if (text := _attr_text(v)) is not None}
        groups.append(
            NodeGroup(str(dev.get("Vendor")), str(dev.get("Type")), str(dev.get("Name")), instances, attributes)
        )
    return ClusterNode(
        id=raw["ID"],
        name=str(raw.get("Name") or raw["ID"][:8]),
        status=str(raw.get("Status") or "unknown"),
        eligible=raw.get("SchedulingEligibility", "eligible") == "eligible",
        draining=bool(raw.get("DrainStrategy")) or bool(raw.get("Drain")),
        meta={str(k): str(v) for k, v in meta.items()},
        groups=tuple(groups),
    )


@dataclass
class Counts:
    cards: int = 0
    healthy: int = 0
    free: int = 0
    units: int = 0
    free_units: int = 0

    def add(self, other: Counts) -> None:
        for name, value in asdict(other).items():
            setattr(self, name, getattr(self, name) + value)


@dataclass
class Domain:
    level: str
    pod: str  # the point of delivery ("" when unknown); a leaf switch is named within its pod
    value: str
    nodes: dict[str, dict[tuple[str, str], Counts]] = field(default_factory=dict)  # node name -> (model, mode)

    @property
    def name(self) -> str:
        return self.value if self.level == "point_of_delivery" else f"{self.pod or '?'}/{self.value}"

    @property
    def spans(self) -> bool:
        """The value names several domains: which card is behind which is not known."""
        return "," in self.value

    def totals(self) -> dict[tuple[str, str], Counts]:
        out: dict[tuple[str, str], Counts] = {}
        for per_node in self.nodes.values():
            for key, counts in per_node.items():
                out.setdefault(key, Counts()).add(counts)
        return dict(sorted(out.items()))

    def usable(self, model: str, mode: str, per_node: int) -> list[int]:
        """Per node, the free cards of (model, mode) a job can take in allocations of ``per_node`` each."""
        return [
            sum(
                (c.free // per_node) * per_node
                for (m, md), c in per.items()
                if m.casefold() == model.casefold() and md == mode
            )
            for per in self.nodes.values()
        ]

    def to_json(self) -> dict[str, Any]:
        return {
            "level": self.level,
            "name": self.name,
            "point_of_delivery": self.pod,
            "value": self.value,
            "spans": self.spans,
            "nodes": sorted(self.nodes),
            "cards": [{"model": m, "mode": md, **asdict(c)} for (m, md), c in self.totals().items()],
        }


@dataclass
class ClusterTopology:
    domains: dict[str, list[Domain]]  # level -> domains, by name
    without_topology: list[tuple[str, str]]  # (node name, why)
    not_placeable: list[tuple[str, str]]  # (node name, why)
    nodes_with_devices: int
    totals: dict[tuple[str, str], Counts]

    def models(self) -> list[str]:
        return sorted({m for m, _ in self.totals})


def group_counts(group: NodeGroup, held: frozenset[str], placeable: bool) -> Counts:
    if group.mode in ("tdm", "mig"):
        healthy = all(ok for _, ok in group.instances) and bool(group.instances)
        unheld = [i for i, ok in group.instances if ok and i not in held]
        card_free = placeable and healthy and len(unheld) == len(group.instances)
        return Counts(1, int(healthy), int(card_free), len(group.instances), len(unheld) if placeable else 0)
    healthy_ids = [i for i, ok in group.instances if ok]
    free_ids = [i for i in healthy_ids if i not in held] if placeable else []
    return Counts(len(group.instances), len(healthy_ids), len(free_ids))


def _domain_value(group: NodeGroup, node: ClusterNode, level: str, prefix: str) -> str:
    return (group.attributes.get(level) or node.meta.get(prefix + level) or "").strip()


def cluster_topology(
    nodes: Iterable[ClusterNode], held: Mapping[str, Iterable[str]], prefix: str = "lingjun."
) -> ClusterTopology:
    """Domains at every level; ``held`` is node id -> device IDs held by live allocations."""
    domains: dict[str, dict[tuple[str, str], Domain]] = {level: {} for level in LEVELS}
    without: list[tuple[str, str]] = []
    unplaceable: list[tuple[str, str]] = []
    totals: dict[tuple[str, str], Counts] = {}
    with_devices = 0
    for node in sorted(nodes, key=lambda n: n.name):
        if not node.groups:
            continue
        with_devices += 1
        if node.unplaceable:
            unplaceable.append((node.name, node.unplaceable))
        taken = frozenset(held.get(node.id, ()))
        missing = False
        for group in node.groups:
            counts = group_counts(group, taken, not node.unplaceable)
            totals.setdefault((group.model, group.mode), Counts()).add(counts)
            pod = _domain_value(group, node, "point_of_delivery", prefix)
            for level in LEVELS:
                value = _domain_value(group, node, level, prefix)
                if not value:
                    missing = True
                    continue
                key = (pod if level != "point_of_delivery" else "", value)
                domain = domains[level].setdefault(key, Domain(level, key[0], value))
                domain.nodes.setdefault(node.name, {}).setdefault((group.model, group.mode), Counts()).add(counts)
        if missing:
            levels = [
                f"{prefix}{level}"
                for level in LEVELS
                if not any(_domain_value(g, node, level, prefix) for g in node.groups)
            ]
            without.append((node.name, f"no {' or '.join(levels) or 'topology for some cards'}"))
    return ClusterTopology(
        {level: sorted(found.values(), key=lambda d: d.name) for level, found in domains.items()},
        without,
        unplaceable,
        with_devices,
        dict(sorted(totals.items())),
    )


@dataclass(frozen=True)
class Fit:
    domain: Domain
    free: int  # usable free cards of the asked model and mode
    nodes: int  # nodes contributing


def fits(topology: ClusterTopology, need: int, model: str, mode: str = "whole", per_node: int = 1) -> list[Fit]:
    """Domains (one leaf switch, one point of delivery) with at least ``need`` usable free cards."""
    found = []
    for level in LEVELS:
        for domain in topology.domains[level]:
            if domain.spans:
                continue
            per_node_free = domain.usable(model, mode, per_node)
            if sum(per_node_free) >= need:
                found.append(Fit(domain, sum(per_node_free), sum(1 for free in per_node_free if free)))
    # The nearest domain first (a leaf switch before its point of delivery), then the tightest fit.
    return sorted(found, key=lambda f: (-LEVELS.index(f.domain.level), f.free, f.domain.name))


# -- the command ------------------------------------------------------------------------

NO_GANG = (
    "This is a snapshot, not a reservation: nothing is held for the job, and Nomad places each allocation on its "
    "own (it has no gang scheduling). Pin the job to one domain with a constraint on "
    "${meta.%spoint_of_delivery} or ${meta.%sleaf_switch} (examples/jobs/multi-node-training.nomad.hcl) and "
    "submit it soon."
)


def parser() -> argparse.ArgumentParser:
    p = command_parser(
        "topology",
        "The cluster's cards per point of delivery and leaf switch, through Nomad's HTTP API; "
        "--need N --model M lists the domains where a job of N cards fits.",
    )
    p.add_argument("--address", help="Nomad HTTP API (default: $NOMAD_ADDR or http://127.0.0.1:4646)")
    p.add_argument(
        "--token", help="ACL token (default: $NOMAD_TOKEN); needs node:read, and read-job to see every allocation"
    )
    p.add_argument("--prefix", default="lingjun.", help='node meta key prefix (node_meta_prefix; default "lingjun.")')
    p.add_argument("--need", type=int, help="cards the job needs within one domain")
    p.add_argument("--model", help='card model for --need, e.g. "NVIDIA H800" (case-insensitive)')
    p.add_argument("--mode", default="whole", choices=MODES, help="card mode for --need (default whole)")
    p.add_argument("--per-node", type=int, default=1, help="cards per allocation: count only whole multiples per node")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    return p


def read_cluster(client: Any) -> tuple[list[ClusterNode], dict[str, set[str]], bool, str]:
    """Nodes, device IDs held per node, and whether (and why) the allocation view is complete."""
    nodes = [parse_node(client.node_record(s["ID"])) for s in client.list_nodes() if isinstance(s.get("ID"), str)]
    held = {}
    for node in nodes:
        if node.groups:
            held[node.id] = {d for a in client.node_allocations(node.id).allocs if a.live for d in a.device_ids}
    try:
        visibility = check_visibility(client)
        complete, why = visibility.complete, visibility.reason
    except NomadApiError as exc:
        complete, why = False, f"the token's visibility could not be checked ({exc})"
    return nodes, held, complete, why


def _counts_line(model: str, mode: str, c: Any) -> str:
    units = f", {c.free_units}/{c.units} free {'shares' if mode == 'tdm' else 'slices'}" if c.units else ""
    return f"{model} ({mode}): {c.cards} cards, {c.healthy} healthy, {c.free} free{units}"


def render_text(found: ClusterTopology, address: str, complete: bool, why: str, prefix: str, style: Style) -> list[str]:
    cards = sum(c.cards for c in found.totals.values())
    free = sum(c.free for c in found.totals.values())
    lines = [
        f"Nomad at {address}: {found.nodes_with_devices} node(s) with devices, {cards} cards, {free} free",
        ("allocations: all visible (" if complete else "allocations: NOT all visible, free counts may be too high (")
        + why
        + ")",
    ]
    for level in LEVELS:
        lines.append("")
        if not found.domains[level]:
            lines.append(f"no {LEVEL_TITLES[level]} known ({prefix}{level} meta or the {level} device attribute)")
        for domain in found.domains[level]:
            mark = " *" if domain.spans else ""
            nodes = f"{len(domain.nodes)} node(s) ({', '.join(sorted(domain.nodes))})"
            lines.append(f"{LEVEL_TITLES[level]} {style(domain.name, 'bold')}{mark}: {nodes}")
            lines += [f"    {_counts_line(m, md, c)}" for (m, md), c in domain.totals().items()]
    if any(d.spans for level in LEVELS for d in found.domains[level]):
        lines += [
            "",
            "* the cards sit behind several domains and Nomad does not show which card is behind which; they never "
            'count as fitting one domain (group_by = "leafSwitch" in the plugin config makes one device group per leaf '
            "switch)",
        ]
    if found.without_topology:
        lines += ["", "nodes that publish no topology (set node_meta = true in their plugin config, or put the "
                  "output of `nomad-device-lingjun node-meta` in their client meta):"]  # fmt: skip
        lines += [f"    {name}: {why}" for name, why in found.without_topology]
    if found.not_placeable:
        lines += ["", "nodes Nomad places nothing on (their cards count as not free):"]
        lines += [f"    {name}: {why}" for name, why in found.not_placeable]
    return lines


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    if args.need is not None and (args.need < 1 or not args.model):
        return fail("topology", "--need takes a positive number of cards and --model")
    if args.per_node < 1:
        return fail("topology", "--per-node must be at least 1")
    settings = NomadApiSettings.from_config(
        PluginConfig(nomad_address=args.address or "", nomad_token=args.token or "")
    )
    with closing(NomadClient(settings)) as client:
        try:
            nodes, held, complete, why = read_cluster(client)
        except NomadApiError as exc:
            hint = " (the token needs node:read)" if exc.kind == "forbidden" and "node:read" not in str(exc) else ""
            return fail("topology", f"{settings.address}: {exc}{hint}")
        except ClusterDataError as exc:
            return fail("topology", f"{settings.address}: {exc}")
    found = cluster_topology(nodes, held, args.prefix)
    fitting: list[Fit] = []
    known_model = True
    if args.need is not None:
        known_model = any(m.casefold() == args.model.casefold() for m in found.models())
        fitting = fits(found, args.need, args.model, args.mode, args.per_node)
    code = 0 if args.need is None or fitting else 1
    if args.json:
        doc: dict[str, Any] = {
            "address": settings.address,
            "nodes_with_devices": found.nodes_with_devices,
            "allocations_complete": complete,
            "visibility": why,
            "points_of_delivery": [d.to_json() for d in found.domains["point_of_delivery"]],
            "leaf_switches": [d.to_json() for d in found.domains["leaf_switch"]],
            "without_topology": [{"node": n, "why": w} for n, w in found.without_topology],
            "not_placeable": [{"node": n, "why": w} for n, w in found.not_placeable],
            "reserves": False,
        }
        if args.need is not None:
            doc["need"] = {"cards": args.need, "model": args.model, "mode": args.mode, "per_node": args.per_node}
            doc["fits"] = [
                {"level": f.domain.level, "name": f.domain.name, "free": f.free, "nodes": f.nodes} for f in fitting
            ]
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return code
    style = Style(sys.stdout)
    lines = render_text(found, settings.address, complete, why, args.prefix, style)
    if args.need is not None:
        per = f" in allocations of {args.per_node}" if args.per_node > 1 else ""
        lines += ["", style(f"Where {args.need} free {args.model} ({args.mode}) cards{per} fit in one domain:", "bold")]
        if not known_model:
            lines.append(f"    no {args.model!r} cards in the cluster (models: {', '.join(found.models()) or 'none'})")
        elif not fitting:
            lines.append("    nowhere" + ("" if complete else " that the token can see"))
        for fit in fitting:
            lines.append(
                f"    {LEVEL_TITLES[fit.domain.level]} {fit.domain.name}: {fit.free} free on {fit.nodes} node(s)"
            )
        lines += ["", NO_GANG % (args.prefix, args.prefix)]
    sys.stdout.write("\n".join(lines) + "\n")
    return code
