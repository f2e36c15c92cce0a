"""A job's ``device`` blocks decided against one node's fingerprint, as Nomad's scheduler decides them.

Feasibility is ``DeviceChecker`` (``scheduler/feasible/feasible.go``); the pick
``deviceAllocator.createOffer`` (``scheduler/feasible/device.go``): a group
qualifies by name, every constraint (``nodeDeviceMatches``) and enough free
healthy instances, each passing the ``${device.ids}`` constraints
(``deviceIDMatchesConstraint``); the highest affinity score wins, ties by Go's
random map order (check-job shows the first and says so).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from nomad_plugin.jobspec import golang
from nomad_plugin.jobspec.operators import (
    CLUSTER_OPERATORS,
    NOT_EQUAL,
    Outcome,
    check_attribute,
    humanize,
    parse_attribute,
    render,
)
from nomad_plugin.jobspec.parse import DeviceRequest, Rule, validate_device
from nomad_plugin.nomad_view.types import Attribute, DeviceGroup, Style

MIG_SLICE_SIZES = (1, 2, 3, 4, 7)  # XDM's ``slice`` values; the group's slice_sizes attribute wins
IDS_TARGET = "${device.ids}"

PLACE, REFUSE, NOT_PLACED, UNKNOWN, PARTIAL = "place", "refuse", "not_placed", "unknown", "partial"
OUTCOME_TEXT = {
    PLACE: "Nomad would place this",
    REFUSE: "Nomad would refuse this job at submission",
    NOT_PLACED: "Nomad would not place it on this node",
    PARTIAL: "Nomad would place only part of it on this node",
    UNKNOWN: "check-job cannot tell what Nomad would do",
}
FINGERPRINT_DOC = "docs/fingerprint.md"
_FEASIBILITY_NOTE = (
    "Nomad's feasibility check (DeviceChecker) fills this task group's requests from the groups in Go's random map "
    "order; in fingerprint order it runs out of healthy instances, so some evaluations refuse this node"
)


@dataclass(frozen=True)
class Target:
    attr: Attribute | None  # None: not found
    text: str  # how it is shown
    missing: str = ""  # why Nomad does not find it


@dataclass(frozen=True)
class RuleResult:
    rule: Rule
    passed: bool
    left: str
    right: str
    reason: str = ""
    note: str = ""  # Nomad's arithmetic or decoder decided it (printed with the verdict)
    panic: str = ""

    def describe(self) -> str:
        if self.reason:
            return f"{self.rule.head()}: {self.reason}"
        sides = self.left if self.rule.unary else f"{self.left} {self.rule.operator} {self.right}"
        return f"{self.rule.head()} {'holds' if self.passed else 'fails'}: {sides}"


@dataclass(frozen=True)
class GroupVerdict:
    group: DeviceGroup
    eligible: bool
    reasons: tuple[str, ...]
    rules: tuple[RuleResult, ...] = ()
    free_ids: tuple[str, ...] = ()
    affinity_score: float | None = None
    affinities: tuple[RuleResult, ...] = ()
    name_matched: bool = True
    panic: str = ""


@dataclass(frozen=True)
class RequestVerdict:
    request: DeviceRequest
    groups: tuple[GroupVerdict, ...]
    chosen: GroupVerdict | None = None
    picked_ids: tuple[str, ...] = ()
    problems: tuple[str, ...] = field(default=())  # why Nomad refuses the job (decode, validation)
    outcome: str = PLACE
    why: tuple[str, ...] = ()  # why Nomad would not place it, beyond the per-group reasons
    notes: tuple[str, ...] = ()  # Nomad-specific behaviour that decided or shapes the verdict
    warnings: tuple[str, ...] = ()  # plugin rules on top of Nomad's outcome
    ties: tuple[str, ...] = ()  # other groups Nomad may pick instead (equal score)
    caveats: tuple[str, ...] = ()  # where check-job cannot settle Nomad's answer (docs/operator.md)

    @property
    def ok(self) -> bool:
        return self.outcome == PLACE and not self.warnings


def resolve(target: str, group: DeviceGroup) -> Target:
    """``resolveDeviceTarget``: a device interpolation, or a literal read by ``ParseAttribute``."""
    if not target.startswith("${"):
        attr = parse_attribute(target)
        return Target(attr, render(attr))
    named = {"${device.model}": group.name, "${device.vendor}": group.vendor, "${device.type}": group.type}
    if target in named:
        return Target(Attribute(named[target]), repr(named[target]))
    if target == IDS_TARGET:
        joined = ",".join(d.id for d in group.devices)
        return Target(Attribute(joined), repr(joined) if len(joined) < 80 else f"'{joined[:60]}...'")
    if target.startswith("${device.attr."):
        key = target[len("${device.attr.") :].removesuffix("}")
        found = group.attributes.get(key)
        if found is None:
            names = sorted(group.attributes)
            close = difflib.get_close_matches(key, names, n=3, cutoff=0.6)
            hint = f"; did you mean {', '.join(close)}?" if close else f"; the group has: {', '.join(names)}"
            return Target(None, target, f"unknown attribute {key!r}{hint}")
        return Target(found, humanize(found))
    return Target(
        None,
        target,
        f"{target} is not found inside a device block: only ${{device.attr.<name>}}, ${{device.vendor}}, "
        "${device.type}, ${device.model} and ${device.ids} resolve there",
    )


def check_rule(rule: Rule, group: DeviceGroup) -> RuleResult:
    """``nodeDeviceMatches`` / the affinity score's check for one rule on one group."""
    left, right = resolve(rule.attribute, group), resolve(rule.value, group)
    outcome = check_attribute(rule.operator, left.attr, right.attr)
    reason = outcome.why
    if outcome.why == "not found":
        reason = left.missing or right.missing
    elif not outcome.holds and rule.operator in NOT_EQUAL and left.attr is None and right.attr is None:
        reason = left.missing or right.missing
    return RuleResult(rule, outcome.holds, left.text, right.text, reason, outcome.note, outcome.panic)


