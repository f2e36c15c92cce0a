"""A Nomad job file (HCL2 or the JSON ``nomad job run -output`` prints), decoded and validated as Nomad does.

Decoding is ``jobspec2/hcl_conversions.go`` and gohcl for HCL (a constraint's
``set_contains_all``, ``set_contains_any``, ``is_set`` and ``is_not_set`` keys
are accepted, then dropped), the API structs for JSON. Validation is
``nomad/structs/structs.go`` and ``nomad/structs/constraint.go``, in Nomad's
words. The node-level rules of a task group are ``scheduler/feasible/stack.go``'s:
the job's, the group's and every task's constraints and affinities, the job's
and the group's spreads.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

import hcl2

from nomad_plugin.jobspec import golang
from nomad_plugin.jobspec.operators import CLUSTER_OPERATORS, EQUAL, NOT_EQUAL, ORDER, SET_ALL
from nomad_plugin.util.hcl import describe_hcl_error, is_expression, is_meta, labelled, plain, unlabelled

DEFAULT_AFFINITY_WEIGHT = 50
DEFAULT_SPREAD_WEIGHT = 50  # api.Spread.Canonicalize
# The keys that set the operator, in the order Nomad's decoder applies them: a later one wins.
_CONSTRAINT_SUGAR = ("version", "semver", "regexp", "set_contains")
_AFFINITY_SUGAR = ("version", "semver", "regexp", "set_contains_any", "set_contains_all", "set_contains")
DROPPED_CONSTRAINT_KEYS = ("set_contains_all", "set_contains_any", "is_set", "is_not_set")
_BASE_KEYS = ("attribute", "operator", "value")
CONSTRAINT_KEYS = frozenset(
    {*_BASE_KEYS, *_CONSTRAINT_SUGAR, "distinct_hosts", "distinct_property", *DROPPED_CONSTRAINT_KEYS}
)
AFFINITY_KEYS = frozenset({*_BASE_KEYS, *_AFFINITY_SUGAR, "weight"})
DEVICE_KEYS = frozenset({"count", "constraint", "affinity"})
SPREAD_KEYS = frozenset({"attribute", "weight", "target"})
_HCL_NUMBER = re.compile(r"\$\{\s*(-?[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)\s*\}")  # python-hcl2 leaves 1e3 so
UINT64_MAX = 2**64 - 1
#: ``${node.<field>}`` targets Nomad resolves, and the node JSON field each reads.
NODE_FIELDS = {
    "${node.unique.id}": "ID",
    "${node.datacenter}": "Datacenter",
    "${node.unique.name}": "Name",
    "${node.class}": "NodeClass",
    "${node.pool}": "NodePool",
}


class JobParseError(ValueError):
    """The job file cannot be read as HCL or JSON, or has no job."""


class ValueProblem(ValueError):
    """A value Nomad's decoder refuses (or one check-job cannot evaluate, when ``unsupported``)."""

    def __init__(self, message: str, unsupported: bool = False) -> None:
        super().__init__(message)
        self.unsupported = unsupported


@dataclass(frozen=True)
class Rule:
    """A constraint or affinity: ``attribute <operator> value`` (Nomad's LTarget/Operand/RTarget)."""

    attribute: str
    operator: str
    value: str
    weight: int = 0
    affinity: bool = False
    note: str = ""  # what the decoder did that the author may not expect (a dropped key, a wrapped weight)

    @property
    def unary(self) -> bool:
        return self.operator in ("is_set", "is_not_set")

    def head(self) -> str:
        return f"{self.attribute} {self.operator}" + ("" if self.unary else f" {self.value!r}")


@dataclass(frozen=True)
class DeviceRequest:
    job: str
    group: str
    task: str
    name: str
    count: int
    constraints: tuple[Rule, ...] = ()
    affinities: tuple[Rule, ...] = ()
    problems: tuple[str, ...] = field(default=())  # decode errors: Nomad refuses the job file
    unsupported: tuple[str, ...] = field(default=())  # what check-job cannot evaluate (variables, functions)

    @property
    def where(self) -> str:
        return f'group "{self.group}" task "{self.task}" device "{self.name}"'


# --- HCL values ---------------------------------------------------------------------------------


def _number(value: Any) -> Decimal | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, float):
        return Decimal(repr(value))
    match = _HCL_NUMBER.fullmatch(value) if isinstance(value, str) else None
    return Decimal(match.group(1)) if match else None


