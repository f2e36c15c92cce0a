"""Find every ``device`` block of a Nomad job file (python-hcl2), as plain requests.

Placement is ``job -> group -> task -> resources -> device "<name>"``
(nomad-protocol.md §6). Constraint blocks accept Nomad's sugar
(``version = ...``, ``regexp = ...``, ``set_contains = ...``,
``distinct_hosts = true``, ``distinct_property = ...``); values become strings
the way Nomad's jobspec decoder converts them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import hcl2

from nomad_plugin.launcher.hclvalue import is_expression, labelled, plain, unlabelled

DEFAULT_AFFINITY_WEIGHT = 50
# constraint sugar: attribute name -> operator
_SUGAR = {
    "version": "version",
    "semver": "semver",
    "regexp": "regexp",
    "set_contains": "set_contains",
    "set_contains_all": "set_contains_all",
    "set_contains_any": "set_contains_any",
    "distinct_property": "distinct_property",
}


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


def _rules(blocks: Any, affinity: bool, problems: list[str]) -> list[Rule]:
    rules: list[Rule] = []
    for body in unlabelled(blocks):
        attribute = _string(body.get("attribute", ""))
        operator = _string(body.get("operator", "")) or "="
        value = _string(body.get("value", ""))
        for key, op in _SUGAR.items():
            if key in body:
                operator = op
                value = _string(body[key]) if key != "distinct_property" else ""
                if key == "distinct_property":
                    attribute = _string(body[key])
        if "distinct_hosts" in body:
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
    problems: list[str] = []
    raw_count = body.get("count", 1)
    count = 1
    if is_expression(raw_count) or isinstance(raw_count, bool) or not isinstance(raw_count, int):
        problems.append(f"count = {plain(raw_count)!r} is not a literal whole number (variables are not evaluated)")
    elif raw_count < 1:
        problems.append(f"count = {raw_count}: a device count must be at least 1")
    else:
        count = raw_count
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
    try:
        parsed = hcl2.loads(text)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise JobParseError(f"{source} is not valid HCL: {first}") from None
    return device_requests(parsed)
