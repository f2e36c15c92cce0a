"""Find every ``device`` block of a Nomad job file (HCL2 or JSON) and decode it as Nomad does.

Placement is ``job -> group -> task -> resources -> device "<name>"``
(nomad-protocol.md §6). The decoding facts are Nomad's:

- HCL (``jobspec2/hcl_conversions.go``): a device block holds ``count``,
  ``constraint`` and ``affinity``; any other key is a decode error, so
  ``nomad job run`` refuses the file. A constraint's ``version``, ``semver``,
  ``regexp``, ``set_contains``, ``distinct_hosts`` and ``distinct_property``
  keys set its operator (a later one in that list wins); its
  ``set_contains_all``, ``set_contains_any``, ``is_set`` and ``is_not_set``
  keys are accepted and then dropped. An affinity's sugar keys are
  ``version``, ``semver``, ``regexp``, ``set_contains_any``,
  ``set_contains_all`` and ``set_contains``. An empty operator becomes ``=``.
  Values are strings (numbers and bools converted), ``weight`` a number
  truncated to an integer and stored in an int8 (so 300 is 44), ``count`` a
  whole number from 0 (default 1), an affinity's weight 50 by default.
- JSON (the API form ``nomad job run -output`` prints): the fields as
  written; ``Count`` defaults to 1 and ``Weight`` to 50, nothing else is
  defaulted (an empty ``Operand`` stays empty and job validation refuses it).

Job validation (what Nomad refuses at submission) is ``jobspec.validate``.
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
from nomad_plugin.util.hclerrors import describe_hcl_error
from nomad_plugin.util.hclvalue import is_expression, is_meta, labelled, plain, unlabelled

DEFAULT_AFFINITY_WEIGHT = 50
# (key, operator) in the order Nomad's decoders apply them; a later one wins.
_CONSTRAINT_SUGAR = (
    ("version", "version"),
    ("semver", "semver"),
    ("regexp", "regexp"),
    ("set_contains", "set_contains"),
)
_AFFINITY_SUGAR = (
    ("version", "version"), ("semver", "semver"), ("regexp", "regexp"),
    ("set_contains_any", "set_contains_any"), ("set_contains_all", "set_contains_all"), ("set_contains", "set_contains"),
)  # fmt: skip
_BASE_KEYS = ("attribute", "operator", "value")
DROPPED_CONSTRAINT_KEYS = ("set_contains_all", "set_contains_any", "is_set", "is_not_set")
CONSTRAINT_KEYS = frozenset(
    {*_BASE_KEYS, *(k for k, _ in _CONSTRAINT_SUGAR), "distinct_hosts", "distinct_property", *DROPPED_CONSTRAINT_KEYS}
)
AFFINITY_KEYS = frozenset({*_BASE_KEYS, *(k for k, _ in _AFFINITY_SUGAR), "weight"})
DEVICE_KEYS = frozenset({"count", "constraint", "affinity"})
_HCL_NUMBER = re.compile(r"\$\{\s*(-?[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)\s*\}")
UINT64_MAX = 2**64 - 1


class JobParseError(ValueError):
    """The job file cannot be read as HCL or has no job block."""


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

    def text(self) -> str:
        return f'{self.attribute} {self.operator} "{self.value}"' + (
            f" (weight {self.weight})" if self.affinity else ""
        )


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


def _number(value: Any) -> Decimal | None:
    """A literal number as HCL holds it (python-hcl2 leaves ``1e3`` as the text ``${1e3}``)."""
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


def string_value(raw: Any, key: str) -> str:
    """A value decoded into a string attribute, as HCL converts it (null is "")."""
    if raw is None:
        return ""
    if isinstance(raw, bool):
        return "true" if raw else "false"
    number = _number(raw)
    if number is not None:
        return _number_text(number)
    if isinstance(raw, str):
        if is_expression(raw):
            raise ValueProblem(f"{key} = {raw}: check-job does not evaluate variables or functions", unsupported=True)
        return str(plain(raw))
    raise ValueProblem(f"{key}: Incorrect attribute value type; a string is required, not {_hcl_type(raw)}")


def _hcl_type(raw: Any) -> str:
    return "a list" if isinstance(raw, list) else "an object" if isinstance(raw, dict) else type(raw).__name__


def number_value(raw: Any, key: str) -> Decimal:
    """A value decoded into a number attribute (a numeric string converts, as HCL does)."""
    number = _number(raw)
    if number is None and isinstance(raw, str) and not is_expression(raw):
        try:
            number = Decimal(str(plain(raw)).strip())
        except InvalidOperation:
            number = None
        if number is not None and not number.is_finite():
            number = None
    if number is None:
        if isinstance(raw, str) and is_expression(raw):
            raise ValueProblem(f"{key} = {raw}: check-job does not evaluate variables or functions", unsupported=True)
        raise ValueProblem(f"{key} = {plain(raw)!r}: Unsuitable value type; a number is required")
    return number


def _bool_value(raw: Any, key: str) -> bool:
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, str) and not is_expression(raw) and plain(raw) in ("true", "false"):
        return bool(plain(raw) == "true")
    if isinstance(raw, str) and is_expression(raw):
        raise ValueProblem(f"{key} = {raw}: check-job does not evaluate variables or functions", unsupported=True)
    raise ValueProblem(f"{key} = {plain(raw)!r}: Unsuitable value type; a bool is required")


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
    """The weight Nomad stores: the number truncated to int64 (saturating), then kept in an int8."""
    whole = int(number)  # truncates towards zero, as big.Float.Int64 does
    whole = max(-(2**63), min(2**63 - 1, whole))
    stored = (whole + 128) % 256 - 128
    note = ""
    if Decimal(stored) != number:
        note = f"weight {_number_text(number)} is stored as {stored} (Nomad truncates it to an integer held in an int8)"
    return stored, note


def decode_rule(body: dict[str, Any], affinity: bool, problems: list[str], unsupported: list[str]) -> Rule | None:
    """One HCL ``constraint`` or ``affinity`` block, as Nomad's decoder reads it at any level."""
    kind = "affinity" if affinity else "constraint"
    problems.extend(unknown_keys(body, AFFINITY_KEYS if affinity else CONSTRAINT_KEYS, f"{kind} block"))
    try:
        strings = {
            key: string_value(plain_raw, key)
            for key, plain_raw in body.items()
            if not is_meta(key) and key not in ("distinct_hosts", "weight")
            and key in (AFFINITY_KEYS if affinity else CONSTRAINT_KEYS)
        }  # fmt: skip
        attribute, value, operator = strings.get("attribute", ""), strings.get("value", ""), strings.get("operator", "")
        notes = []
        for key, op in _AFFINITY_SUGAR if affinity else _CONSTRAINT_SUGAR:
            if strings.get(key):
                operator, value = op, strings[key]
        weight = 0
        if affinity:
            weight = DEFAULT_AFFINITY_WEIGHT
            if body.get("weight") is not None:
                weight, note = int8_weight(number_value(body["weight"], "weight"))
                if note:
                    notes.append(note)
        else:
            if body.get("distinct_hosts") is not None:
                operator, value = (
                    "distinct_hosts",
                    "true" if _bool_value(body["distinct_hosts"], "distinct_hosts") else "false",
                )
            if strings.get("distinct_property"):
                operator, attribute = "distinct_property", strings["distinct_property"]
            for key in DROPPED_CONSTRAINT_KEYS:
                if key in strings:
                    notes.append(
                        f"the {key} key of a constraint is dropped by Nomad's decoder (only an affinity has set_contains_any "
                        f'and set_contains_all keys; write operator = "{key}" and value = ...)'
                    )
    except ValueProblem as exc:
        (unsupported if exc.unsupported else problems).append(f"{kind} block: {exc}")
        return None
    return Rule(attribute, operator or "=", value, weight, affinity, "; ".join(notes))


