"""Find every ``device`` block of a Nomad job file (HCL2 or JSON), as plain requests.

Placement is ``job -> group -> task -> resources -> device "<name>"``
(nomad-protocol.md §6). Constraint blocks accept Nomad's sugar
(``version = ...``, ``regexp = ...``, ``set_contains = ...``,
``distinct_hosts = true``, ``distinct_property = ...``); values become strings
the way Nomad's jobspec decoder converts them.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, field
from typing import Any

import hcl2

from nomad_plugin.util.hclerrors import describe_hcl_error
from nomad_plugin.util.hclvalue import is_expression, is_meta, labelled, plain, unlabelled

DEFAULT_AFFINITY_WEIGHT = 50
# Nomad's jobspec2 decoders (hcl_conversions.go): sugar key -> operator, in the
# order Nomad applies them (a later one wins). Constraint schema also admits
# set_contains_all/_any and is_set/is_not_set keys, but its decoder ignores them.
_CONSTRAINT_SUGAR = {
    "version": "version",
    "semver": "semver",
    "regexp": "regexp",
    "set_contains": "set_contains",
    "distinct_property": "distinct_property",
}
_AFFINITY_SUGAR = {
    "version": "version",
    "semver": "semver",
    "regexp": "regexp",
    "set_contains_any": "set_contains_any",
    "set_contains_all": "set_contains_all",
    "set_contains": "set_contains",
}
_BASE_KEYS = ("attribute", "operator", "value")
CONSTRAINT_KEYS = frozenset(
    {*_BASE_KEYS, *_CONSTRAINT_SUGAR, "distinct_hosts", "set_contains_all", "set_contains_any", "is_set", "is_not_set"}
)
AFFINITY_KEYS = frozenset({*_BASE_KEYS, *_AFFINITY_SUGAR, "weight"})
DEVICE_KEYS = frozenset({"count", "constraint", "affinity"})


class JobParseError(ValueError):
    """The job file cannot be read as HCL or has no job block."""


@dataclass(frozen=True)
class Rule:
    """A constraint or affinity: ``attribute <operator> value`` (Nomad's LTarget/Operand/RTarget)."""

    attribute: str
    operator: str
    value: str
    weight: int = 0
    affinity: bool = False

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
    problems: tuple[str, ...] = field(default=())  # job-validation errors Nomad would report

    @property
    def where(self) -> str:
        return f'group "{self.group}" task "{self.task}" device "{self.name}"'


def _string(value: Any) -> str:
    """A constraint value as Nomad's decoder makes it a string (numbers, bools converted)."""
    value = plain(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return "" if value is None else str(value)


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


def _rules(blocks: Any, affinity: bool, problems: list[str]) -> list[Rule]:
    rules: list[Rule] = []
    kind = "affinity" if affinity else "constraint"
    for body in unlabelled(blocks):
        problems.extend(unknown_keys(body, AFFINITY_KEYS if affinity else CONSTRAINT_KEYS, f"{kind} block"))
        attribute = _string(body.get("attribute", ""))
        operator = _string(body.get("operator", "")) or "="
        value = _string(body.get("value", ""))
        for key, op in (_AFFINITY_SUGAR if affinity else _CONSTRAINT_SUGAR).items():
            if key in body and _string(body[key]):
                operator = op
                value = _string(body[key]) if key != "distinct_property" else ""
                if key == "distinct_property":
                    attribute = _string(body[key])
        if not affinity and plain(body.get("distinct_hosts")) is True:
            operator = "distinct_hosts"
        weight = 0
        if affinity:
            raw = plain(body.get("weight", DEFAULT_AFFINITY_WEIGHT))
            if isinstance(raw, bool) or not isinstance(raw, int) or not -100 <= raw <= 100 or raw == 0:
                problems.append(f"affinity {attribute}: weight {raw!r} must be a non-zero integer in -100..100")
                raw = DEFAULT_AFFINITY_WEIGHT if not isinstance(raw, int) or isinstance(raw, bool) else raw
            weight = int(raw)
        rules.append(Rule(attribute, operator, value, weight, affinity))
    return rules


def _device(job: str, group: str, task: str, name: str, body: dict[str, Any]) -> DeviceRequest:
    problems = unknown_keys(body, DEVICE_KEYS, f'device "{name}"')
    raw_count = body.get("count", 1)
    if isinstance(raw_count, str) and not is_expression(raw_count) and plain(raw_count).strip().lstrip("-").isdigit():
        raw_count = int(plain(raw_count))  # HCL converts "2" to the number Count needs, as Nomad's decoder does
    count = 1
    if is_expression(raw_count) or isinstance(raw_count, bool) or not isinstance(raw_count, int):
        problems.append(f"count = {plain(raw_count)!r} is not a literal whole number (variables are not evaluated)")
    elif raw_count < 0:
        problems.append(f"count = {raw_count}: Nomad needs a whole number from 0 (it decodes count as unsigned)")
    else:
        count = raw_count  # 0 is valid: Nomad places the task and Reserve gets no instance
    if not name:
        problems.append('a device block needs a name: "<type>", "<vendor>/<type>" or "<vendor>/<type>/<model>"')
    constraints = _rules(body.get("constraint", []), False, problems)
    affinities = _rules(body.get("affinity", []), True, problems)
    for rule in (*constraints, *affinities):
        if rule.operator in ("distinct_hosts", "distinct_property"):
            problems.append(f"{rule.operator} is not allowed inside a device block (Nomad rejects the job)")
    return DeviceRequest(job, group, task, name, count, tuple(constraints), tuple(affinities), tuple(problems))


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
    if text.lstrip().startswith("{"):
        return parse_job_json(text, source)
    try:
        parsed = hcl2.loads(text)
    except Exception as exc:
        raise JobParseError(describe_hcl_error(exc, text, source)) from None
    return device_requests(parsed)


# --- JSON jobs -------------------------------------------------------------------------------


def parse_job_json(text: str, source: str = "job") -> list[DeviceRequest]:
    """``{"Job": {...}}`` (what ``nomad job run -output`` prints) or the bare job object."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise JobParseError(f"{source}:{exc.lineno}:{exc.colno}: not valid JSON: {exc.msg}") from None
    job = data.get("Job", data) if isinstance(data, dict) else None
    if not isinstance(job, dict) or not isinstance(job.get("TaskGroups"), list):
        raise JobParseError(
            f'{source}: a JSON job needs "TaskGroups" (the form `nomad job run -output job.hcl` prints: {{"Job": ...}})'
        )
    job_name = str(job.get("Name") or job.get("ID") or "")
    requests: list[DeviceRequest] = []
    for group in _dicts(job.get("TaskGroups")):
        for task in _dicts(group.get("Tasks")):
            resources = task.get("Resources") if isinstance(task.get("Resources"), dict) else {}
            for device in _dicts((resources or {}).get("Devices")):
                requests.append(_json_device(job_name, str(group.get("Name", "")), str(task.get("Name", "")), device))
    return requests


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _json_device(job: str, group: str, task: str, device: dict[str, Any]) -> DeviceRequest:
    problems: list[str] = []
    name = str(device.get("Name") or "")
    raw = device.get("Count", 1)
    count = 1 if raw is None else raw
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        problems.append(f"Count = {raw!r}: Nomad needs a whole number from 0")
        count = 1
    if not name:
        problems.append('a device needs a Name: "<type>", "<vendor>/<type>" or "<vendor>/<type>/<model>"')

    def rule(raw_rule: dict[str, Any], affinity: bool) -> Rule:
        weight = 0
        if affinity:
            weight = raw_rule.get("Weight", DEFAULT_AFFINITY_WEIGHT)
            if isinstance(weight, bool) or not isinstance(weight, int) or weight == 0 or not -100 <= weight <= 100:
                problems.append(f"affinity Weight {weight!r} must be a non-zero integer in -100..100")
                weight = DEFAULT_AFFINITY_WEIGHT
        return Rule(
            _string(raw_rule.get("LTarget", "")),
            _string(raw_rule.get("Operand", "")) or "=",
            _string(raw_rule.get("RTarget", "")),
            weight,
            affinity,
        )

    constraints = tuple(rule(c, False) for c in _dicts(device.get("Constraints")))
    affinities = tuple(rule(a, True) for a in _dicts(device.get("Affinities")))
    for r in (*constraints, *affinities):
        if r.operator in ("distinct_hosts", "distinct_property"):
            problems.append(f"{r.operator} is not allowed inside a device block (Nomad rejects the job)")
    return DeviceRequest(job, group, task, name, count, constraints, affinities, tuple(problems))
