"""A task group's node-level rules decided on this node, with what check-job knows of the node's values.

``resolveTarget`` (``scheduler/feasible/feasible.go``) always finds ``${node.*}``
fields, ``${attr.*}`` and ``${meta.*}`` when present, any other ``${...}`` never.
check-job knows the node from a file or the agent, the plugin's own meta keys
(``model/card.py``: the node's values while ``node_meta = true``) and
``--node-value``; any other value is unknown, never guessed. Constraints are
``ConstraintChecker``; affinities ``NodeAffinityIterator`` (``rank.go``: they
rank, never exclude); ``distinct_hosts``, ``distinct_property`` and spreads
need the job's other allocations, so they are shown, not decided. Whether the node is considered at
all (the job's datacenters and node pool, the group's host volumes) is ``scope.py``'s, decided beside them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from nomad_plugin.jobspec.evaluate import (
    NOT_PLACED,
    OUTCOME_TEXT,
    PARTIAL,
    PLACE,
    REFUSE,
    UNKNOWN,
    RequestVerdict,
    tagged,
)
from nomad_plugin.jobspec.operators import CLUSTER_OPERATORS, check_string
from nomad_plugin.jobspec.parse import NODE_FIELDS, GroupRules, ParsedJob, Placed, Spread
from nomad_plugin.jobspec.scope import ScopeCheck, scope_checks
from nomad_plugin.model.card import SUMMARY_KEYS
from nomad_plugin.nomad_view.types import Style


class NodeFileError(ValueError):
    """A node document that is not Nomad's node JSON."""


@dataclass(frozen=True)
class PluginKeys:
    """The plugin's node meta keys for this inventory, and whether the plugin publishes them."""

    keys: Mapping[str, str]
    prefix: str = "lingjun."
    publishes: bool = False  # node_meta = true
    topology_known: bool = True
    problems: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "node_meta": self.publishes,
            "prefix": self.prefix,
            "keys": dict(self.keys),
            "topology_known": self.topology_known,
            "problems": list(self.problems),
        }

    @classmethod
    def from_json(cls, doc: Any) -> PluginKeys:
        """The ``plugin_keys`` section of a saved fingerprint; NodeFileError when it is not one."""
        if not isinstance(doc, dict):
            raise NodeFileError("plugin_keys is not an object")
        keys, prefix = doc.get("keys"), doc.get("prefix")
        if not isinstance(keys, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in keys.items()):
            raise NodeFileError("plugin_keys.keys is not an object of strings")
        if not isinstance(prefix, str) or not isinstance(doc.get("node_meta"), bool):
            raise NodeFileError("plugin_keys needs a string prefix and a bool node_meta")
        problems = doc.get("problems", [])
        return cls(
            dict(keys),
            prefix,
            bool(doc["node_meta"]),
            doc.get("topology_known") is not False,
            tuple(str(p) for p in problems) if isinstance(problems, list) else (),
        )


@dataclass(frozen=True)
class NodeDocument:
    """This node as Nomad's servers hold it: the fields targets read, attributes and meta."""

    fields: Mapping[str, str]  # target -> value, for NODE_FIELDS
    attributes: Mapping[str, str]
    meta: Mapping[str, str]
    source: str
    host_volumes: Mapping[str, Any] | None = None  # name -> {"Path", "ReadOnly", "ID"}; None: not in the document


def node_from_json(doc: Any, source: str) -> NodeDocument:
    """Nomad's node JSON (``GET /v1/node/<id>``, ``nomad node status -json``); NodeFileError when it is not."""
    if isinstance(doc, list) and len(doc) == 1:
        doc = doc[0]  # `nomad node status -json` without an ID prints a list
    if not isinstance(doc, dict):
        raise NodeFileError(f"{source}: not a Nomad node (a JSON object with ID, Attributes and Meta)")
    if "Attributes" not in doc and "ID" in doc:
        raise NodeFileError(
            f"{source}: a node without Attributes (a node list stub?): save one node, "
            "`nomad node status -self -json` or `nomad node status -json <id>`"
        )
    maps: dict[str, dict[str, str]] = {}
    for key in ("Attributes", "Meta"):
        value = doc.get(key)
        if value is None and key == "Meta":
            value = {}
        if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
            raise NodeFileError(f"{source}: {key} is not an object of strings (is it a Nomad node?)")
        maps[key] = dict(value)
    if not isinstance(doc.get("ID"), str):
        raise NodeFileError(f"{source}: ID is not a string (is it a Nomad node?)")
    fields = {
        target: value if isinstance(value := doc.get(key, ""), str) else "" for target, key in NODE_FIELDS.items()
    }
    volumes = doc.get("HostVolumes")
    volumes = volumes if isinstance(volumes, dict) else {} if "HostVolumes" in doc else None
    return NodeDocument(fields, maps["Attributes"], maps["Meta"], source, volumes)