def _number_text(number: Decimal) -> str:
    """cty's number-to-string conversion: plain decimal digits, no exponent, no trailing zeros."""
    text = format(number.normalize(), "f")
    return "0" if text in ("-0", "0") else text


def _unevaluated(raw: Any, key: str) -> None:
    if isinstance(raw, str) and is_expression(raw):
        raise ValueProblem(f"{key} = {raw}: check-job does not evaluate variables or functions", unsupported=True)


def string_value(raw: Any, key: str) -> str:
    """A value decoded into a string attribute, as HCL converts it (null is "")."""
    if raw is None:
        return ""
    if isinstance(raw, bool):
        return "true" if raw else "false"
    number = _number(raw)
    if number is not None:
        return _number_text(number)
    _unevaluated(raw, key)
    if isinstance(raw, str):
        return str(plain(raw))
    kind = "a list" if isinstance(raw, list) else "an object" if isinstance(raw, dict) else type(raw).__name__
    raise ValueProblem(f"{key}: Incorrect attribute value type; a string is required, not {kind}")


def number_value(raw: Any, key: str) -> Decimal:
    """A value decoded into a number attribute (a numeric string converts, as HCL does)."""
    number = _number(raw)
    if number is None and isinstance(raw, str):
        _unevaluated(raw, key)
        try:
            number = Decimal(str(plain(raw)).strip())
        except InvalidOperation:
            number = None
        if number is not None and not number.is_finite():
            number = None
    if number is None:
        raise ValueProblem(f"{key} = {plain(raw)!r}: Unsuitable value type; a number is required")
    return number


def _bool_value(raw: Any, key: str) -> bool:
    if isinstance(raw, bool):
        return raw
    _unevaluated(raw, key)
    if isinstance(raw, str) and plain(raw) in ("true", "false"):
        return bool(plain(raw) == "true")
    raise ValueProblem(f"{key} = {plain(raw)!r}: Unsuitable value type; a bool is required")


def _int_value(raw: Any, key: str, low: int, high: int) -> int:
    """gohcl's conversion of a number into a Go integer field (``int8``, ``uint8``)."""
    number = number_value(raw, key)
    if number != number.to_integral_value() or not low <= number <= high:
        bounds = f"between {low} and {high}" + (" inclusive" if low == 0 else "")
        raise ValueProblem(f"{key} = {raw}: Unsuitable value: value must be a whole number, {bounds}")
    return int(number)


def unknown_keys(body: dict[str, Any], allowed: frozenset[str], where: str) -> list[str]:
    """Nomad's HCL decoder error for each key the block's schema lacks, with its suggestion."""
    problems = []
    for key in body:
        if is_meta(key) or key in allowed:
            continue
        close = difflib.get_close_matches(str(key), sorted(allowed), n=1, cutoff=0.6)
        hint = f' Did you mean "{close[0]}"?' if close else f" Allowed: {', '.join(sorted(allowed))}."
        problems.append(f'{where}: Unsupported argument; an argument named "{key}" is not expected here.{hint}')
    return problems


def int8_weight(number: Decimal) -> tuple[int, str]:
    """The weight Nomad stores: the number truncated to int64 (saturating, as big.Float.Int64), then an int8."""
    whole = max(-(2**63), min(2**63 - 1, int(number)))
    stored = (whole + 128) % 256 - 128
    note = ""
    if Decimal(stored) != number:
        note = f"weight {_number_text(number)} is stored as {stored} (Nomad truncates it to an integer held in an int8)"
    return stored, note


