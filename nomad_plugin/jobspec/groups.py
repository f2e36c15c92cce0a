"""The node-level placement rules of a job: its job-, group- and task-level ``constraint``, ``affinity`` and ``spread``.

Nomad evaluates these on the node (its attributes, meta and a few fields),
never on devices. Which apply to a task group is the scheduler's
(``scheduler/feasible/stack.go``): the job's constraints
(``SetJob``), then the group's and every task's (``TaskGroupConstraints``);
the job's, the group's and every task's affinities
(``NodeAffinityIterator.SetTaskGroup`` in ``rank.go``); the job's and the
group's spreads.

Decoding is ``jobspec.parse``'s (the same block decoders serve every level,
``jobspec2/hcl_conversions.go``); a spread is a plain HCL block of
``attribute``, ``weight`` (an int8; absent is 50, ``api.Spread.Canonicalize``)
and ``target "<value>" { percent }`` (a uint8). Job validation is
``nomad/structs/structs.go``: ``Job.Validate``, ``TaskGroup.Validate`` and
``Task.Validate`` validate each constraint, affinity and spread
(``Constraint.Validate``, ``Affinity.Validate``, ``Spread.Validate``); a task
may not hold ``distinct_hosts`` or ``distinct_property``; a system job may
not hold an affinity or a spread at any level.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nomad_plugin.jobspec.parse import (
    DeviceRequest,
    Rule,
    ValueProblem,
    decode_rule,
    device_requests,
    dicts,
    is_json,
    json_device_requests,
    json_rule,
    json_text,
    json_type,
    json_weight,
    load_hcl,
    load_json_job,
    number_value,
    quoted,
    string_value,
    unknown_keys,
    validate_affinity,
    validate_constraint,
)
from nomad_plugin.util.hclvalue import is_expression, labelled, plain, unlabelled

DEFAULT_SPREAD_WEIGHT = 50
SPREAD_KEYS = frozenset({"attribute", "weight", "target"})
TARGET_KEYS = frozenset({"percent"})
CLUSTER_OPERATORS = ("distinct_hosts", "distinct_property")
SYSTEM = "system"


@dataclass(frozen=True)
class Placed:
    """A rule with where the job says it: ``job``, ``group "g"`` or ``task "t"``."""

    rule: Rule
    level: str


@dataclass(frozen=True)
class Spread:
    attribute: str
    weight: int
    targets: tuple[tuple[str, int], ...]
    level: str

    def text(self) -> str:
        targets = ", ".join(f"{value} {percent}%" for value, percent in self.targets)
        return f"{self.attribute} (weight {self.weight}" + (f"; targets {targets})" if targets else ")")


@dataclass(frozen=True)
class GroupRules:
    """What Nomad checks on the node for one task group."""

    job: str
    group: str
    constraints: tuple[Placed, ...] = ()
    affinities: tuple[Placed, ...] = ()
    spreads: tuple[Spread, ...] = ()
    problems: tuple[str, ...] = ()  # Nomad refuses the job (decoding, validation)
    unsupported: tuple[str, ...] = ()  # check-job cannot evaluate them (variables, functions)

    @property
    def has_rules(self) -> bool:
        return bool(self.constraints or self.affinities or self.spreads or self.problems or self.unsupported)


@dataclass(frozen=True)
class ParsedJob:
    name: str
    type: str
    requests: list[DeviceRequest]
    groups: list[GroupRules]
    problems: tuple[str, ...] = field(default=())  # the job level's own (Nomad refuses the job)
    unsupported: tuple[str, ...] = field(default=())


@dataclass
class _Level:
    """One level's decoded rules and what went wrong decoding them."""

    where: str
    constraints: list[Rule] = field(default_factory=list)
    affinities: list[Rule] = field(default_factory=list)
    spreads: list[Spread] = field(default_factory=list)
    has_affinities: bool = False  # Nomad's non-nil slice (a system job may hold none)
    problems: list[str] = field(default_factory=list)
    unsupported: list[str] = field(default_factory=list)


# --- HCL -------------------------------------------------------------------------------------


def _int_value(raw: Any, key: str, low: int, high: int) -> int:
    """gohcl's conversion of a number into a Go integer field (``int8``, ``uint8``)."""
    number = number_value(raw, key)
    if number != number.to_integral_value() or not low <= number <= high:
        bounds = f"between {low} and {high}" + (" inclusive" if low == 0 else "")
        raise ValueProblem(f"{key} = {raw}: Unsuitable value: value must be a whole number, {bounds}")
    return int(number)


