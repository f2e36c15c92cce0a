"""check-job's output: per device block Nomad's outcome, the serving group, and why the others were rejected.

Groups rejected for the same reason (eight per-card MIG groups of another
type, say) are one line with their count, so the reason that matters is
not lost among copies.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from nomad_plugin.jobspec.evaluate import (
    NOT_PLACED,
    OUTCOME_TEXT,
    PLACE,
    REFUSE,
    GroupVerdict,
    RequestVerdict,
    RuleResult,
)
from nomad_plugin.nomad_view.types import Style


def _rule_json(r: RuleResult) -> dict[str, Any]:
    return {
        "attribute": r.rule.attribute,
        "operator": r.rule.operator,
        "value": r.rule.value,
        "weight": r.rule.weight if r.rule.affinity else None,
        "passed": r.passed,
        "left": r.left,
        "right": r.right,
        "reason": r.reason,
        "note": r.note,
    }


def _group_json(v: GroupVerdict) -> dict[str, Any]:
    return {
        "group": v.group.full_name,
        "eligible": v.eligible,
        "reasons": list(v.reasons),
        "constraints": [_rule_json(r) for r in v.rules],
        "affinity_score": v.affinity_score,
        "affinities": [_rule_json(r) for r in v.affinities],
        "free_healthy": len(v.free_ids),
    }


def verdicts_json(verdicts: Sequence[RequestVerdict]) -> list[dict[str, Any]]:
    return [
        {
            "job": v.request.job,
            "group": v.request.group,
            "task": v.request.task,
            "device": v.request.name,
            "count": v.request.count,
            "ok": v.ok,
            "outcome": v.outcome,
            "verdict": v.outcome_text,
            "problems": list(v.problems),
            "unsupported": list(v.request.unsupported),
            "why": list(v.why),
            "notes": list(v.notes),
            "warnings": list(v.warnings),
            "caveats": list(v.caveats),
            "chosen": v.chosen.group.full_name if v.chosen else None,
            "ties": list(v.ties),
            "picked_ids": list(v.picked_ids),
            "groups": [_group_json(g) for g in v.groups],
        }
        for v in verdicts
    ]


def _score(v: GroupVerdict) -> str:
    return f" [affinity score {v.affinity_score:+.2f}]" if v.affinity_score is not None else ""


def _why(g: GroupVerdict) -> str:
    if g.reasons:
        return "; ".join(g.reasons)
    if g.panic:
        return g.panic
    if g.affinity_score is None:
        return "eligible too (no affinity ranks the groups)"
    return "eligible, lower or equal affinity score" + _score(g)


def collapse(groups: Sequence[GroupVerdict]) -> list[tuple[str, list[GroupVerdict]]]:
    """Groups with the same reason, in first-seen order; a group's own name is not part of the reason."""
    by_reason: dict[str, list[GroupVerdict]] = {}
    for g in groups:
        key = ("+" if g.eligible else "-") + _why(g).replace(repr(g.group.name), "each group's name")
        by_reason.setdefault(key, []).append(g)
    return [(key[1:], members) for key, members in by_reason.items()]


def _names(members: Sequence[GroupVerdict]) -> str:
    names = [m.group.full_name for m in members]
    if len(names) <= 3:
        return ", ".join(names)
    return f"{names[0]}, {names[1]}, ... {names[-1]}"


def verdicts_text(verdicts: Sequence[RequestVerdict], style: Style, max_rejected: int = 12) -> list[str]:
    lines: list[str] = []
    for v in verdicts:
        req = v.request
        lines.append(style(f'job "{req.job}" {req.where} (count {req.count})', "bold"))
        for problem in v.problems:
            lines.append("  " + style("INVALID ", "red", "bold") + problem)
        for item in req.unsupported:
            lines.append("  " + style("CANNOT EVALUATE ", "yellow", "bold") + item)
        if v.outcome == REFUSE:
            lines.append("  " + style("REFUSED ", "red", "bold") + OUTCOME_TEXT[REFUSE] + " (INVALID above)")
        elif v.chosen and v.outcome == PLACE:
            lines.append(
                "  " + style("OK ", "green", "bold") + f"served by {v.chosen.group.full_name}{_score(v.chosen)}"
            )
            free = len(v.chosen.free_ids)
            pick = (
                f" (Nomad picks any {len(v.picked_ids)} of the {free} free instances)"
                if free > len(v.picked_ids)
                else ""
            )
            lines.append(f"     would get: {', '.join(v.picked_ids)}{pick}")
            for r in (*v.chosen.rules, *v.chosen.affinities):
                lines.append(f"     {'affinity' if r.rule.affinity else 'constraint'} {r.describe()}")
            if v.ties:
                lines.append(f"     Nomad picks any of the {len(v.ties) + 1} groups with this score at random")
        elif v.outcome == NOT_PLACED:
            lines.append("  " + style("NO GROUP CAN SERVE THIS BLOCK", "red", "bold"))
            for item in v.why:
                lines.append("  " + style("NOT PLACED ", "red", "bold") + item)
        others = [g for g in v.groups if g is not v.chosen]
        collapsed = collapse(others)
        for reason, members in collapsed[:max_rejected]:
            label = style("also fits", "yellow") if members[0].eligible else style("rejected", "red")
            if len(members) == 1:
                lines.append(f"  {label} {members[0].group.full_name}: {_why(members[0])}")
            else:
                lines.append(f"  {label} {len(members)} groups ({_names(members)}): {reason}")
        if len(collapsed) > max_rejected:
            lines.append(f"  ... {len(collapsed) - max_rejected} more reasons (use --json for all)")
        for note in v.notes:
            lines.append("  " + style("NOTE ", "cyan") + note)
        for warning in v.warnings:
            lines.append("  " + style("WARNING ", "yellow", "bold") + warning)
        for caveat in v.caveats:
            lines.append("  " + style("WARNING ", "yellow", "bold") + "check-job may differ from Nomad here: " + caveat)
        lines.append("")
    return lines
