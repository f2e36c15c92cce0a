"""Evaluate job ``device`` requests against a fingerprint with Nomad's scheduler rules.

Per request (nomad-protocol.md §5.3, §6): a group is a candidate when its
vendor/type/name match the request's name parts exactly and every
constraint holds (targets ``${device.attr.X}``, ``${device.vendor}``,
``${device.type}``, ``${device.model}``, ``${device.ids}``; anything else is
a literal read by ``ParseAttribute``); a constraint on ``${device.ids}`` is
then re-checked per instance. The group must hold ``count`` healthy
instances not already taken by an earlier device block of the same task
group (one allocation lands on one node). Among candidates the highest
affinity score wins (sum of matched weights / sum of |weights|); equal
scores keep fingerprint order. Every rejection carries the reason a job
author needs.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from nomad_plugin.jobspec import versions
from nomad_plugin.jobspec.parse import DeviceRequest, Rule
from nomad_plugin.jobspec.units import compare, humanize, kind, parse_attribute, render
from nomad_plugin.nomad_view.types import Attribute, DeviceGroup

MIG_SLICE_SIZES = (1, 2, 3, 4, 7)  # XDM's ``slice`` values; the group's slice_sizes attribute wins

IDS_TARGET = "${device.ids}"
ORDER_OPS = {"<": lambda v: v < 0, "<=": lambda v: v <= 0, ">": lambda v: v > 0, ">=": lambda v: v >= 0}
EQ_OPS = ("=", "==", "is")
NE_OPS = ("!=", "not")
KNOWN_OPS = (
    *EQ_OPS, *NE_OPS, *ORDER_OPS, "version", "semver", "regexp",
    "set_contains", "set_contains_all", "set_contains_any", "is_set", "is_not_set",
)  # fmt: skip


@dataclass(frozen=True)
class Target:
    attr: Attribute | None  # None: not found
    text: str  # how it is shown
    missing: str = ""  # why it was not found


@dataclass(frozen=True)
class RuleResult:
    rule: Rule
    passed: bool
    left: str
    right: str
    reason: str = ""

    def describe(self) -> str:
        unary = self.rule.operator in ("is_set", "is_not_set")
        head = f"{self.rule.attribute} {self.rule.operator}" + ("" if unary else f" {self.rule.value!r}")
        if self.reason:
            return f"{head}: {self.reason}"
        verdict = "holds" if self.passed else "fails"
        if unary:
            return f"{head} {verdict}: {self.left}"
        return f"{head} {verdict}: {self.left} {self.rule.operator} {self.right}"


@dataclass(frozen=True)
class GroupVerdict:
    group: DeviceGroup
    eligible: bool
    reasons: tuple[str, ...]
    rules: tuple[RuleResult, ...] = ()
    free_ids: tuple[str, ...] = ()
    affinity_score: float | None = None
    affinities: tuple[RuleResult, ...] = ()


@dataclass(frozen=True)
class RequestVerdict:
    request: DeviceRequest
    groups: tuple[GroupVerdict, ...]
    chosen: GroupVerdict | None = None
    picked_ids: tuple[str, ...] = ()
    problems: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return self.chosen is not None and not self.problems


# --- targets ---------------------------------------------------------------------------


def resolve(target: str, group: DeviceGroup, ids: Sequence[str] | None = None) -> Target:
    """A constraint side: a device interpolation, or a literal parsed like Nomad's ParseAttribute."""
    if not target.startswith("${"):
        attr = parse_attribute(target)
        return Target(attr, render(attr))
    if target == "${device.model}":
        return Target(Attribute(group.name), repr(group.name))
    if target == "${device.vendor}":
        return Target(Attribute(group.vendor), repr(group.vendor))
    if target == "${device.type}":
        return Target(Attribute(group.type), repr(group.type))
    if target == IDS_TARGET:
        joined = ",".join(ids if ids is not None else [d.id for d in group.devices])
        return Target(Attribute(joined), repr(joined) if len(joined) < 80 else f"'{joined[:60]}...'")
    if target.startswith("${device.attr.") and target.endswith("}"):
        key = target[len("${device.attr.") : -1]
        found = group.attributes.get(key)
        if found is None:
            return Target(None, target, unknown_attribute(key, group.attributes))
        return Target(found, humanize(found))
    return Target(
        None,
        target,
        f"unknown target {target}: inside a device block only ${{device.attr.<name>}}, ${{device.vendor}}, "
        "${device.type}, ${device.model} and ${device.ids} resolve",
    )