def _hcl_spread(body: dict[str, Any], level: _Level) -> None:
    level.problems.extend(unknown_keys(body, SPREAD_KEYS, "spread block"))
    try:
        attribute = string_value(body.get("attribute"), "attribute")
        weight = DEFAULT_SPREAD_WEIGHT
        if body.get("weight") is not None:
            weight = _int_value(body["weight"], "weight", -128, 127)
        targets = []
        if "target" in body and not isinstance(body["target"], list):
            level.problems.append(
                'spread block: Unsupported argument; an argument named "target" is not expected here. '
                'Did you mean to define a block of type "target"?'
            )
        for item in body.get("target", []) if isinstance(body.get("target"), list) else []:
            if not isinstance(item, dict):
                continue
            if "__is_block__" in item:  # python-hcl2's form of a block without a label
                level.problems.append(
                    "target block: Missing name for target; All target blocks must have 1 labels (name)."
                )
                continue
            for label, target in labelled([item]):
                level.problems.extend(unknown_keys(target, TARGET_KEYS, f'target "{label}"'))
                percent = 0 if target.get("percent") is None else _int_value(target["percent"], "percent", 0, 255)
                targets.append((str(label), percent))
    except ValueProblem as exc:
        (level.unsupported if exc.unsupported else level.problems).append(f"spread block: {exc}")
        return
    level.spreads.append(Spread(attribute, weight, tuple(targets), level.where))


def _hcl_level(body: dict[str, Any], where: str, spreads: bool) -> _Level:
    level = _Level(where)
    for block in unlabelled(body.get("constraint", [])):
        rule = decode_rule(block, False, level.problems, level.unsupported)
        if rule is not None:
            level.constraints.append(rule)
    for block in unlabelled(body.get("affinity", [])):
        level.has_affinities = True
        rule = decode_rule(block, True, level.problems, level.unsupported)
        if rule is not None:
            level.affinities.append(rule)
    if spreads:
        for block in unlabelled(body.get("spread", [])):
            _hcl_spread(block, level)
    elif "spread" in body:  # a task has no spread (api.Task): gohcl refuses the block
        level.problems.append('Unsupported block type; Blocks of type "spread" are not expected here.')
    return level


def _hcl_type(job: dict[str, Any]) -> tuple[str, list[str], list[str]]:
    raw = job.get("type")
    if raw is None:
        return "service", [], []
    if isinstance(raw, str) and is_expression(raw):
        return "service", [], [f"type = {raw}: check-job does not evaluate variables or functions"]
    value = plain(raw)
    if not isinstance(value, str):
        return "service", [f"type: Incorrect attribute value type; a string is required, not {value!r}"], []
    return value, [], []


def _hcl_job(parsed: dict[str, Any]) -> ParsedJob:
    requests = device_requests(parsed)
    ((name, job), *_) = labelled(parsed.get("job", []))
    job_type, problems, unsupported = _hcl_type(job)
    top = _hcl_level(job, "job", spreads=True)
    groups = []
    for group_name, group in labelled(job.get("group", [])):
        levels = [_hcl_level(group, f'group "{group_name}"', spreads=True)]
        for task_name, task in labelled(group.get("task", [])):
            levels.append(_hcl_level(task, f'group "{group_name}" task "{task_name}"', spreads=False))
        groups.append(_group(name, group_name, job_type, top, levels))
    return ParsedJob(
        name, job_type, requests, groups, (*problems, *_validate(top, job_type)), (*unsupported, *top.unsupported)
    )


# --- JSON ------------------------------------------------------------------------------------


def _json_spread(raw: dict[str, Any], level: _Level) -> None:
    problems = level.problems
    attribute = json_text(raw.get("Attribute"), "Attribute", problems)
    weight = DEFAULT_SPREAD_WEIGHT if raw.get("Weight") is None else json_weight(raw.get("Weight"), problems)
    targets = []
    for target in dicts(raw.get("SpreadTarget")):
        percent = target.get("Percent", 0)
        if percent is None:
            percent = 0
        if isinstance(percent, bool) or not isinstance(percent, int) or not 0 <= percent <= 255:
            problems.append(f"Percent: json: cannot unmarshal {json_type(percent)} into a uint8 field")
            percent = 0
        targets.append((json_text(target.get("Value"), "Value", problems), percent))
    level.spreads.append(Spread(attribute, weight, tuple(targets), level.where))


