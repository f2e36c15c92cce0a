"""check-job's output for the node-level rules: per task group, each rule on this node, and what needs a cluster."""

from __future__ import annotations

from typing import Any

from nomad_plugin.jobspec.evaluate import NOT_PLACED, OUTCOME_TEXT, PLACE, REFUSE, UNKNOWN
from nomad_plugin.jobspec.node_check import (
    CLUSTER,
    FAILS,
    HOLDS,
    UNKNOWN_RULE,
    GroupPlacement,
    JobPlacement,
    NodeRuleResult,
)
from nomad_plugin.jobspec.node_values import NodeValues
from nomad_plugin.nomad_view.types import Style

_LABEL = {HOLDS: ("holds", "green"), FAILS: ("FAILS", "red"), UNKNOWN_RULE: ("UNKNOWN", "yellow")}


def _level(result: NodeRuleResult, group: str) -> str:
    level = result.placed.level
    if level == "job":
        return "job "
    if level == f'group "{group}"':
        return ""
    return level.removeprefix(f'group "{group}" ') + " "


def _rule_json(r: NodeRuleResult) -> dict[str, Any]:
    rule = r.placed.rule
    return {
        "level": r.placed.level,
        "attribute": rule.attribute,
        "operator": rule.operator,
        "value": rule.value,
        "weight": rule.weight if rule.affinity else None,
        "status": r.status,
        "left": r.left,
        "right": r.right,
        "reason": r.reason,
        "remarks": list(r.remarks),
        "note": rule.note,
    }


def _group_json(g: GroupPlacement) -> dict[str, Any]:
    return {
        "job": g.rules.job,
        "group": g.rules.group,
        "outcome": g.outcome,
        "verdict": OUTCOME_TEXT[g.outcome],
        "problems": list(g.rules.problems),
        "unsupported": list(g.rules.unsupported),
        "constraints": [_rule_json(r) for r in g.constraints],
        "affinities": [_rule_json(r) for r in g.affinities],
        "affinity_score": g.score,
        "spreads": [
            {
                "level": s.spread.level,
                "attribute": s.spread.attribute,
                "weight": s.spread.weight,
                "targets": [{"value": v, "percent": p} for v, p in s.spread.targets],
                "node_value": s.value.value if s.value.known else None,
                "node_value_known": s.value.known,
                "status": CLUSTER,
            }
            for s in g.spreads
        ],
    }


def placement_json(placement: JobPlacement, values: NodeValues) -> dict[str, Any]:
    return {
        "type": placement.job.type,
        "problems": list(placement.problems),
        "unsupported": list(placement.job.unsupported),
        "node": {
            "sources": values.describe(),
            "plugin_keys": values.plugin.to_json() if values.plugin is not None else None,
        },
        "groups": [_group_json(g) for g in placement.groups],
    }


def _line(style: Style, label: str, colour: str, text: str) -> str:
    return "  " + style(f"{label:<8}", colour, "bold") + " " + text