def decode_rule(body: dict[str, Any], affinity: bool, problems: list[str], unsupported: list[str]) -> Rule | None:
    """One HCL ``constraint`` or ``affinity`` block, at any level."""
    kind, keys = ("affinity", AFFINITY_KEYS) if affinity else ("constraint", CONSTRAINT_KEYS)
    problems.extend(unknown_keys(body, keys, f"{kind} block"))
    try:
        strings = {
            key: string_value(raw, key)
            for key, raw in body.items()
            if not is_meta(key) and key not in ("distinct_hosts", "weight") and key in keys
        }
        attribute, value, operator = strings.get("attribute", ""), strings.get("value", ""), strings.get("operator", "")
        for key in _AFFINITY_SUGAR if affinity else _CONSTRAINT_SUGAR:
            if strings.get(key):
                operator, value = key, strings[key]
        notes: list[str] = []
        weight = 0
        if affinity:
            weight = DEFAULT_AFFINITY_WEIGHT
            if body.get("weight") is not None:
                weight, note = int8_weight(number_value(body["weight"], "weight"))
                notes += [note] if note else []
        else:
            if body.get("distinct_hosts") is not None:
                hosts = _bool_value(body["distinct_hosts"], "distinct_hosts")
                operator, value = "distinct_hosts", "true" if hosts else "false"
            if strings.get("distinct_property"):
                operator, attribute = "distinct_property", strings["distinct_property"]
            notes += [
                f"the {key} key of a constraint is dropped by Nomad's decoder (only an affinity has set_contains_any "
                f'and set_contains_all keys; write operator = "{key}" and value = ...)'
                for key in DROPPED_CONSTRAINT_KEYS
                if key in strings
            ]
    except ValueProblem as exc:
        (unsupported if exc.unsupported else problems).append(f"{kind} block: {exc}")
        return None
    return Rule(attribute, operator or "=", value, weight, affinity, "; ".join(notes))


def _count(raw: Any) -> int:
    if raw is None:
        return 1
    number = number_value(raw, "count")
    for wrong, must in (
        (number != number.to_integral_value(), "be a whole number"),
        (number < 0, "be a whole number from 0"),
        (number > UINT64_MAX, "fit in 64 bits"),
    ):
        if wrong:
            raise ValueProblem(f"count = {_number_text(number)}: Unsuitable value: value must {must}")
    return int(number)


def _device(job: str, group: str, task: str, name: str, body: dict[str, Any]) -> DeviceRequest:
    problems = unknown_keys(body, DEVICE_KEYS, f'device "{name}"')
    unsupported: list[str] = []
    count = 1
    try:
        count = _count(body.get("count"))
    except ValueProblem as exc:
        (unsupported if exc.unsupported else problems).append(str(exc))
    constraints = [decode_rule(b, False, problems, unsupported) for b in unlabelled(body.get("constraint", []))]
    affinities = [decode_rule(b, True, problems, unsupported) for b in unlabelled(body.get("affinity", []))]
    return DeviceRequest(
        job, group, task, name, count,
        tuple(r for r in constraints if r is not None), tuple(r for r in affinities if r is not None),
        tuple(problems), tuple(unsupported),
    )  # fmt: skip


def device_requests(parsed: dict[str, Any]) -> list[DeviceRequest]:
    """Every device block of every task of every job block, in file order."""
    jobs = labelled(parsed.get("job", []))
    if not jobs:
        raise JobParseError('no job "<name>" block found')
    return [
        _device(job_name, group_name, task_name, dev_name, dev)
        for job_name, job in jobs
        for group_name, group in labelled(job.get("group", []))
        for task_name, task in labelled(group.get("task", []))
        for resources in unlabelled(task.get("resources", []))
        for dev_name, dev in labelled(resources.get("device", []))
    ]


# --- JSON jobs ----------------------------------------------------------------------------------