def unknown_attribute(key: str, attributes: Iterable[str]) -> str:
    names = sorted(attributes)
    close = difflib.get_close_matches(key, names, n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else f"; the group has: {', '.join(names)}"
    return f"unknown attribute {key!r}{hint}"


# --- one rule ----------------------------------------------------------------------------


def _string_of(target: Target) -> str | None:
    if target.attr is None or not isinstance(target.attr.value, str) or target.attr.unit:
        return None
    return target.attr.value


def _set(text: str) -> set[str]:
    return {part.strip() for part in text.split(",")}


def _article(word: str) -> str:
    return f"an {word}" if word[0] in "aeiou" else f"a {word}"


def check(operator: str, left: Target, right: Target) -> tuple[bool, str]:
    """Nomad's checkAttributeConstraint: (holds, reason when it cannot be evaluated)."""
    if operator in ("distinct_hosts", "distinct_property"):
        return False, f"{operator} is not allowed inside a device block"
    if operator not in KNOWN_OPS:
        return False, f"unknown operator {operator!r}; allowed: {', '.join(KNOWN_OPS)}"
    lfound, rfound = left.attr is not None, right.attr is not None
    if operator == "is_set":
        return lfound, "" if lfound else left.missing
    if operator == "is_not_set":
        return not lfound, ""
    if operator in NE_OPS and not (lfound and rfound):
        return lfound or rfound, ""
    if not lfound:
        return False, left.missing or "left side not found"
    if not rfound:
        return False, right.missing or "right side not found"
    assert left.attr is not None and right.attr is not None
    if operator in EQ_OPS or operator in NE_OPS or operator in ORDER_OPS:
        order, why = compare(left.attr, right.attr)
        if why:
            return False, why
        if operator in EQ_OPS:
            return order == 0, ""
        if operator in NE_OPS:
            return order != 0, ""
        if isinstance(left.attr.value, bool):
            return False, f"{operator} cannot order bools"
        return bool(ORDER_OPS[operator](order)), ""
    lstr, rstr = _string_of(left), _string_of(right)
    if lstr is None or rstr is None:
        side = right if rstr is None else left
        read_as = f" (Nomad reads {side.text} as {_article(kind(side.attr))})" if side.attr is not None else ""
        return False, f"{operator} compares strings only: {left.text} vs {right.text}{read_as}"
    if operator in ("version", "semver"):
        return versions.check(lstr, rstr, strict=operator == "semver")
    if operator == "regexp":
        try:
            return re.search(rstr, lstr) is not None, ""
        except re.error as exc:
            return False, f"bad regular expression {rstr!r}: {exc}"
    if operator in ("set_contains", "set_contains_all"):
        return _set(rstr) <= _set(lstr), ""
    return bool(_set(rstr) & _set(lstr)), ""  # set_contains_any


def check_rule(rule: Rule, group: DeviceGroup, ids: Sequence[str] | None = None) -> RuleResult:
    left = resolve(rule.attribute, group, ids)
    right = resolve(rule.value, group, ids)
    passed, reason = check(rule.operator, left, right)
    return RuleResult(rule, passed, left.text, right.text, reason)


# --- one request -------------------------------------------------------------------------


def name_matches(name: str, group: DeviceGroup) -> str:
    """Empty when ``name`` (type, vendor/type or vendor/type/model) selects ``group``, else why not."""
    parts = name.split("/", 2)
    wanted = {1: ("", parts[0], ""), 2: (parts[0], parts[-1], ""), 3: tuple(parts)}[len(parts)]
    vendor, dtype, model = wanted
    for label, want, have in (
        ("vendor", vendor, group.vendor),
        ("type", dtype, group.type),
        ("model", model, group.name),
    ):
        if want and want != have:
            return f"name mismatch: {label} {want!r} != {have!r}"
    return ""


def _uses_ids(rule: Rule) -> bool:
    return IDS_TARGET in (rule.attribute, rule.value)


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
    return f"count {count} is no MIG slice size ({listed}): Reserve refuses it, the task would fail to start"


def evaluate_group(request: DeviceRequest, group: DeviceGroup, taken: frozenset[str]) -> GroupVerdict:
    mismatch = name_matches(request.name, group)
    if mismatch:
        return GroupVerdict(group, False, (mismatch,))
    results = tuple(check_rule(rule, group) for rule in request.constraints)
    reasons = [f"constraint {r.describe()}" for r in results if not r.passed]
    free = [d.id for d in group.devices if d.healthy and d.id not in taken]
    id_rules = [r for r in request.constraints if _uses_ids(r)]
    if id_rules and not reasons:
        free = [i for i in free if all(check_rule(r, group, [i]).passed for r in id_rules)]
    mig_problem = mig_count_problem(request.count, group)
    if mig_problem and not reasons:
        reasons.append(mig_problem)
    if not reasons and len(free) < max(request.count, 1):
        healthy = sum(1 for d in group.devices if d.healthy)
        detail = f"{healthy} healthy of {len(group.devices)}"
        if taken & {d.id for d in group.devices}:
            detail += ", some taken by an earlier device block of this task group"
        if id_rules:
            detail += f", {len(free)} pass the ${{device.ids}} constraint"
        if request.count == 0:
            reasons.append(
                f"count 0 still needs one free healthy instance in the group, as Nomad's feasibility check ({detail})"
            )
        else:
            reasons.append(f"count {request.count} larger than the free healthy instances ({len(free)}; {detail})")
    score = None
    affinity_results: tuple[RuleResult, ...] = ()
    if request.affinities:
        affinity_results = tuple(check_rule(rule, group) for rule in request.affinities)
        total = sum(abs(r.rule.weight) for r in affinity_results)
        score = sum(r.rule.weight for r in affinity_results if r.passed) / total if total else 0.0
    return GroupVerdict(group, not reasons, tuple(reasons), results, tuple(free), score, affinity_results)


def evaluate_request(
    request: DeviceRequest, groups: Sequence[DeviceGroup], taken: frozenset[str] = frozenset()
) -> RequestVerdict:
    verdicts = tuple(evaluate_group(request, g, taken) for g in groups)
    problems = list(request.problems)
    if not groups:
        problems.append("the node fingerprinted no devices")
    chosen: GroupVerdict | None = None
    for v in verdicts:
        if v.eligible and (chosen is None or (v.affinity_score or 0.0) > (chosen.affinity_score or 0.0)):
            chosen = v
    picked = tuple(chosen.free_ids[: request.count]) if chosen else ()
    return RequestVerdict(request, verdicts, chosen, picked, tuple(problems))


def evaluate_job(requests: Sequence[DeviceRequest], groups: Sequence[DeviceGroup]) -> list[RequestVerdict]:
    """All device blocks; blocks of one task group share the node, so IDs picked earlier are taken."""
    taken: dict[tuple[str, str], set[str]] = {}
    out = []
    for request in requests:
        used = taken.setdefault((request.job, request.group), set())
        verdict = evaluate_request(request, groups, frozenset(used))
        used.update(verdict.picked_ids)
        out.append(verdict)
    return out