def _count(raw: Any) -> int:
    if raw is None:
        return 1
    number = number_value(raw, "count")
    if number != number.to_integral_value():
        raise ValueProblem(f"count = {_number_text(number)}: Unsuitable value: value must be a whole number")
    if number < 0:
        raise ValueProblem(f"count = {_number_text(number)}: Unsuitable value: value must be a whole number from 0")
    if number > UINT64_MAX:
        raise ValueProblem(f"count = {_number_text(number)}: Unsuitable value: value must fit in 64 bits")
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
    """Every device block of every task, in file order."""
    requests: list[DeviceRequest] = []
    jobs = labelled(parsed.get("job", []))
    if not jobs:
        raise JobParseError('no job "<name>" block found')
    for job_name, job in jobs:
        for group_name, group in labelled(job.get("group", [])):
            for task_name, task in labelled(group.get("task", [])):
                for resources in unlabelled(task.get("resources", [])):
                    for dev_name, dev in labelled(resources.get("device", [])):
                        requests.append(_device(job_name, group_name, task_name, dev_name, dev))
    return requests


def parse_job_text(text: str, source: str = "job") -> list[DeviceRequest]:
    """Device requests of an HCL2 job file, or of a JSON job (``nomad job run -output`` form)."""
    if is_json(text):
        return parse_job_json(text, source)
    return device_requests(load_hcl(text, source))