@dataclass(frozen=True)
class Resolved:
    """One side of a node-level rule: a value (None: Nomad does not find it), or unknown to check-job."""

    value: str | None
    known: bool = True
    origin: str = ""  # where the value comes from, when it is not a literal
    why_unknown: str = ""
    remark: str = ""  # something the author should know (a stale copy, a value about to change)
    hints: tuple[str, ...] = ()  # what would make an unknown value known

    def shown(self, target: str) -> str:
        if not self.known:
            return "unknown"
        if self.value is None:
            return "not set" if target.startswith("${") else repr(target)
        return repr(self.value)


@dataclass(frozen=True)
class NodeValues:
    node: NodeDocument | None = None
    plugin: PluginKeys | None = None
    plugin_why: str = ""  # why the plugin's keys are not known, when they are not
    stated: Mapping[str, str] = field(default_factory=dict)  # "meta.rack" -> "r1" (--node-value)
    node_why: str = ""  # why the node document is not known (the agent did not answer, ...)
    #: A simulated node's own fields (--profile): Nomad's client defaults where nothing else says otherwise.
    simulated: Mapping[str, str] = field(default_factory=dict)

    def describe(self) -> list[str]:
        known = self.node.source if self.node is not None else f"not known ({self.node_why or 'no --node or --agent'})"
        lines = [f"node fields, attributes and meta: {known}"]
        if self.plugin is not None:
            how = (
                "published by the plugin (node_meta = true)"
                if self.plugin.publishes
                else "computed, but not published (node_meta = false)"
            )
            lines.append(f"the plugin's keys ({self.plugin.prefix}*): {how}")
        elif self.plugin_why:
            lines.append(f"the plugin's keys: unknown ({self.plugin_why})")
        if self.stated:
            lines.append("stated with --node-value: " + ", ".join(f"{k}={v!r}" for k, v in sorted(self.stated.items())))
        if self.simulated and self.node is None:
            shown = ", ".join(f"{k}={v!r}" for k, v in sorted(self.simulated.items()) if k not in self.stated)
            lines.append(f"the simulated node: {shown} (a Nomad client's defaults; --node-value to change)")
        return lines

    def resolve(self, target: str) -> Resolved:
        """``resolveTarget`` with what check-job knows."""
        if not target.startswith("${"):
            return Resolved(target)
        body = target[2:].removesuffix("}")
        if body in self.stated:
            return Resolved(self.stated[body], origin="--node-value")
        if target in NODE_FIELDS:
            if self.node is not None:
                return Resolved(self.node.fields[target], origin=self.node.source)
            if body in self.simulated:
                return Resolved(self.simulated[body], origin="the simulated node")
            return self._unknown(body, "this node's fields are not known")
        if body.startswith("attr."):
            if self.node is not None:
                return Resolved(self.node.attributes.get(body.removeprefix("attr.")), origin=self.node.source)
            return self._unknown(body, "this node's attributes are not known")
        if body.startswith("meta."):
            return self._meta(body.removeprefix("meta."))
        return Resolved(None, origin="Nomad resolves it to nothing outside a device block")

    def _unknown(self, key: str, why: str, publish: bool = False) -> Resolved:
        if self.node_why and not publish:
            why += f" ({self.node_why})"
        kind = "meta.<key>" if key.startswith("meta.") else "attr.<key>" if key.startswith("attr.") else key
        hints = (
            *(("--set node_meta=true (as if the plugin published its keys)",) if publish else ()),
            "--node FILE (`nomad node status -self -json > FILE` on this node) or --agent",
            f"--node-value {kind}=VALUE",
        )
        return Resolved(None, known=False, why_unknown=why, hints=hints)

    def _meta(self, key: str) -> Resolved:
        plugin, node = self.plugin, self.node
        on_node = node.meta.get(key) if node is not None else None
        mine = plugin is not None and key.startswith(plugin.prefix)
        if plugin is not None and mine:
            computed = plugin.keys.get(key)
            summary = key[len(plugin.prefix) :] in SUMMARY_KEYS
            if plugin.publishes and (computed is not None or plugin.topology_known or summary):
                remark = ""
                if node is not None and on_node != computed:
                    now = "not set" if on_node is None else repr(on_node)
                    change = "unsets it" if computed is None else f"publishes {computed!r}"
                    remark = f"the node has {now} now; the plugin {change}, which Nomad sees within about 10 s"
                return Resolved(computed, origin="the plugin publishes it", remark=remark)
            if node is not None:
                remark = ""
                if not plugin.publishes and on_node != computed:
                    remark = (
                        f"the plugin computes {'no value' if computed is None else repr(computed)} for it; with "
                        "node_meta = false the node's static meta holds what `node-meta` printed when it was copied"
                    )
                return Resolved(on_node, origin=node.source, remark=remark)
            if not plugin.publishes:
                value = "no value" if computed is None else repr(computed)
                return self._unknown(
                    f"meta.{key}",
                    f"the plugin computes {value} for it but publishes it only with node_meta = true",
                    publish=True,
                )
            return self._unknown(f"meta.{key}", "XDM has not reported the topology yet (no card carries one)")
        if node is not None:
            return Resolved(on_node, origin=node.source)
        why = "this node's meta is not known"
        if plugin is None and self.plugin_why:
            why += f"; nor are the plugin's keys: {self.plugin_why}"
        return self._unknown(f"meta.{key}", why)


