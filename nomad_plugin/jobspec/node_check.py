"""Decide a task group's node-level rules on this node, as Nomad's scheduler does.

- **Constraints** (``ConstraintChecker`` in ``scheduler/feasible/feasible.go``):
  the job's, the group's and the tasks' constraints, each side resolved by
  ``resolveTarget`` (``node_values``) and compared by ``checkConstraint``
  (``operators.check_string``). One that fails keeps the group off this node.
  ``distinct_hosts`` and ``distinct_property`` hold there: other iterators
  decide them against the job's other allocations (``DistinctHostsIterator``,
  ``DistinctPropertyIterator``), so check-job reports them as needing a cluster.
- **Affinities** (``NodeAffinityIterator`` in ``scheduler/feasible/rank.go``):
  every matching affinity adds its weight; the node's score is that sum over
  the sum of the absolute weights. A score ranks nodes, it never keeps a
  group off one.
- **Spreads** (``SpreadIterator``) score a node by how the job's other
  allocations are spread: they need a cluster; check-job shows this node's
  value of the spread attribute.

A side check-job does not know makes the rule unknown, never a guess.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from nomad_plugin.jobspec.evaluate import NOT_PLACED, PLACE, REFUSE, UNKNOWN
from nomad_plugin.jobspec.groups import CLUSTER_OPERATORS, GroupRules, ParsedJob, Placed, Spread
from nomad_plugin.jobspec.node_values import NodeValues, Resolved
from nomad_plugin.jobspec.operators import check_string

HOLDS, FAILS, UNKNOWN_RULE, CLUSTER = "holds", "fails", "unknown", "cluster"
UNARY = ("is_set", "is_not_set")
CLUSTER_WHY = {
    "distinct_hosts": "Nomad checks it against the job's other allocations (DistinctHostsIterator): needs a cluster",
    "distinct_property": "Nomad counts the job's other allocations per value (DistinctPropertyIterator): "
    "needs a cluster",
}
SPREAD_WHY = "Nomad scores it against the job's other allocations (SpreadIterator): needs a cluster, not evaluated"


@dataclass(frozen=True)
class NodeRuleResult:
    placed: Placed
    status: str  # holds / fails / unknown / cluster
    left: str
    right: str
    reason: str = ""
    remarks: tuple[str, ...] = ()
    hints: tuple[str, ...] = ()  # what would make an unknown side known

    def describe(self) -> str:
        rule = self.placed.rule
        unary = rule.operator in UNARY
        if rule.operator == "distinct_hosts":
            head = f"distinct_hosts = {rule.value!r}"
        else:
            head = f"{rule.attribute} {rule.operator}" + ("" if unary else f" {rule.value!r}")
        if self.status in (CLUSTER, UNKNOWN_RULE):
            return f"{head}: {self.reason}"
        text = f"{head}: {self.left}" + ("" if unary else f" {rule.operator} {self.right}")
        return text + (f" ({self.reason})" if self.reason else "")


@dataclass(frozen=True)
class SpreadResult:
    spread: Spread
    value: Resolved

    def describe(self) -> str:
        here = self.value.shown(self.spread.attribute)
        if self.value.known and self.value.value is not None:
            here = f"this node's value {here}"
        elif self.value.known:
            here = "this node has no value (Nomad counts it as no target)"
        else:
            here = f"this node's value is unknown ({self.value.why_unknown})"
        return f"spread {self.spread.text()}: {here}; {SPREAD_WHY}"


@dataclass(frozen=True)
class GroupPlacement:
    rules: GroupRules
    constraints: tuple[NodeRuleResult, ...]
    affinities: tuple[NodeRuleResult, ...]
    spreads: tuple[SpreadResult, ...]
    outcome: str
    score: float | None = None  # the node-affinity score; None without affinities or with one unknown

    @property
    def failed(self) -> tuple[NodeRuleResult, ...]:
        return tuple(r for r in self.constraints if r.status == FAILS)

    @property
    def unknown(self) -> tuple[NodeRuleResult, ...]:
        return tuple(r for r in self.constraints if r.status == UNKNOWN_RULE)


@dataclass(frozen=True)
class JobPlacement:
    job: ParsedJob
    groups: tuple[GroupPlacement, ...]

    @property
    def problems(self) -> tuple[str, ...]:
        return self.job.problems

    @property
    def unevaluated(self) -> bool:
        """Some rule's text holds a variable or function: Nomad's answer could be anything, a refusal included."""
        return bool(self.job.unsupported) or any(g.rules.unsupported for g in self.groups)


def final_outcome(device_outcomes: Sequence[str], placement: JobPlacement) -> str:
    """The job's outcome from its device blocks and its node-level rules.

    Refused wins; then a text check-job could not evaluate (a variable may hide
    a refusal); then a rule that fails on this node; then a value check-job does
    not know; else placed.
    """
    outcomes = [*device_outcomes, *(g.outcome for g in placement.groups)]
    if placement.problems or REFUSE in outcomes:
        return REFUSE
    if placement.unevaluated or UNKNOWN in device_outcomes:
        return UNKNOWN
    for outcome in (NOT_PLACED, UNKNOWN):
        if outcome in outcomes:
            return outcome
    return PLACE


def _side(target: str, resolved: Resolved) -> str:
    text = resolved.shown(target)
    return f"{text} [{resolved.origin}]" if resolved.origin and target.startswith("${") and resolved.known else text


def check_on_node(placed: Placed, values: NodeValues) -> NodeRuleResult:
    """``meetsConstraint`` / ``matchesAffinity`` for one rule on this node."""
    rule = placed.rule
    if rule.operator in CLUSTER_OPERATORS and not rule.affinity:
        return NodeRuleResult(placed, CLUSTER, "", "", CLUSTER_WHY[rule.operator])
    left, right = values.resolve(rule.attribute), values.resolve(rule.value)
    needed = (left,) if rule.operator in UNARY else (left, right)
    remarks = tuple(dict.fromkeys(r.remark for r in needed if r.remark))
    shown_left, shown_right = _side(rule.attribute, left), _side(rule.value, right)
    unknown = [r for r in needed if not r.known]
    if unknown:
        why = "; ".join(dict.fromkeys(r.why_unknown for r in unknown))
        hints = tuple(dict.fromkeys(h for r in unknown for h in r.hints))
        return NodeRuleResult(placed, UNKNOWN_RULE, shown_left, shown_right, why, remarks, hints)
    outcome = check_string(rule.operator, left.value, right.value)
    reason = "" if outcome.why == "not found" else outcome.why  # a side shown as "not set" says it
    return NodeRuleResult(placed, HOLDS if outcome.holds else FAILS, shown_left, shown_right, reason, remarks)


def evaluate_group(rules: GroupRules, values: NodeValues, job_problems: bool = False) -> GroupPlacement:
    constraints = tuple(check_on_node(p, values) for p in rules.constraints)
    affinities = tuple(check_on_node(p, values) for p in rules.affinities)
    spreads = tuple(SpreadResult(s, values.resolve(s.attribute)) for s in rules.spreads)
    score = None
    if affinities and all(a.status != UNKNOWN_RULE for a in affinities):
        total = sum(abs(a.placed.rule.weight) for a in affinities)
        matched = sum(a.placed.rule.weight for a in affinities if a.status == HOLDS)
        score = matched / total if total else 0.0
    if rules.problems or job_problems:
        outcome = REFUSE
    elif rules.unsupported:
        outcome = UNKNOWN
    elif any(c.status == FAILS for c in constraints):
        outcome = NOT_PLACED
    elif any(c.status == UNKNOWN_RULE for c in constraints):
        outcome = UNKNOWN
    else:
        outcome = PLACE
    return GroupPlacement(rules, constraints, affinities, spreads, outcome, score)


def evaluate_placement(job: ParsedJob, values: NodeValues) -> JobPlacement:
    """Every task group's node-level rules (groups without any are left out)."""
    groups = tuple(evaluate_group(g, values, bool(job.problems)) for g in job.groups if g.has_rules)
    return JobPlacement(job, groups)
