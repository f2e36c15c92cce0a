"""Nomad's job validation of ``device`` blocks: what ``nomad job run`` refuses before any scheduling.

Facts from ``nomad/structs/structs.go`` (``Constraint.Validate``,
``Affinity.Validate``, ``RequestedDevice.Validate``) and
``nomad/structs/constraint.go`` (``validateConstraintAttribute``). Each
function returns Nomad's error messages (empty: valid), so check-job can
say "Nomad would refuse this job at submission" in Nomad's own words.
"""

from __future__ import annotations

import json

from nomad_plugin.jobspec import goversion, regex
from nomad_plugin.jobspec.parse import DeviceRequest, Rule

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
        problem = regex.compile_error(value)
        if problem:
            errors.append(f"Regular expression failed to compile: {problem}")
    elif op == "version":
        parsed = goversion.parse_constraints(value)
        if isinstance(parsed, str):
            errors.append(f"Version {kind} is invalid: {parsed}")
    elif op == "semver":
        parsed = goversion.parse_constraints(value, semver=True)
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
