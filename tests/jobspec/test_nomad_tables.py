"""Nomad's own test tables, row by row, against the plugin's pure functions (jobspec/).

Each table row cites its Nomad (or go-version) file and test, or the source
function it was derived from; tables.py says how rows are read. A row that
fails here is a difference from Nomad: fix the code, never the row.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from nomad_plugin.jobspec import golang
from nomad_plugin.jobspec.evaluate import device_checker, evaluate_request
from nomad_plugin.jobspec.node import NodeValues, node_from_json, place_group
from nomad_plugin.jobspec.operators import check_attribute, check_string, compare, parse_attribute
from nomad_plugin.jobspec.parse import (
    DeviceRequest,
    ParsedJob,
    Rule,
    Spread,
    parse_job,
    parse_job_text,
    validate_affinity,
    validate_constraint,
    validate_device,
    validate_spread,
    validate_target,
)
from tests.jobspec.tables import attribute, mock_node, node, node_job, row_id, rows, same_attribute

TABLE_SECTIONS = {
    "attribute": ("compare", "parse"),
    "operators": ("attribute", "string"),
    "versions": ("match", "constraint_parse", "version_parse", "compare"),
    "validation": ("constraint", "target", "affinity", "device"),
    "devices": ("checker", "allocator"),
    "decoder": ("hcl",),
    "node": ("resolve", "checker", "affinity", "spread", "job"),
}


def test_every_row_cites_its_source_and_there_are_enough() -> None:
    total = 0
    for name, sections in TABLE_SECTIONS.items():
        for section in sections:
            for row in rows(name, section):
                words = row["src"].split()
                assert any(w.endswith(".go") for w in words) and len(words) >= 2, f"{row['src']!r}: no Go file and test"
                total += 1
    assert total >= 150, total


# --- plugins/shared/structs: ParseAttribute and Compare ------------------------------------------


@pytest.mark.parametrize("row", rows("attribute", "compare"), ids=row_id)
def test_attribute_compare(row: dict[str, Any]) -> None:
    a, b = attribute(row["a"]), attribute(row["b"])
    assert a is not None and b is not None
    result = compare(a, b)
    if row["cmp"] == "panic":
        assert result.panic and result.order is None
    elif row["cmp"] == "not comparable":
        assert result.order is None and result.why and not result.panic
    else:
        assert result.order == row["cmp"], result


@pytest.mark.parametrize("row", rows("attribute", "parse"), ids=row_id)
def test_parse_attribute(row: dict[str, Any]) -> None:
    expected = attribute(row["value"])
    assert expected is not None
    got = parse_attribute(row["input"])
    assert same_attribute(got, expected), (got, expected)


# --- scheduler/feasible: the operators -------------------------------------------------------


@pytest.mark.parametrize("row", rows("operators", "attribute"), ids=row_id)
def test_check_attribute_constraint(row: dict[str, Any]) -> None:
    outcome = check_attribute(row["op"], attribute(row["l"]), attribute(row["r"]))
    assert outcome.holds is row["holds"], outcome
    assert bool(outcome.panic) is bool(row.get("panic")), outcome


@pytest.mark.parametrize("row", rows("operators", "string"), ids=row_id)
def test_check_constraint(row: dict[str, Any]) -> None:
    assert check_string(row["op"], row["l"], row["r"]).holds is row["holds"]


# --- versions: go-version and Nomad's semver -------------------------------------------------


@pytest.mark.parametrize("row", rows("versions", "match"), ids=row_id)
def test_version_match(row: dict[str, Any]) -> None:
    semver = row["op"] == "semver"
    parsed = golang.parse_constraints(row["constraint"], semver=semver)
    if row["holds"] is None:
        assert isinstance(parsed, str)
        return
    version = row["version"]
    outcome = check_string(row["op"], version, row["constraint"])
    assert outcome.holds is row["holds"], outcome
    # the same through the device path: a string (or integer) attribute and a string constraint
    left = parse_attribute(version) if isinstance(version, str) else None
    device_left = left if left is not None and isinstance(left.value, str) else None
    if isinstance(version, int):
        from nomad_plugin.nomad_view.types import Attribute

        device_left = Attribute(version)
    if device_left is not None:
        from nomad_plugin.nomad_view.types import Attribute

        assert check_attribute(row["op"], device_left, Attribute(row["constraint"])).holds is row["holds"]


@pytest.mark.parametrize("row", rows("versions", "constraint_parse"), ids=row_id)
def test_constraint_parse(row: dict[str, Any]) -> None:
    parsed = golang.parse_constraints(row["input"], semver=row["semver"])
    if row["count"] is None:
        assert isinstance(parsed, str), parsed
    else:
        assert not isinstance(parsed, str), parsed
        assert len(parsed.clauses) == row["count"]


@pytest.mark.parametrize("row", rows("versions", "version_parse"), ids=row_id)
def test_version_parse(row: dict[str, Any]) -> None:
    assert (golang.parse_version(row["input"], strict=row["strict"]) is not None) is row["valid"]


@pytest.mark.parametrize("row", rows("versions", "compare"), ids=row_id)
def test_version_compare(row: dict[str, Any]) -> None:
    a = golang.parse_version(row["a"])
    b = golang.parse_version(row["b"], strict=row["b_strict"])
    assert a is not None and b is not None
    assert golang.compare_versions(a, b) == row["cmp"]


# --- nomad/structs: job validation -----------------------------------------------------------


def _one_error(errors: list[str], fragment: str) -> None:
    if fragment:
        assert any(fragment in e for e in errors), errors
    else:
        assert errors == []


@pytest.mark.parametrize("row", rows("validation", "constraint"), ids=row_id)
def test_constraint_validate(row: dict[str, Any]) -> None:
    _one_error(validate_constraint(Rule(row["attribute"], row["operator"], row["value"])), row["error"])


@pytest.mark.parametrize("row", rows("validation", "target"), ids=row_id)
def test_validate_constraint_target(row: dict[str, Any]) -> None:
    error = validate_target(row["target"])
    assert (row["error"] in error and error) if row["error"] else error == "", error


@pytest.mark.parametrize("row", rows("validation", "affinity"), ids=row_id)
def test_affinity_validate(row: dict[str, Any]) -> None:
    rule = Rule(row["attribute"], row["operator"], row["value"], row["weight"], affinity=True)
    _one_error(validate_affinity(rule), row["error"])


def table_request(spec: dict[str, Any], task: str = "t") -> DeviceRequest:
    constraints = tuple(Rule(c[0], c[1], c[2]) for c in spec.get("constraints", []))
    affinities = tuple(Rule(a[0], a[1], a[2], a[3], affinity=True) for a in spec.get("affinities", []))
    return DeviceRequest("j", "g", task, spec["name"], spec.get("count", 1), constraints, affinities)


@pytest.mark.parametrize("row", rows("validation", "device"), ids=row_id)
def test_requested_device_validate(row: dict[str, Any]) -> None:
    spec = {"name": row["name"], "constraints": row["constraints"], "affinities": row["affinities"]}
    _one_error(validate_device(table_request(spec)), row["error"])


# --- scheduler/feasible: DeviceChecker and the allocator ---------------------------------------


@pytest.mark.parametrize("row", rows("devices", "checker"), ids=row_id)
def test_device_checker(row: dict[str, Any]) -> None:
    requests = [table_request(r) for r in row["requests"]]
    assert device_checker(requests, node(row["node"])) is row["result"]


@pytest.mark.parametrize("row", rows("devices", "allocator"), ids=row_id)
def test_device_allocator(row: dict[str, Any]) -> None:
    verdict = evaluate_request(table_request(row["request"]), node(row["node"]))
    wanted = row["group"]
    if wanted is None:
        assert verdict.chosen is None, verdict.chosen
        return
    assert verdict.chosen is not None, [g.reasons for g in verdict.groups]
    options = wanted if isinstance(wanted, list) else [wanted]
    assert verdict.chosen.group.full_name in options
    if isinstance(wanted, list):
        assert sorted([verdict.chosen.group.full_name, *verdict.ties]) == sorted(options)  # Nomad may pick any
    assert set(row.get("ids_subset", [])) <= set(verdict.picked_ids)
    assert len(verdict.picked_ids) == row["request"]["count"]
    if "zero_score" in row:
        matched = sum(r.rule.weight for r in verdict.chosen.affinities if r.passed)
        assert (matched == 0) is row["zero_score"]


# --- jobspec2: HCL decoding ----------------------------------------------------------------------


def device_hcl(body: str) -> str:
    inner = "\n".join("        " + line for line in body.splitlines())
    return (
        'job "j" {\n  group "g" {\n    task "t" {\n      driver = "raw_exec"\n      resources {\n'
        f'        device "gpu" {{\n{inner}\n        }}\n      }}\n    }}\n  }}\n}}\n'
    )


@pytest.mark.parametrize("row", rows("decoder", "hcl"), ids=row_id)
def test_hcl_decoding(row: dict[str, Any]) -> None:
    (request,) = parse_job_text(device_hcl(row["device_body"]))
    if "error" in row:
        assert any(row["error"] in p for p in request.problems), request.problems
        return
    assert request.problems == ()
    if "count" in row:
        assert request.count == row["count"]
    if "rules" in row:
        got = [[r.attribute, r.operator, r.value, r.weight] for r in (*request.constraints, *request.affinities)]
        assert got == row["rules"]


def test_nan_is_a_float_that_never_equals_itself() -> None:
    """The NaN rows above rely on this reading of the table values."""
    value = attribute({"float": "nan"})
    assert value is not None and isinstance(value.value, float) and math.isnan(value.value)


# --- node-level rules: resolveTarget, ConstraintChecker, NodeAffinityIterator, job validation ---


def node_values(changes: dict[str, Any] | None = None) -> NodeValues:
    return NodeValues(node_from_json(mock_node(changes), "mock node"))


@pytest.mark.parametrize("row", rows("node", "resolve"), ids=row_id)
def test_resolve_constraint_target(row: dict[str, Any]) -> None:
    resolved = node_values().resolve(row["target"])
    assert resolved.known
    assert (resolved.value is not None) is row["found"], resolved
    if row["found"]:
        assert resolved.value == row["value"]


def _group_rules(rules: dict[str, dict[str, Any]], job_type: str = "batch") -> ParsedJob:
    return parse_job(node_job(rules, job_type), "job.json")


@pytest.mark.parametrize("row", rows("node", "checker"), ids=row_id)
def test_constraint_checker(row: dict[str, Any]) -> None:
    job = _group_rules({"group": {"Constraints": row["constraints"]}})
    (group,) = job.groups
    assert not group.problems and not job.problems, (group.problems, job.problems)
    placement = place_group(group, node_values(row["node"]))
    assert (placement.outcome == "place") is row["result"], placement.constraints


@pytest.mark.parametrize("row", rows("node", "affinity"), ids=row_id)
def test_node_affinity_iterator(row: dict[str, Any]) -> None:
    (group,) = _group_rules({"group": {"Affinities": row["affinities"]}}).groups
    placement = place_group(group, node_values(row["node"]))
    assert placement.outcome == "place"  # an affinity never keeps a group off a node
    assert placement.score is not None and math.isclose(placement.score, row["score"], abs_tol=1e-12), placement


@pytest.mark.parametrize("row", rows("node", "spread"), ids=row_id)
def test_spread_validate(row: dict[str, Any]) -> None:
    spread = Spread(row["attribute"], row["weight"], tuple((v, p) for v, p in row["targets"]), "group")
    _one_error(validate_spread(spread), row["error"])


@pytest.mark.parametrize("row", rows("node", "job"), ids=row_id)
def test_job_validate(row: dict[str, Any]) -> None:
    job = _group_rules(row["rules"], row["type"])
    errors = [*job.problems, *(p for g in job.groups for p in g.problems)]
    _one_error(errors, row["error"])