def placement_text(placement: JobPlacement, values: NodeValues, style: Style) -> list[str]:
    if not placement.groups and not placement.problems and not placement.job.unsupported:
        return []
    lines = [style("node-level rules (job, group and task constraint, affinity, spread) on this node", "bold")]
    lines += [f"  {line}" for line in values.describe()]
    for problem in placement.problems:
        lines.append("  " + style("INVALID ", "red", "bold") + problem)
    for item in placement.job.unsupported:
        lines.append("  " + style("CANNOT EVALUATE ", "yellow", "bold") + item)
    lines.append("")
    for g in placement.groups:
        lines.append(style(f'job "{g.rules.job}" group "{g.rules.group}"', "bold"))
        for problem in g.rules.problems:
            lines.append("  " + style("INVALID ", "red", "bold") + problem)
        for item in g.rules.unsupported:
            lines.append("  " + style("CANNOT EVALUATE ", "yellow", "bold") + item)
        remarks: list[str] = []
        for r in (*g.constraints, *g.affinities):
            kind = "affinity" if r.placed.rule.affinity else "constraint"
            weight = f" (weight {r.placed.rule.weight})" if r.placed.rule.affinity else ""
            where = _level(r, g.rules.group)
            if r.status == CLUSTER:
                lines.append(_line(style, "CLUSTER", "cyan", f"{where}{kind} {r.describe()}"))
            else:
                label, colour = _LABEL[r.status]
                if r.placed.rule.affinity and r.status == FAILS:
                    label, colour = "no match", "yellow"
                elif r.placed.rule.affinity and r.status == HOLDS:
                    label = "matches"
                lines.append(_line(style, label, colour, f"{where}{kind}{weight} {r.describe()}"))
            remarks += [*r.remarks, *([r.placed.rule.note] if r.placed.rule.note else [])]
        for s in g.spreads:
            where = "job " if s.spread.level == "job" else ""
            lines.append(_line(style, "CLUSTER", "cyan", f"{where}{s.describe()}"))
        if g.affinities:
            if g.score is None:
                score = "unknown (an affinity's value is unknown)"
            else:
                score = f"{g.score:+.2f}"
            lines.append(f"  node-affinity score {score}: Nomad ranks nodes by it, it never keeps the group off a node")
        for remark in dict.fromkeys(remarks):
            lines.append("  " + style("NOTE ", "cyan") + remark)
        if g.outcome == NOT_PLACED:
            lines.append("  " + style("NOT PLACED ", "red", "bold") + OUTCOME_TEXT[NOT_PLACED] + ": " + failures(g))
        elif g.outcome == REFUSE and g.rules.problems:
            lines.append("  " + style("REFUSED ", "red", "bold") + OUTCOME_TEXT[REFUSE] + " (INVALID above)")
        elif g.outcome == UNKNOWN and g.unknown:
            lines.append("  " + style("UNKNOWN ", "yellow", "bold") + OUTCOME_TEXT[UNKNOWN] + "; to know: " + hints(g))
        lines.append("")
    return lines


def _head(r: NodeRuleResult) -> str:
    rule = r.placed.rule
    return f"{rule.attribute} {rule.operator}" + (
        "" if rule.operator in ("is_set", "is_not_set") else f" {rule.value!r}"
    )


def failures(g: GroupPlacement) -> str:
    """The constraints that keep the group off this node, named."""
    return "; ".join(f"constraint {_head(r)} fails: {_sides(r)}" for r in g.failed)


def _sides(r: NodeRuleResult) -> str:
    rule = r.placed.rule
    text = r.left if rule.operator in ("is_set", "is_not_set") else f"{r.left} {rule.operator} {r.right}"
    return text + (f" ({r.reason})" if r.reason else "")


def unknowns(g: GroupPlacement) -> str:
    """The constraints check-job cannot decide, and how to make them decidable."""
    named = "; ".join(f"{_head(r)} ({r.reason})" for r in g.unknown)
    return f"{named}; to know: {hints(g)}"


def hints(g: GroupPlacement) -> str:
    found = dict.fromkeys(h for r in g.unknown for h in r.hints)
    return ", or ".join(found)


def cluster_rules(placement: JobPlacement) -> list[str]:
    """The kinds of rule that need the cluster (spread, distinct_hosts, distinct_property), if the job has any."""
    kinds = {"spread" for g in placement.groups if g.spreads}
    kinds |= {r.placed.rule.operator for g in placement.groups for r in g.constraints if r.status == CLUSTER}
    return sorted(kinds)


def verdict_detail(placement: JobPlacement, outcome: str) -> str:
    """What the verdict line adds for the node-level rules: the failures, what is not known, or what needs a cluster."""
    if outcome == NOT_PLACED:
        named = [f'group "{g.rules.group}" {failures(g)}' for g in placement.groups if g.failed]
        return "; ".join(named)
    if outcome == UNKNOWN:
        named = [f'group "{g.rules.group}" {_head(r)}' for g in placement.groups for r in g.unknown]
        found = dict.fromkeys(h for g in placement.groups for r in g.unknown for h in r.hints)
        return f"{', '.join(named)} cannot be decided here; to know: {', or '.join(found)}" if named else ""
    kinds = cluster_rules(placement)
    if outcome == PLACE and kinds:
        return (
            f"on this node ({' and '.join(kinds)} {'needs' if len(kinds) == 1 else 'need'} the cluster: not evaluated)"
        )
    return ""