def load_json_job(text: str, source: str = "job") -> dict[str, Any]:
    """The job object of ``{"Job": {...}}`` or a bare job object."""
    try:
        data = go_strings(json.loads(text, parse_constant=_no_constant))
    except json.JSONDecodeError as exc:
        raise JobParseError(f"{source}:{exc.lineno}:{exc.colno}: not valid JSON: {exc.msg}") from None
    except (ValueError, RecursionError) as exc:
        raise JobParseError(f"{source}: not valid JSON: {exc}") from None
    job = data.get("Job", data) if isinstance(data, dict) else None
    if not isinstance(job, dict) or not isinstance(job.get("TaskGroups"), list):
        raise JobParseError(
            f'{source}: a JSON job needs "TaskGroups" (the form `nomad job run -output job.hcl` prints: {{"Job": ...}})'
        )
    return job


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (Go's decoder refuses it)")


def go_strings(value: Any) -> Any:
    """Lone UTF-16 surrogates (``"\\udcff"``) become U+FFFD, as Go's JSON decoder makes them."""
    if isinstance(value, str):
        return golang.go_utf8(value)
    if isinstance(value, list):
        return [go_strings(v) for v in value]
    if isinstance(value, dict):
        return {go_strings(k): go_strings(v) for k, v in value.items()}
    return value


def dicts(value: Any) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def json_type(raw: Any) -> str:
    if isinstance(raw, bool):
        return "bool"
    if isinstance(raw, (int, float)):
        return f"number {raw}"
    return "array" if isinstance(raw, list) else "object" if isinstance(raw, dict) else "string"


def json_text(raw: Any, field_name: str, problems: list[str]) -> str:
    if raw is None:
        return ""
    if not isinstance(raw, str):
        problems.append(f"{field_name}: json: cannot unmarshal {json_type(raw)} into a string field")
        return ""
    return raw


def _json_int(raw: Any, name: str, low: int, high: int, go_type: str, default: int, problems: list[str]) -> int:
    """An integer field of the API form; null or absent is Nomad's default (api ``Canonicalize``)."""
    if raw is None:
        return default
    if isinstance(raw, bool) or not isinstance(raw, int) or not low <= raw <= high:
        problems.append(f"{name}: json: cannot unmarshal {json_type(raw)} into {go_type} field")
        return default
    return raw


def _json_device(job: str, group: str, task: str, device: dict[str, Any]) -> DeviceRequest:
    problems: list[str] = []
    name = json_text(device.get("Name"), "Name", problems)
    count = _json_int(device.get("Count"), "Count", 0, UINT64_MAX, "a uint64", 1, problems)
    constraints = tuple(json_rule(c, False, problems) for c in dicts(device.get("Constraints")))
    affinities = tuple(json_rule(a, True, problems) for a in dicts(device.get("Affinities")))
    return DeviceRequest(job, group, task, name, count, constraints, affinities, tuple(problems))


def json_rule(raw: dict[str, Any], affinity: bool, problems: list[str]) -> Rule:
    """A constraint or affinity of the API form, at any level: the fields as written."""
    return Rule(
        json_text(raw.get("LTarget"), "LTarget", problems),
        json_text(raw.get("Operand"), "Operand", problems),
        json_text(raw.get("RTarget"), "RTarget", problems),
        _json_int(raw.get("Weight"), "Weight", -128, 127, "an int8", DEFAULT_AFFINITY_WEIGHT, problems)
        if affinity
        else 0,
        affinity,
    )


# --- job validation -----------------------------------------------------------------------------

_PREFIX_TARGETS = ("${attr.", "${device.", "${meta.")
_COMPARISONS = (*EQUAL, *NOT_EQUAL, *ORDER)
_SETS = (*SET_ALL, "set_contains_any")


def quoted(text: str) -> str:
    """Go's ``%q`` for printable text."""
    return json.dumps(text, ensure_ascii=False)


def validate_target(target: str) -> str:
    """``validateConstraintAttribute``: literals pass; ``${...}`` must be a target Nomad resolves."""
    if not target.startswith("$"):
        return ""
    if not target.startswith("${"):
        return f"attribute {quoted(target)} is missing an opening brace"
    if not target.endswith("}"):
        return f"attribute {quoted(target)} is missing a closing brace"
    if target in NODE_FIELDS or target.startswith(_PREFIX_TARGETS):
        return ""
    return f"unsupported attribute {quoted(target)}"


def _operand_errors(rule: Rule, kind: str) -> list[str]:
    op, value = rule.operator, rule.value
    if op in _SETS and value == "":
        return [
            "Set contains operators require an RTarget"
            if rule.affinity
            else "Set contains constraint requires an RTarget"
        ]
    if op == "regexp":
        problem = golang.compile_error(value)
        return [f"Regular expression failed to compile: {problem}"] if problem else []
    if op in ("version", "semver"):
        parsed = golang.parse_constraints(value, semver=op == "semver")
        return [f"{op.capitalize()} {kind} is invalid: {parsed}"] if isinstance(parsed, str) else []
    if op in _COMPARISONS and value == "":
        return [f"Operator {quoted(op)} requires an RTarget"]
    if op in _SETS or op in _COMPARISONS or (not rule.affinity and op == "distinct_hosts"):
        return []
    if not rule.affinity and op == "distinct_property":
        if value == "":
            return []
        count = int(value) if value.isascii() and value.isdigit() and int(value) < 2**64 else None
        if count is None:
            return [f"Failed to convert RTarget {quoted(value)} to uint64"]
        return [f"Distinct Property must have an allowed count of 1 or greater: {count} < 1"] if count < 1 else []
    if not rule.affinity and op in ("is_set", "is_not_set"):
        return [f"Operator {quoted(op)} does not support an RTarget"] if value != "" else []
    return [f"Unknown affinity operator {quoted(op)}" if rule.affinity else f"Unknown constraint type {quoted(op)}"]


def validate_constraint(rule: Rule) -> list[str]:
    """``Constraint.Validate``."""
    errors = ["Missing constraint operand"] if rule.operator == "" else []
    errors += _operand_errors(rule, "constraint")
    if rule.operator != "distinct_hosts":
        target = (
            validate_target(rule.attribute) if rule.attribute else "no attribute provided but is required by operator"
        )
        errors += [target] if target else []
    return errors


def validate_affinity(rule: Rule) -> list[str]:
    """``Affinity.Validate`` (the weight is the int8 Nomad's decoder stored)."""
    errors = ["Missing affinity operand"] if rule.operator == "" else []
    errors += _operand_errors(rule, "affinity")
    if rule.attribute == "":
        errors.append("No LTarget provided but is required")
    if rule.weight == 0:
        errors.append("Affinity weight cannot be zero")
    if not -100 <= rule.weight <= 100:
        errors.append("Affinity weight must be within the range [-100,100]")
    return errors


def validate_device(request: DeviceRequest) -> list[str]:
    """``RequestedDevice.Validate``: the name, then each constraint and affinity by its 1-based index."""
    errors = []
    if request.name == "":
        errors.append("device name must be given as one of the following: type, vendor/type, or vendor/type/name")
    for index, rule in enumerate(request.constraints, start=1):
        if rule.operator in CLUSTER_OPERATORS:
            errors.append(f"Constraint {index} validation failed: using unsupported operand {quoted(rule.operator)}")
            continue
        errors += [f"Constraint {index} validation failed: {e}" for e in validate_constraint(rule)]
    for index, rule in enumerate(request.affinities, start=1):
        errors += [f"Affinity {index} validation failed: {e}" for e in validate_affinity(rule)]
    return errors


def validate_spread(spread: Spread) -> list[str]:
    """``Spread.Validate``."""
    errors = []
    if spread.attribute == "":
        errors.append("Missing spread attribute")
    if spread.weight <= 0 or spread.weight > 100:
        errors.append("Spread block must have a positive weight from 0 to 100")
    seen: set[str] = set()
    for value, percent in spread.targets:
        if value in seen:
            errors.append(f"Spread target value {quoted(value)} already defined")
        seen.add(value)
        if percent > 100:
            errors.append(f"Spread target percentage for value {quoted(value)} must be between 0 and 100")
    total = sum(percent for _, percent in spread.targets)
    if total > 100:
        errors.append(f"Sum of spread target percentages must not be greater than 100%; got {total}%")
    return errors


# --- node-level rules: job-, group- and task-level constraint, affinity and spread -------------


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
    where: str
    constraints: list[Rule] = field(default_factory=list)
    affinities: list[Rule] = field(default_factory=list)
    spreads: list[Spread] = field(default_factory=list)
    has_affinities: bool = False  # Nomad's non-nil slice (a system job may hold none)
    problems: list[str] = field(default_factory=list)
    unsupported: list[str] = field(default_factory=list)


def _hcl_spread(body: dict[str, Any], level: _Level) -> None:
    """A plain block: ``attribute``, ``weight`` (int8) and ``target "<value>" { percent }`` (uint8)."""
    level.problems.extend(unknown_keys(body, SPREAD_KEYS, "spread block"))
    try:
        attribute = string_value(body.get("attribute"), "attribute")
        weight = DEFAULT_SPREAD_WEIGHT
        if body.get("weight") is not None:
            weight = _int_value(body["weight"], "weight", -128, 127)
        targets = []
        blocks = body.get("target")
        if "target" in body and not isinstance(blocks, list):
            level.problems.append(
                'spread block: Unsupported argument; an argument named "target" is not expected here. '
                'Did you mean to define a block of type "target"?'
            )
        for item in blocks if isinstance(blocks, list) else []:
            if not isinstance(item, dict):
                continue
            if "__is_block__" in item:  # python-hcl2's form of a block without a label
                level.problems.append(
                    "target block: Missing name for target; All target blocks must have 1 labels (name)."
                )
                continue
            for label, target in labelled([item]):
                level.problems.extend(unknown_keys(target, frozenset({"percent"}), f'target "{label}"'))
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
        level.constraints += [rule] if rule is not None else []
    for block in unlabelled(body.get("affinity", [])):
        level.has_affinities = True
        rule = decode_rule(block, True, level.problems, level.unsupported)
        level.affinities += [rule] if rule is not None else []
    if spreads:
        for block in unlabelled(body.get("spread", [])):
            _hcl_spread(block, level)
    elif "spread" in body:  # a task has no spread (api.Task): gohcl refuses the block
        level.problems.append('Unsupported block type; Blocks of type "spread" are not expected here.')
    return level


def _hcl_job(parsed: dict[str, Any]) -> ParsedJob:
    requests = device_requests(parsed)
    ((name, job), *_) = labelled(parsed.get("job", []))
    job_type = "service"
    problems: list[str] = []
    unsupported: list[str] = []
    raw = job.get("type")
    if isinstance(raw, str) and is_expression(raw):
        unsupported.append(f"type = {raw}: check-job does not evaluate variables or functions")
    elif raw is not None and not isinstance(plain(raw), str):
        problems.append(f"type: Incorrect attribute value type; a string is required, not {plain(raw)!r}")
    elif raw is not None:
        job_type = plain(raw)
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


def _json_level(raw: dict[str, Any], where: str, spreads: bool) -> _Level:
    level = _Level(where)
    level.constraints = [json_rule(c, False, level.problems) for c in dicts(raw.get("Constraints"))]
    level.affinities = [json_rule(a, True, level.problems) for a in dicts(raw.get("Affinities"))]
    level.has_affinities = isinstance(raw.get("Affinities"), list)  # [] is a non-nil slice in Go
    for spread in dicts(raw.get("Spreads")) if spreads else []:
        problems = level.problems
        attribute = json_text(spread.get("Attribute"), "Attribute", problems)
        weight = _json_int(spread.get("Weight"), "Weight", -128, 127, "an int8", DEFAULT_SPREAD_WEIGHT, problems)
        targets = []
        for target in dicts(spread.get("SpreadTarget")):
            percent = _json_int(target.get("Percent"), "Percent", 0, 255, "a uint8", 0, problems)
            targets.append((json_text(target.get("Value"), "Value", problems), percent))
        level.spreads.append(Spread(attribute, weight, tuple(targets), level.where))
    return level


def _json_job(job: dict[str, Any]) -> ParsedJob:
    name = str(job.get("Name") or job.get("ID") or "")
    requests: list[DeviceRequest] = []
    problems: list[str] = []
    job_type = json_text(job.get("Type"), "Type", problems) or "service"
    top = _json_level(job, "job", spreads=True)
    groups = []
    for group in dicts(job.get("TaskGroups")):
        group_name = group["Name"] if isinstance(group.get("Name"), str) else ""
        levels = [_json_level(group, f'group "{group_name}"', spreads=True)]
        for task in dicts(group.get("Tasks")):
            resources = task["Resources"] if isinstance(task.get("Resources"), dict) else {}
            for device in dicts(resources.get("Devices")):
                requests.append(_json_device(name, str(group.get("Name", "")), str(task.get("Name", "")), device))
            task_name = task["Name"] if isinstance(task.get("Name"), str) else ""
            levels.append(_json_level(task, f'group "{group_name}" task "{task_name}"', spreads=False))
        groups.append(_group(name, group_name, job_type, top, levels))
    return ParsedJob(name, job_type, requests, groups, (*problems, *_validate(top, job_type)), tuple(top.unsupported))


def _validate(level: _Level, job_type: str, task: bool = False) -> list[str]:
    """Nomad's errors for one level's rules, prefixed with the level; a system job holds no affinity or spread."""
    errors = list(level.problems)
    for index, rule in enumerate(level.constraints, start=1):
        errors += [f"Constraint {index} validation failed: {e}" for e in validate_constraint(rule)]
        if task and rule.operator in CLUSTER_OPERATORS:
            errors.append(f"Constraint {index} has disallowed Operand at task level: {rule.operator}")
    if job_type == "system":
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


def parse_job(text: str, source: str = "job") -> ParsedJob:
    """A job file's device blocks and node-level rules."""
    if text.lstrip().startswith("{"):
        return _json_job(load_json_job(text, source))
    try:
        parsed: dict[str, Any] = hcl2.loads(text)
    except Exception as exc:
        raise JobParseError(describe_hcl_error(exc, text, source)) from None
    return _hcl_job(parsed)


def parse_job_text(text: str, source: str = "job") -> list[DeviceRequest]:
    return parse_job(text, source).requests