# --- the rules on this node -------------------------------------------------------------------


HOLDS, FAILS, UNKNOWN_RULE, CLUSTER = "holds", "fails", "unknown", "cluster"
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

    def sides(self) -> str:
        rule = self.placed.rule
        text = self.left if rule.unary else f"{self.left} {rule.operator} {self.right}"
        return text + (f" ({self.reason})" if self.reason else "")

    def describe(self) -> str:
        rule = self.placed.rule
        head = f"distinct_hosts = {rule.value!r}" if rule.operator == "distinct_hosts" else rule.head()
        return f"{head}: {self.reason if self.status in (CLUSTER, UNKNOWN_RULE) else self.sides()}"


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
    scope: tuple[ScopeCheck, ...] = ()  # the job's datacenters and node pool, the group's host volumes

    @property
    def failed(self) -> tuple[NodeRuleResult, ...]:
        return tuple(r for r in self.constraints if r.status == FAILS)

    def scope_with(self, status: str) -> tuple[ScopeCheck, ...]:
        return tuple(c for c in self.scope if c.status == status)

    @property
    def unknown(self) -> tuple[NodeRuleResult, ...]:
        return tuple(r for r in self.constraints if r.status == UNKNOWN_RULE)


@dataclass(frozen=True)
class JobPlacement:
    job: ParsedJob
    groups: tuple[GroupPlacement, ...]


@dataclass(frozen=True)
class GroupOutcome:
    """One task group on this node: its node-level rules and its device blocks together."""

    group: str
    outcome: str
    why: tuple[str, ...] = ()  # what decides it: the rules that fail, or what is not known


SYSTEM_TYPES = ("system", "sysbatch")