def instance_outcome(instance_id: str, rule: Rule, group: DeviceGroup) -> Outcome:
    """``deviceIDMatchesConstraint`` for one rule: ``<other side> <operator> <instance ID>``.

    Nomad resolves the other side and passes it as found even when it is not; a missing side then
    compares with nothing (``!=`` fails, ``is_set`` holds).
    """
    other = rule.value if rule.attribute == IDS_TARGET else rule.attribute
    target = resolve(other, group).attr
    if target is None:
        return Outcome(rule.operator in ("is_set", *CLUSTER_OPERATORS))
    return check_attribute(rule.operator, target, Attribute(instance_id))


def name_matches(name: str, group: DeviceGroup) -> str:
    """Empty when ``name`` (type, vendor/type or vendor/type/model) selects ``group``, else why not."""
    parts = name.split("/", 2)
    wanted = {1: ("", parts[0], ""), 2: (parts[0], parts[-1], "")}.get(len(parts), tuple(parts))
    for label, want, have in zip(
        ("vendor", "type", "model"), wanted, (group.vendor, group.type, group.name), strict=True
    ):
        if want and want != have:
            return f"name mismatch: {label} {want!r} != {have!r}"
    return ""


def mig_count_problem(count: int, group: DeviceGroup) -> str:
    """Why Reserve would refuse ``count`` units of a MIG-unit group (XDM's slice sizes), or ""."""
    if not group.type.endswith("-mig") or count == 0:
        return ""
    sizes_attr = group.attributes.get("slice_sizes")
    text = str(sizes_attr.value) if sizes_attr is not None else ",".join(str(s) for s in MIG_SLICE_SIZES)
    sizes = [int(p) for p in text.split(",") if p.strip().isdigit()] or list(MIG_SLICE_SIZES)
    if count in sizes:
        return ""
    listed = ", ".join(str(s) for s in sizes)
    return (
        f"count {count} is no MIG slice size ({listed}): Reserve refuses it, the task would fail to start "
        "(a plugin rule Nomad does not know: it would place the task)"
    )


