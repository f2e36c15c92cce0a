"""``nomad-device-lingjun topology``: where does a job of N cards fit? The cluster by pod and leaf switch.

Reads the cluster through Nomad's HTTP API as the token sees it: every node (``/v1/nodes``, then
``/v1/node/:id`` for its meta and device groups; ``node:read``) and the allocations holding
devices on each (``/v1/node/:id/allocations``; Nomad leaves out those in namespaces the token
cannot ``read-job``, so the command checks the token's visibility and says when free counts may be
too high). Then, per point of delivery and per leaf switch (the ``lingjun.*`` node meta the plugin
publishes with ``node_meta = true``, or the device groups' attributes): the nodes, the healthy
and free cards by model and mode, and which nodes publish no topology. ``--need N --model M``
lists the domains with N free cards.

It is the counterpart of the Kubernetes Scheduler Framework's topology view, not of its
scheduler: it reserves nothing, and Nomad has no gang scheduling, so other jobs may take the
cards before the job is placed. Exit status: 0 (with ``--need``: some domain fits), 1 none fits,
2 the cluster could not be read.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from nomad_plugin.cli.main import command_parser, fail
from nomad_plugin.config.model import PluginConfig
from nomad_plugin.nomad_view.cluster import (
    LEVEL_TITLES,
    LEVELS,
    MODES,
    ClusterDataError,
    ClusterNode,
    ClusterTopology,
    Domain,
    Fit,
    cluster_topology,
    fits,
    parse_node,
)
from nomad_plugin.nomad_view.types import Style

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
    from nomad_plugin.reconcile.nomad_api import NomadApiError, check_visibility

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


def _domain_lines(domain: Domain, style: Style) -> list[str]:
    mark = " *" if domain.spans else ""
    nodes = ", ".join(sorted(domain.nodes))
    head = f"{LEVEL_TITLES[domain.level]} {style(domain.name, 'bold')}{mark}: {len(domain.nodes)} node(s) ({nodes})"
    return [head, *(f"    {_counts_line(m, md, c)}" for (m, md), c in domain.totals().items())]


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
            lines += _domain_lines(domain, style)
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


def _fit_json(fit: Fit) -> dict[str, Any]:
    return {"level": fit.domain.level, "name": fit.domain.name, "free": fit.free, "nodes": fit.nodes}


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    if args.need is not None and (args.need < 1 or not args.model):
        return fail("topology", "--need takes a positive number of cards and --model")
    if args.per_node < 1:
        return fail("topology", "--per-node must be at least 1")
    from nomad_plugin.reconcile.nomad_api import NomadApiError, NomadApiSettings, NomadClient

    settings = NomadApiSettings.from_config(
        PluginConfig(nomad_address=args.address or "", nomad_token=args.token or "")
    )
    client = NomadClient(settings)
    try:
        nodes, held, complete, why = read_cluster(client)
    except NomadApiError as exc:
        hint = " (the token needs node:read)" if exc.kind == "forbidden" and "node:read" not in str(exc) else ""
        return fail("topology", f"{settings.address}: {exc}{hint}")
    except ClusterDataError as exc:
        return fail("topology", f"{settings.address}: {exc}")
    finally:
        client.close()
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
            doc["fits"] = [_fit_json(f) for f in fitting]
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