def group_outcomes(verdicts: Sequence[RequestVerdict], placement: JobPlacement) -> list[GroupOutcome]:
    """Each task group's outcome on this node.

    A rule that was evaluated and fails decides ``NOT_PLACED`` even beside a value check-job cannot
    evaluate: whatever that value is, Nomad either refuses the job or does not place the group here.
    """
    decided = {g.rules.group: g for g in placement.groups}
    out = []
    for rules in placement.job.groups:
        rules_here = decided.get(rules.group)
        blocks = [v for v in verdicts if v.request.group == rules.group]
        failed = [failures(rules_here)] if rules_here is not None and failures(rules_here) else []
        failed += [
            f'task "{v.request.task}" device "{v.request.name}": no device group on this node serves it'
            for v in blocks
            if v.outcome == NOT_PLACED
        ]
        unknown = [f"{r.placed.rule.head()}: {r.reason}" for r in rules_here.unknown] if rules_here is not None else []
        unknown += [c.describe() for c in rules_here.scope_with(UNKNOWN_RULE)] if rules_here is not None else []
        unknown += [*rules.unsupported, *(u for v in blocks for u in v.request.unsupported)]
        outcomes = {rules_here.outcome if rules_here is not None else PLACE, *(v.outcome for v in blocks)}
        if REFUSE in outcomes or placement.job.problems:
            out.append(GroupOutcome(rules.group, REFUSE))
        elif failed:
            out.append(GroupOutcome(rules.group, NOT_PLACED, tuple(failed)))
        elif UNKNOWN in outcomes or unknown:
            out.append(GroupOutcome(rules.group, UNKNOWN, tuple(unknown)))
        else:
            out.append(GroupOutcome(rules.group, PLACE))
    return out


def final_outcome(groups: Sequence[GroupOutcome], job: ParsedJob) -> str:
    """The job's outcome on this node from its groups', as each scheduler places groups.

    A service or batch job's groups are placed independently, each on the feasible node that ranks
    best (``GenericScheduler.computePlacements``, ``scheduler/generic_sched.go``): the whole job lands
    on this node only when every group may. A system or sysbatch job runs each group on every node
    where that group is feasible; a node its rules filter out is skipped, not reported
    (``SystemScheduler.computePlacements``, ``scheduler/scheduler_system.go``): the job runs here when
    one group does. A value check-job cannot evaluate leaves the answer open unless what was
    evaluated already decides it.
    """
    outcomes = [g.outcome for g in groups]
    if job.problems or REFUSE in outcomes:
        return REFUSE
    unknown = bool(job.unsupported) or UNKNOWN in outcomes
    if outcomes and all(o == NOT_PLACED for o in outcomes):
        return NOT_PLACED
    if not job.type_known:
        return UNKNOWN
    if job.type in SYSTEM_TYPES:
        return UNKNOWN if unknown else PLACE
    if NOT_PLACED in outcomes:
        return NOT_PLACED if unknown else PARTIAL
    return UNKNOWN if unknown else PLACE


def _side(target: str, resolved: Resolved) -> str:
    text = resolved.shown(target)
    return f"{text} [{resolved.origin}]" if resolved.origin and target.startswith("${") and resolved.known else text


def check_on_node(placed: Placed, values: NodeValues) -> NodeRuleResult:
    """``meetsConstraint`` / ``matchesAffinity`` for one rule on this node."""
    rule = placed.rule
    if rule.operator in CLUSTER_OPERATORS and not rule.affinity:
        return NodeRuleResult(placed, CLUSTER, "", "", CLUSTER_WHY[rule.operator])
    left, right = values.resolve(rule.attribute), values.resolve(rule.value)
    needed = (left,) if rule.unary else (left, right)
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


def place_group(
    rules: GroupRules, values: NodeValues, job_problems: bool = False, scope: tuple[ScopeCheck, ...] = ()
) -> GroupPlacement:
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
    elif FAILS in (statuses := {c.status for c in constraints} | {c.status for c in scope}):
        outcome = NOT_PLACED
    elif rules.unsupported or UNKNOWN_RULE in statuses:
        outcome = UNKNOWN
    else:
        outcome = PLACE
    return GroupPlacement(rules, constraints, affinities, spreads, outcome, score, scope)


def evaluate_placement(job: ParsedJob, values: NodeValues) -> JobPlacement:
    """Every task group's node-level rules and scope (``scope.py``); groups with no rule, and a scope that
    holds whatever the node, are left out."""
    volumes = values.node.host_volumes if values.node is not None else None
    scopes = {g.group: scope_checks(job, g.group, values.resolve, volumes) for g in job.groups}
    groups = tuple(
        place_group(g, values, bool(job.problems), scopes[g.group])
        for g in job.groups
        if g.has_rules or scopes[g.group]
    )
    return JobPlacement(job, groups)


# --- output ------------------------------------------------------------------------------------