def is_json(text: str) -> bool:
    return text.lstrip().startswith("{")


def load_hcl(text: str, source: str = "job") -> dict[str, Any]:
    """The job file as python-hcl2 reads it; JobParseError naming the line when it is no HCL."""
    try:
        parsed: dict[str, Any] = hcl2.loads(text)
    except Exception as exc:
        raise JobParseError(describe_hcl_error(exc, text, source)) from None
    return parsed


# --- JSON jobs -------------------------------------------------------------------------------


def load_json_job(text: str, source: str = "job") -> dict[str, Any]:
    """The job object of ``{"Job": {...}}`` (what ``nomad job run -output`` prints) or a bare job object."""
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


def parse_job_json(text: str, source: str = "job") -> list[DeviceRequest]:
    """``{"Job": {...}}`` (what ``nomad job run -output`` prints) or the bare job object."""
    return json_device_requests(load_json_job(text, source))


def json_device_requests(job: dict[str, Any]) -> list[DeviceRequest]:
    """Every device of every task of a JSON job object, in order."""
    job_name = str(job.get("Name") or job.get("ID") or "")
    requests: list[DeviceRequest] = []
    for group in dicts(job.get("TaskGroups")):
        for task in dicts(group.get("Tasks")):
            resources = task.get("Resources") if isinstance(task.get("Resources"), dict) else {}
            for device in dicts((resources or {}).get("Devices")):
                requests.append(_json_device(job_name, str(group.get("Name", "")), str(task.get("Name", "")), device))
    return requests


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (Go's decoder refuses it)")


_SURROGATE = re.compile("[\ud800-\udfff]")


def go_strings(value: Any) -> Any:
    """Lone UTF-16 surrogates (``"\\udcff"``) become U+FFFD, as Go's JSON decoder makes them."""
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, list):
        return [go_strings(v) for v in value]
    if isinstance(value, dict):
        return {go_strings(k): go_strings(v) for k, v in value.items()}
    return value


def dicts(value: Any) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def json_text(raw: Any, field_name: str, problems: list[str]) -> str:
    if raw is None:
        return ""
    if not isinstance(raw, str):
        problems.append(f"{field_name}: json: cannot unmarshal {json_type(raw)} into a string field")
        return ""
    return raw