def evaluate_group(request: DeviceRequest, group: DeviceGroup, taken: frozenset[str]) -> GroupVerdict:
    mismatch = name_matches(request.name, group)
    if mismatch:
        return GroupVerdict(group, False, (mismatch,), name_matched=False)
    results = tuple(check_rule(rule, group) for rule in request.constraints)
    panic = next((r.panic for r in results if r.panic), "")
    reasons = [f"constraint {r.describe()}" for r in results if not r.passed]
    free = [d.id for d in group.devices if d.healthy and d.id not in taken]
    id_rules = [r for r in request.constraints if IDS_TARGET in (r.attribute, r.value)]
    if id_rules and not reasons:
        free = [i for i in free if all(instance_outcome(i, r, group) for r in id_rules)]
    count = request.count
    if not reasons and count > 0 and len(free) < count:
        healthy = sum(1 for d in group.devices if d.healthy)
        detail = f"{healthy} healthy of {len(group.devices)}"
        if taken & {d.id for d in group.devices}:
            detail += ", some taken by an earlier device block of this task group"
        if id_rules:
            detail += f", {len(free)} pass the ${{device.ids}} constraint one by one"
        reasons.append(f"count {count} larger than the free healthy instances ({len(free)}; {detail})")
    score = None
    affinity_results: tuple[RuleResult, ...] = ()
    if request.affinities:
        affinity_results = tuple(check_rule(rule, group) for rule in request.affinities)
        if not reasons:
            panic = panic or next((r.panic for r in affinity_results if r.panic), "")
        total = sum(abs(r.rule.weight) for r in affinity_results)
        score = sum(r.rule.weight for r in affinity_results if r.passed) / total if total else 0.0
    return GroupVerdict(
        group, not reasons and not panic, tuple(reasons), results, tuple(free), score, affinity_results, True, panic
    )


def _asked_mode(config: Mapping[str, Any] | None, mode: str) -> str:
    """How the plugin config asks for ``mode`` (default_mode or a card block), or ""."""
    if not config:
        return ""
    if config.get("default_mode") == mode:
        return f'default_mode = "{mode}"'
    cards = config.get("card")
    for rule in cards if isinstance(cards, (list, tuple)) else []:
        if isinstance(rule, Mapping) and rule.get("mode") == mode:
            return f'a card block (match = "{rule.get("match", "")}") with mode = "{mode}"'
    return ""