_LABEL = {
    HOLDS: ("holds", "green"),
    FAILS: ("FAILS", "red"),
    UNKNOWN_RULE: ("UNKNOWN", "yellow"),
    CLUSTER: ("CLUSTER", "cyan"),
}
_AFFINITY_LABEL = {**_LABEL, HOLDS: ("matches", "green"), FAILS: ("no match", "yellow")}


def _level(result: NodeRuleResult, group: str) -> str:
    level = result.placed.level
    if level == "job":
        return "job "
    if level == f'group "{group}"':
        return ""
    return level.removeprefix(f'group "{group}" ') + " "


def _node_rule_json(r: NodeRuleResult) -> dict[str, Any]:
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


def _group_placement_json(g: GroupPlacement) -> dict[str, Any]:
    return {
        "job": g.rules.job,
        "group": g.rules.group,
        "outcome": g.outcome,
        "verdict": OUTCOME_TEXT[g.outcome],
        "problems": list(g.rules.problems),
        "unsupported": list(g.rules.unsupported),
        "constraints": [_node_rule_json(r) for r in g.constraints],
        "affinities": [_node_rule_json(r) for r in g.affinities],
        "affinity_score": g.score,
        "scope": [{"check": c.what, "status": c.status, "detail": c.detail} for c in g.scope],
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
        "problems": list(placement.job.problems),
        "unsupported": list(placement.job.unsupported),
        "node": {
            "sources": values.describe(),
            "plugin_keys": values.plugin.to_json() if values.plugin is not None else None,
        },
        "groups": [_group_placement_json(g) for g in placement.groups],
    }


def _line(style: Style, label: str, colour: str, text: str) -> str:
    return "  " + style(f"{label:<8}", colour, "bold") + " " + text


def placement_text(placement: JobPlacement, values: NodeValues, style: Style) -> list[str]:
    if not placement.groups and not placement.job.problems and not placement.job.unsupported:
        return []
    lines = [style("node-level rules (job, group and task constraint, affinity, spread) on this node", "bold")]
    lines += [f"  {line}" for line in values.describe()]
    lines += tagged(style, "INVALID ", placement.job.problems, "red", "bold")
    lines += tagged(style, "CANNOT EVALUATE ", placement.job.unsupported, "yellow", "bold")
    lines.append("")
    for g in placement.groups:
        lines.append(style(f'job "{g.rules.job}" group "{g.rules.group}"', "bold"))
        lines += tagged(style, "INVALID ", g.rules.problems, "red", "bold")
        lines += tagged(style, "CANNOT EVALUATE ", g.rules.unsupported, "yellow", "bold")
        remarks: list[str] = []
        for c in g.scope:
            label, colour = _LABEL[c.status]
            lines.append(_line(style, label, colour, f"job {c.describe()}" if "volume" not in c.what else c.describe()))
        for r in (*g.constraints, *g.affinities):
            kind = "affinity" if r.placed.rule.affinity else "constraint"
            weight = f" (weight {r.placed.rule.weight})" if r.placed.rule.affinity else ""
            where = _level(r, g.rules.group)
            label, colour = (_AFFINITY_LABEL if r.placed.rule.affinity else _LABEL)[r.status]
            lines.append(_line(style, label, colour, f"{where}{kind}{weight} {r.describe()}"))
            remarks += [*r.remarks, *([r.placed.rule.note] if r.placed.rule.note else [])]
        for s in g.spreads:
            where = "job " if s.spread.level == "job" else ""
            lines.append(_line(style, "CLUSTER", "cyan", f"{where}{s.describe()}"))
        if g.affinities:
            score = "unknown (an affinity's value is unknown)" if g.score is None else f"{g.score:+.2f}"
            lines.append(f"  node-affinity score {score}: Nomad ranks nodes by it, it never keeps the group off a node")
        lines += tagged(style, "NOTE ", dict.fromkeys(remarks), "cyan")
        if g.outcome == NOT_PLACED:
            lines.append("  " + style("NOT PLACED ", "red", "bold") + OUTCOME_TEXT[NOT_PLACED] + ": " + failures(g))
        elif g.outcome == REFUSE and g.rules.problems:
            lines.append("  " + style("REFUSED ", "red", "bold") + OUTCOME_TEXT[REFUSE] + " (INVALID above)")
        elif g.outcome == UNKNOWN and (found := hints(g)):
            lines.append(
                "  " + style("UNKNOWN ", "yellow", "bold") + OUTCOME_TEXT[UNKNOWN] + "; to know: " + ", or ".join(found)
            )
        lines.append("")
    return lines