def json_type(raw: Any) -> str:
    if isinstance(raw, bool):
        return "bool"
    if isinstance(raw, (int, float)):
        return f"number {raw}"
    return "array" if isinstance(raw, list) else "object" if isinstance(raw, dict) else "string"


def _json_device(job: str, group: str, task: str, device: dict[str, Any]) -> DeviceRequest:
    problems: list[str] = []
    name = json_text(device.get("Name"), "Name", problems)
    raw = device.get("Count")
    count = 1
    if raw is not None:
        if isinstance(raw, bool) or not isinstance(raw, int) or not 0 <= raw <= UINT64_MAX:
            problems.append(f"Count: json: cannot unmarshal {json_type(raw)} into a uint64 field")
        else:
            count = raw

    constraints = tuple(json_rule(c, False, problems) for c in dicts(device.get("Constraints")))
    affinities = tuple(json_rule(a, True, problems) for a in dicts(device.get("Affinities")))
    return DeviceRequest(job, group, task, name, count, constraints, affinities, tuple(problems))


def json_weight(raw: Any, problems: list[str]) -> int:
    """An ``int8`` weight of the API form; null or absent is Nomad's default 50 (api ``Canonicalize``)."""
    if raw is None:
        return DEFAULT_AFFINITY_WEIGHT
    if isinstance(raw, bool) or not isinstance(raw, int) or not -128 <= raw <= 127:
        problems.append(f"Weight: json: cannot unmarshal {json_type(raw)} into an int8 field")
        return DEFAULT_AFFINITY_WEIGHT
    return raw


def json_rule(raw_rule: dict[str, Any], affinity: bool, problems: list[str]) -> Rule:
    """A constraint or affinity of the API form, at any level: the fields as written."""
    return Rule(
        json_text(raw_rule.get("LTarget"), "LTarget", problems),
        json_text(raw_rule.get("Operand"), "Operand", problems),
        json_text(raw_rule.get("RTarget"), "RTarget", problems),
        json_weight(raw_rule.get("Weight"), problems) if affinity else 0,
        affinity,
    )


# --- validate.py -------------------------------------------------------------------------------
# Nomad's job validation of ``device`` blocks: what ``nomad job run`` refuses before any scheduling.
#
# Facts from ``nomad/structs/structs.go`` (``Constraint.Validate``,
# ``Affinity.Validate``, ``RequestedDevice.Validate``) and
# ``nomad/structs/constraint.go`` (``validateConstraintAttribute``). Each
# function returns Nomad's error messages (empty: valid), so check-job can
# say "Nomad would refuse this job at submission" in Nomad's own words.


_EXACT_TARGETS = ("${node.unique.id}", "${node.datacenter}", "${node.unique.name}", "${node.class}", "${node.pool}")
_PREFIX_TARGETS = ("${attr.", "${device.", "${meta.")
_COMPARISONS = ("=", "==", "is", "!=", "not", "<", "<=", ">", ">=")
_SETS = ("set_contains_all", "set_contains_any", "set_contains")


def quoted(text: str) -> str:
    """Go's ``%q`` for printable text: double quotes, backslash escapes."""
    return json.dumps(text, ensure_ascii=False)


def validate_target(target: str) -> str:
    """``validateConstraintAttribute``: literals pass; ``${...}`` must be a target Nomad resolves."""
    if not target.startswith("$"):
        return ""
    if not target.startswith("${"):
        return f"attribute {quoted(target)} is missing an opening brace"
    if not target.endswith("}"):
        return f"attribute {quoted(target)} is missing a closing brace"
    if target in _EXACT_TARGETS or target.startswith(_PREFIX_TARGETS):
        return ""
    return f"unsupported attribute {quoted(target)}"