def _json_level(raw: dict[str, Any], where: str, spreads: bool) -> _Level:
    level = _Level(where)
    level.constraints = [json_rule(c, False, level.problems) for c in dicts(raw.get("Constraints"))]
    level.affinities = [json_rule(a, True, level.problems) for a in dicts(raw.get("Affinities"))]
    level.has_affinities = isinstance(raw.get("Affinities"), list)  # [] is a non-nil slice in Go
    if spreads:
        for spread in dicts(raw.get("Spreads")):
            _json_spread(spread, level)
    return level


def _json_job(job: dict[str, Any]) -> ParsedJob:
    requests = json_device_requests(job)
    name = str(job.get("Name") or job.get("ID") or "")
    problems: list[str] = []
    job_type = json_text(job.get("Type"), "Type", problems) or "service"
    top = _json_level(job, "job", spreads=True)
    groups = []
    for group in dicts(job.get("TaskGroups")):
        group_name = group["Name"] if isinstance(group.get("Name"), str) else ""
        levels = [_json_level(group, f'group "{group_name}"', spreads=True)]
        for task in dicts(group.get("Tasks")):
            task_name = task["Name"] if isinstance(task.get("Name"), str) else ""
            levels.append(_json_level(task, f'group "{group_name}" task "{task_name}"', spreads=False))
        groups.append(_group(name, group_name, job_type, top, levels))
    return ParsedJob(name, job_type, requests, groups, (*problems, *_validate(top, job_type)), tuple(top.unsupported))


# --- both ------------------------------------------------------------------------------------


def _validate(level: _Level, job_type: str, task: bool = False) -> list[str]:
    """Nomad's errors for one level's rules, in its words, prefixed with the level."""
    errors = list(level.problems)
    for index, rule in enumerate(level.constraints, start=1):
        errors += [f"Constraint {index} validation failed: {e}" for e in validate_constraint(rule)]
        if task and rule.operator in CLUSTER_OPERATORS:
            errors.append(f"Constraint {index} has disallowed Operand at task level: {rule.operator}")
    if job_type == SYSTEM:
        if level.has_affinities:
            errors.append("System jobs may not have an affinity block")
        if level.spreads:
            errors.append("System jobs may not have a spread block")
    else:
        for index, rule in enumerate(level.affinities, start=1):
            errors += [f"Affinity {index} validation failed: {e}" for e in validate_affinity(rule)]
        for index, spread in enumerate(level.spreads, start=1):
            errors += [f"Spread {index} validation failed: {e}" for e in validate_spread(spread)]
    return [f"{level.where}: {e}" for e in errors]


def _group(job: str, name: str, job_type: str, top: _Level, levels: list[_Level]) -> GroupRules:
    problems: list[str] = []
    unsupported: list[str] = []
    for index, level in enumerate(levels):
        problems += _validate(level, job_type, task=index > 0)
        unsupported += [f"{level.where}: {u}" for u in level.unsupported]
    everything = [top, *levels]
    return GroupRules(
        job,
        name,
        tuple(Placed(r, level.where) for level in everything for r in level.constraints),
        tuple(Placed(r, level.where) for level in everything for r in level.affinities),
        tuple(s for level in (top, levels[0]) for s in level.spreads),
        tuple(problems),
        tuple(unsupported),
    )


def validate_spread(spread: Spread) -> list[str]:
    """``Spread.Validate``."""
    errors = []
    if spread.attribute == "":
        errors.append("Missing spread attribute")
    if spread.weight <= 0 or spread.weight > 100:
        errors.append("Spread block must have a positive weight from 0 to 100")
    seen: set[str] = set()
    total = 0
    for value, percent in spread.targets:
        if value in seen:
            errors.append(f"Spread target value {quoted(value)} already defined")
        seen.add(value)
        if percent > 100:
            errors.append(f"Spread target percentage for value {quoted(value)} must be between 0 and 100")
        total += percent
    if total > 100:
        errors.append(f"Sum of spread target percentages must not be greater than 100%; got {total}%")
    return errors


def parse_job(text: str, source: str = "job") -> ParsedJob:
    """A job file (HCL2, or JSON as ``nomad job run -output`` prints it): device blocks and node-level rules."""
    if is_json(text):
        return _json_job(load_json_job(text, source))
    return _hcl_job(load_hcl(text, source))