def failures(g: GroupPlacement) -> str:
    scope = [
        f"{c.what}, not {c.detail.removeprefix('this node is in ')}"
        for c in g.scope_with(FAILS)
        if "volume" not in c.what
    ]
    scope += [f"{c.describe()}" for c in g.scope_with(FAILS) if "volume" in c.what]
    return "; ".join([*scope, *(f"constraint {r.placed.rule.head()} fails: {r.sides()}" for r in g.failed)])


def hints(g: GroupPlacement) -> dict[str, None]:
    """What would make the group's unknown rules and scope known."""
    scope = (h for c in g.scope_with(UNKNOWN_RULE) for h in c.hints)
    return dict.fromkeys([*scope, *(h for r in g.unknown for h in r.hints)])


def verdict_detail(placement: JobPlacement, groups: Sequence[GroupOutcome], outcome: str) -> str:
    """What the verdict line adds: where each group stands, what fails, what is not known, what needs a cluster."""
    several = len(groups) > 1
    if outcome in (NOT_PLACED, PARTIAL) or (outcome == PLACE and several and placement.job.type in SYSTEM_TYPES):
        here = [f'group "{g.group}"' for g in groups if g.outcome == PLACE]
        if outcome == NOT_PLACED or not here:
            return "; ".join(f'group "{g.rules.group}" {failures(g)}' for g in placement.groups if failures(g))
        not_here = [f'group "{g.group}" ({"; ".join(g.why)})' for g in groups if g.outcome == NOT_PLACED]
        if outcome == PARTIAL:
            return (
                f"{', '.join(here)} here, not {'; '.join(not_here)}: Nomad places a {placement.job.type} job's groups "
                "independently, each on a node where its rules hold"
            )
        if not_here:
            return (
                f"{', '.join(here)} on this node, not {'; '.join(not_here)}: a {placement.job.type} job runs each "
                "group on every node where its rules hold"
            )
    if outcome == UNKNOWN:
        named = [f'group "{g.group}" {", ".join(g.why)}' for g in groups if g.outcome == UNKNOWN and g.why]
        named += list(placement.job.unsupported)
        found = dict.fromkeys(h for g in placement.groups for h in hints(g))
        hint = f"; to know: {', or '.join(found)}" if found else ""
        return f"{'; '.join(named)} cannot be decided here{hint}" if named else ""
    # The kinds of rule that need the cluster: spread, distinct_hosts, distinct_property.
    kinds = sorted(
        {"spread" for g in placement.groups if g.spreads}
        | {r.placed.rule.operator for g in placement.groups for r in g.constraints if r.status == CLUSTER}
    )
    if outcome == PLACE and kinds:
        return (
            f"on this node ({' and '.join(kinds)} {'needs' if len(kinds) == 1 else 'need'} the cluster: not evaluated)"
        )
    return ""


def groups_text(groups: Sequence[GroupOutcome], style: Style) -> list[str]:
    """One line per task group when the job has several: where each stands on this node."""
    if len(groups) < 2:
        return []
    lines = [style("task groups on this node", "bold")]
    for g in groups:
        label, colour = _GROUP_LABEL[g.outcome]
        lines.append(_line(style, label, colour, f'group "{g.group}"' + (f": {'; '.join(g.why)}" if g.why else "")))
    return [*lines, ""]


_GROUP_LABEL = {
    PLACE: ("placed", "green"), NOT_PLACED: ("NOT HERE", "red"), UNKNOWN: ("UNKNOWN", "yellow"), REFUSE: ("REFUSED", "red"),
}  # fmt: skip


def groups_json(groups: Sequence[GroupOutcome]) -> list[dict[str, Any]]:
    return [
        {"group": g.group, "outcome": g.outcome, "verdict": OUTCOME_TEXT[g.outcome], "why": list(g.why)} for g in groups
    ]