def _operand_errors(rule: Rule, kind: str) -> list[str]:
    op, value = rule.operator, rule.value
    errors: list[str] = []
    if op in _SETS:
        if value == "":
            errors.append(
                "Set contains operators require an RTarget"
                if rule.affinity
                else "Set contains constraint requires an RTarget"
            )
    elif op == "regexp":
        problem = golang.compile_error(value)
        if problem:
            errors.append(f"Regular expression failed to compile: {problem}")
    elif op == "version":
        parsed = golang.parse_constraints(value)
        if isinstance(parsed, str):
            errors.append(f"Version {kind} is invalid: {parsed}")
    elif op == "semver":
        parsed = golang.parse_constraints(value, semver=True)
        if isinstance(parsed, str):
            errors.append(f"Semver {kind} is invalid: {parsed}")
    elif op in _COMPARISONS:
        if value == "":
            errors.append(f"Operator {quoted(op)} requires an RTarget")
    elif not rule.affinity and op == "distinct_hosts":
        pass
    elif not rule.affinity and op == "distinct_property":
        if value != "":
            count = int(value) if value.isascii() and value.isdigit() and int(value) < 2**64 else None
            if count is None:
                errors.append(f"Failed to convert RTarget {quoted(value)} to uint64")
            elif count < 1:
                errors.append(f"Distinct Property must have an allowed count of 1 or greater: {count} < 1")
    elif not rule.affinity and op in ("is_set", "is_not_set"):
        if value != "":
            errors.append(f"Operator {quoted(op)} does not support an RTarget")
    elif rule.affinity:
        errors.append(f"Unknown affinity operator {quoted(op)}")
    else:
        errors.append(f"Unknown constraint type {quoted(op)}")
    return errors


def validate_constraint(rule: Rule) -> list[str]:
    """``Constraint.Validate``."""
    errors = ["Missing constraint operand"] if rule.operator == "" else []
    errors += _operand_errors(rule, "constraint")
    if rule.operator != "distinct_hosts":
        if rule.attribute == "":
            errors.append("no attribute provided but is required by operator")
        else:
            target = validate_target(rule.attribute)
            if target:
                errors.append(target)
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
        if rule.operator in ("distinct_hosts", "distinct_property"):
            errors.append(f"Constraint {index} validation failed: using unsupported operand {quoted(rule.operator)}")
            continue
        errors += [f"Constraint {index} validation failed: {e}" for e in validate_constraint(rule)]
    for index, rule in enumerate(request.affinities, start=1):
        errors += [f"Affinity {index} validation failed: {e}" for e in validate_affinity(rule)]
    return errors


# --- groups.py ---------------------------------------------------------------------------------
# The node-level placement rules of a job: its job-, group- and task-level ``constraint``, ``affinity`` and ``spread``.
#
# Nomad evaluates these on the node (its attributes, meta and a few fields),
# never on devices. Which apply to a task group is the scheduler's
# (``scheduler/feasible/stack.go``): the job's constraints
# (``SetJob``), then the group's and every task's (``TaskGroupConstraints``);
# the job's, the group's and every task's affinities
# (``NodeAffinityIterator.SetTaskGroup`` in ``rank.go``); the job's and the
# group's spreads.
#
# Decoding is ``jobspec.parse``'s (the same block decoders serve every level,
# ``jobspec2/hcl_conversions.go``); a spread is a plain HCL block of
# ``attribute``, ``weight`` (an int8; absent is 50, ``api.Spread.Canonicalize``)
# and ``target "<value>" { percent }`` (a uint8). Job validation is
# ``nomad/structs/structs.go``: ``Job.Validate``, ``TaskGroup.Validate`` and
# ``Task.Validate`` validate each constraint, affinity and spread
# (``Constraint.Validate``, ``Affinity.Validate``, ``Spread.Validate``); a task
# may not hold ``distinct_hosts`` or ``distinct_property``; a system job may
# not hold an affinity or a spread at any level.


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


def _hcl_job_type(job: dict[str, Any]) -> tuple[str, list[str], list[str]]:
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
    job_type, problems, unsupported = _hcl_job_type(job)
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