def name_hint(request: DeviceRequest, groups: Sequence[DeviceGroup], config: Mapping[str, Any] | None) -> str:
    """When no group's name matches: a mode that fell back, or group_by renaming the groups, and the fix."""
    parts = request.name.split("/", 2)
    vendor = parts[0] if len(parts) > 1 else ""
    dtype = parts[1] if len(parts) > 1 else parts[0]
    types = sorted({f"{g.vendor}/{g.type}" for g in groups})
    for suffix, mode, what in (("-mig", "mig", "MIG units"), ("-share", "tdm", "time-division shares")):
        if not dtype.endswith(suffix) or any(g.type == dtype for g in groups):
            continue
        base = dtype.removesuffix(suffix)
        whole = sorted(
            {g.name.split(" card")[0] for g in groups if g.type == base and (not vendor or g.vendor == vendor)}
        )
        if not whole:
            continue
        fix = f'ask for device "{vendor + "/" if vendor else ""}{base}" (whole cards)'
        asked = _asked_mode(config, mode)
        if asked:
            why = (
                "not MIG-capable (mig_models)"
                if mode == "mig"
                else "unable to hold that many shares (a share needs 1 GiB)"
            )
            return (
                f"{asked} fell back to whole cards here: {', '.join(whole)} {'is' if len(whole) == 1 else 'are'} {why}, "
                f"so the plugin offers {', '.join(types)} and no {dtype} group. Fix: {fix}, or run the job on cards "
                f'that can ({FINGERPRINT_DOC}, "Modes")'
            )
        return (
            f"no card of this node offers {what} ({dtype}): the plugin offers them only for cards in {mode} mode "
            f'(default_mode = "{mode}" or a card block), and here it offers {", ".join(types)}. Fix: set the mode in '
            f'the plugin config, or {fix} ({FINGERPRINT_DOC}, "Modes")'
        )
    if len(parts) == 3:
        model = parts[2]
        of_model = [g for g in groups if (m := g.attributes.get("model")) is not None and m.value == model]
        renamed = [g for g in of_model if g.name != model and g.vendor == vendor and g.type == dtype]
        other_modes = sorted({f"{g.vendor}/{g.type}" for g in of_model if g.type.startswith(dtype + "-")})
        if not renamed and other_modes:
            return (
                f"the {model} cards are offered as {', '.join(other_modes)} here (their mode is not whole), so no "
                f'{vendor}/{dtype} group exists. Fix: ask for device "{other_modes[0]}", or change the card mode '
                f'({FINGERPRINT_DOC}, "Modes")'
            )
        if renamed:
            group_by = (config or {}).get("group_by")
            how = (
                f'group_by = "{group_by}"' if isinstance(group_by, str) and group_by not in ("", "none") else "group_by"
            )
            names = ", ".join(repr(g.name) for g in renamed[:3]) + (", ..." if len(renamed) > 3 else "")
            return (
                f'{how} names the groups {names}, so device "{request.name}" matches none of them. Fix: device '
                f'"{parts[0]}/{parts[1]}" with constraint {{ attribute = "${{device.attr.model}}" value = "{model}" }} '
                f'({FINGERPRINT_DOC}, "A model with or without group_by")'
            )
    return ""


def evaluate_request(
    request: DeviceRequest,
    groups: Sequence[DeviceGroup],
    taken: frozenset[str] = frozenset(),
    config: Mapping[str, Any] | None = None,
) -> RequestVerdict:
    verdicts = tuple(evaluate_group(request, g, taken) for g in groups)
    problems = (*request.problems, *validate_device(request))
    notes = [r.note for r in (*request.constraints, *request.affinities) if r.note]
    for v in verdicts:
        notes += [
            f"{r.rule.attribute} {r.rule.operator} {r.rule.value!r}: {r.note}"
            for r in (*v.rules, *v.affinities)
            if r.note
        ]
    why: list[str] = []
    panic = next((v.panic for v in verdicts if v.panic), "")
    if problems:
        outcome = REFUSE
    elif request.unsupported:
        outcome = UNKNOWN
    elif panic:
        outcome = NOT_PLACED
        why.append(
            f"Nomad's scheduler panics evaluating this ({panic}): the evaluation fails, the job is placed nowhere"
        )
    elif not groups:
        outcome = NOT_PLACED
        why.append("the node fingerprinted no devices (Nomad: no devices available)")
    elif request.count == 0:
        outcome = NOT_PLACED
        why.append("count = 0: Nomad's allocator refuses a request of zero devices (invalid request of zero devices)")
    else:
        outcome = PLACE
    chosen: GroupVerdict | None = None
    ties: list[str] = []
    if outcome == PLACE:
        eligible = [v for v in verdicts if v.eligible]
        if eligible:
            best = max(v.affinity_score or 0.0 for v in eligible)
            top = [v for v in eligible if (v.affinity_score or 0.0) == best]
            chosen, ties = top[0], [v.group.full_name for v in top[1:]]
        else:
            outcome = NOT_PLACED
            hint = name_hint(request, groups, config) if all(not v.name_matched for v in verdicts) else ""
            why.append(hint or "no device group matches the request (Nomad: no devices match request)")
    picked = tuple(chosen.free_ids[: request.count]) if chosen else ()
    warnings = (mig_count_problem(request.count, chosen.group),) if chosen else ()
    # The block's regexps whose verdict RE2 cannot settle for Go.
    regexps = (golang.caveat(r.value) for r in (*request.constraints, *request.affinities) if r.operator == "regexp")
    return RequestVerdict(
        request, verdicts, chosen, picked, tuple(problems), outcome, tuple(why), tuple(dict.fromkeys(notes)),
        tuple(w for w in warnings if w), tuple(ties), tuple(dict.fromkeys(c for c in regexps if c)),
    )  # fmt: skip


