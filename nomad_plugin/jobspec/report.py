"""check-job's output: per device block, the serving group and why each other group was rejected."""

from __future__ import annotations

from typing import Any

from nomad_plugin.jobspec.evaluate import GroupVerdict, RequestVerdict, RuleResult
from nomad_plugin.nomad_view.render import Style


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


def verdicts_json(verdicts: list[RequestVerdict]) -> list[dict[str, Any]]:
    return [
        {
            "job": v.request.job,
            "group": v.request.group,
            "task": v.request.task,
            "device": v.request.name,
            "count": v.request.count,
            "ok": v.ok,
            "problems": list(v.problems),
            "chosen": v.chosen.group.full_name if v.chosen else None,
            "picked_ids": list(v.picked_ids),
            "groups": [_group_json(g) for g in v.groups],
        }
        for v in verdicts
    ]


def _score(v: GroupVerdict) -> str:
    return f" [affinity score {v.affinity_score:+.2f}]" if v.affinity_score is not None else ""


def verdicts_text(verdicts: list[RequestVerdict], style: Style, max_rejected: int = 12) -> list[str]:
    lines: list[str] = []
    for v in verdicts:
        req = v.request
        lines.append(style(f'job "{req.job}" {req.where} (count {req.count})', "bold"))
        for problem in v.problems:
            lines.append("  " + style("INVALID ", "red", "bold") + problem)
        if v.chosen and v.problems:
            lines.append(
                "  "
                + style("NOT PLACED ", "red", "bold")
                + f"{v.chosen.group.full_name} would match, but Nomad rejects the job first (INVALID above)"
            )
        elif v.chosen:
            ids = ", ".join(v.picked_ids) if v.picked_ids else "no instance (count 0: Reserve gets no IDs)"
            lines.append(
                "  " + style("OK ", "green", "bold") + f"served by {v.chosen.group.full_name}{_score(v.chosen)}"
            )
            lines.append(f"     would get: {ids}")
            for r in (*v.chosen.rules, *v.chosen.affinities):
                lines.append(f"     {'affinity' if r.rule.affinity else 'constraint'} {r.describe()}")
        else:
            lines.append("  " + style("NO GROUP CAN SERVE THIS BLOCK", "red", "bold"))
        others = [g for g in v.groups if g is not v.chosen]
        for g in others[:max_rejected]:
            label = style("also fits", "yellow") if g.eligible else style("rejected", "red")
            if g.reasons:
                why = "; ".join(g.reasons)
            elif g.affinity_score is None:
                why = "eligible too (no affinity ranks the groups)"
            else:
                why = "eligible, lower or equal affinity score" + _score(g)
            lines.append(f"  {label} {g.group.full_name}: {why}")
        if len(others) > max_rejected:
            lines.append(f"  ... {len(others) - max_rejected} more groups (use --json for all)")
        lines.append("")
    return lines