def device_checker(requests: Sequence[DeviceRequest], groups: Sequence[DeviceGroup]) -> bool:
    """``DeviceChecker.hasDevices`` for one task group: healthy instances, possibly of several groups."""
    available = {i: n for i, g in enumerate(groups) if (n := sum(1 for d in g.devices if d.healthy))}
    for request in requests:
        desired = request.count
        for i in available:
            if available[i] and _group_matches(request, groups[i]):
                used = min(desired, available[i])
                available[i] -= used
                desired -= used
                if desired == 0:
                    break
        else:
            return False
    return True


def _group_matches(request: DeviceRequest, group: DeviceGroup) -> bool:
    """``nodeDeviceMatches``: name and every constraint, no count."""
    return not name_matches(request.name, group) and all(check_rule(r, group).passed for r in request.constraints)


def evaluate_job(
    requests: Sequence[DeviceRequest], groups: Sequence[DeviceGroup], config: Mapping[str, Any] | None = None
) -> list[RequestVerdict]:
    """Every device block; the blocks of one task group share the node, so IDs picked earlier are taken."""
    by_group: dict[tuple[str, str], list[int]] = {}
    out: list[RequestVerdict] = []
    for request in requests:
        earlier = by_group.setdefault((request.job, request.group), [])
        taken = frozenset(i for index in earlier for i in out[index].picked_ids)
        earlier.append(len(out))
        out.append(evaluate_request(request, groups, taken, config))
    for indexes in by_group.values():
        members = [out[i] for i in indexes]
        if all(v.outcome == PLACE for v in members) and not device_checker([v.request for v in members], groups):
            for i in indexes:
                out[i] = replace(out[i], notes=(*out[i].notes, _FEASIBILITY_NOTE))
    return out


# --- output: groups rejected for one reason are one line, so the reason that matters is not lost ---


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
            "verdict": OUTCOME_TEXT[v.outcome],
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


def tagged(style: Style, label: str, items: Iterable[str], *names: str) -> list[str]:
    return ["  " + style(label, *names) + item for item in items]


def verdicts_text(verdicts: Sequence[RequestVerdict], style: Style, max_rejected: int = 12) -> list[str]:
    lines: list[str] = []
    for v in verdicts:
        req = v.request
        lines.append(style(f'job "{req.job}" {req.where} (count {req.count})', "bold"))
        lines += tagged(style, "INVALID ", v.problems, "red", "bold")
        lines += tagged(style, "CANNOT EVALUATE ", req.unsupported, "yellow", "bold")
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
            lines += tagged(style, "NOT PLACED ", v.why, "red", "bold")
        others = [g for g in v.groups if g is not v.chosen]
        collapsed = collapse(others)
        for reason, members in collapsed[:max_rejected]:
            label = style("also fits", "yellow") if members[0].eligible else style("rejected", "red")
            if len(members) == 1:
                lines.append(f"  {label} {members[0].group.full_name}: {_why(members[0])}")
            else:
                names = [m.group.full_name for m in members]
                shown = ", ".join(names) if len(names) <= 3 else f"{names[0]}, {names[1]}, ... {names[-1]}"
                lines.append(f"  {label} {len(members)} groups ({shown}): {reason}")
        if len(collapsed) > max_rejected:
            lines.append(f"  ... {len(collapsed) - max_rejected} more reasons (use --json for all)")
        lines += tagged(style, "NOTE ", v.notes, "cyan")
        lines += tagged(style, "WARNING ", v.warnings, "yellow", "bold")
        lines += tagged(
            style, "WARNING ", [f"check-job may differ from Nomad here: {c}" for c in v.caveats], "yellow", "bold"
        )
        lines.append("")
    return lines
