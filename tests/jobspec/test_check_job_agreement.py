"""Nomad's test tables run through the real ``check-job`` command: how often does it say what Nomad does?

Every row that a job file and a fingerprint can express becomes one: the row's
values become device attributes of a saved fingerprint, its operator a device
constraint (or affinity) of a JSON job, and Nomad's answer the verdict
check-job must print ("place", "refuse" at submission, "not_placed" on this
node). ``check_job.main`` runs in-process on those files, as the command does.

A version row whose constraint Nomad's own constraint tables call unparsable
(semver's ``~> 1.0``) is refused at submission, which check-job must say.
A row cannot always be expressed: a node-level operator test has no device
block, a version row whose constraint text reads as a number tests go-version
rather than Nomad's device path (``version = "1.0"`` is a float there, and
the operator tables show what Nomad does with that), and rows marked
``check_job`` in the tables say why they are left to the unit tests. The
measured agreement and every difference are printed; the differences Nomad
and check-job may keep are listed in docs/operator.md, "Where check-job
differs from Nomad" (none come from these tables).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from nomad_plugin.cli import check_job
from nomad_plugin.jobspec.operators import parse_attribute
from nomad_plugin.nomad_view.types import Attribute, Device, DeviceGroup
from tests.jobspec.tables import (
    attribute,
    fingerprint_json,
    json_device,
    json_job,
    literal,
    mock_node,
    node,
    node_job,
    rows,
)
from tests.jobspec.test_nomad_tables import device_hcl

ATTR_GROUP = ("lab", "card", "model-x")  # the one group attribute rows live on
REQUEST = "lab/card"


@dataclass(frozen=True)
class Case:
    src: str
    groups: list[DeviceGroup]
    job: str  # JSON (API form) or HCL
    outcome: str  # place / refuse / not_placed
    chosen: tuple[str, ...] | None = None  # the groups Nomad may serve it from
    ids_subset: tuple[str, ...] = ()
    count: int | None = None
    node: dict[str, Any] | None = None  # Nomad's node JSON, given with --node
    score: float | None = None  # the node-affinity score Nomad computes


def attr_group(**attrs: Attribute) -> DeviceGroup:
    vendor, dtype, name = ATTR_GROUP
    return DeviceGroup(vendor, dtype, name, (Device("i0", True),), dict(attrs))


def one_device(device: dict[str, Any]) -> str:
    return json_job([[device]])


def rule_case(src: str, op: str, left: Attribute | None, right: Attribute | None, holds: bool) -> Case | None:
    """``${device.attr.l} <op> <right>``: right as a literal ParseAttribute reads back, else as ``${device.attr.r}``."""
    attrs = {}
    if left is not None:
        attrs["l"] = left
    if op in ("is_set", "is_not_set"):
        value = ""
    else:
        text = literal(right) if right is not None else None
        if op in ("version", "semver", "regexp") and (
            text is None or right is None or not isinstance(right.value, str)
        ):
            text = literal(right) if right is not None else None
            if text is None:
                return None
        if text is None:
            value = "${device.attr.r}"
            if right is not None:
                attrs["r"] = right
        else:
            value = text
    device = {
        "Name": REQUEST,
        "Count": 1,
        "Constraints": [{"LTarget": "${device.attr.l}", "Operand": op, "RTarget": value}],
    }
    return Case(src, [attr_group(**attrs)], one_device(device), "place" if holds else "not_placed")


def cases() -> Iterator[Case]:
    for row in rows("attribute", "compare"):
        a, b = attribute(row["a"]), attribute(row["b"])
        cmp = row["cmp"]
        op = {-1: "<", 0: "=", 1: ">"}.get(cmp, "!=") if not isinstance(cmp, str) else "!="
        case = rule_case(row["src"], op, a, b, holds=not isinstance(cmp, str))
        if case:
            yield case
    for row in rows("attribute", "parse"):
        expected = attribute(row["value"])
        assert expected is not None
        if isinstance(expected.value, float) and expected.value != expected.value:
            continue  # NaN: Nomad's comparison would panic; the operator table has that row
        device = {
            "Name": REQUEST,
            "Count": 1,
            "Constraints": [{"LTarget": "${device.attr.l}", "Operand": "=", "RTarget": row["input"]}],
        }
        yield Case(row["src"], [attr_group(l=expected)], one_device(device), "place")
    for row in rows("operators", "attribute"):
        if "check_job" in row:
            continue
        case = rule_case(row["src"], row["op"], attribute(row["l"]), attribute(row["r"]), row["holds"])
        if case:
            yield case
    unparsable = {(r["input"], r["semver"]) for r in rows("versions", "constraint_parse") if r["count"] is None}
    for row in rows("versions", "match"):
        version, constraint = row["version"], row["constraint"]
        if not isinstance(parse_attribute(constraint).value, str):
            continue  # a number to ParseAttribute: go-version's fact, not Nomad's device path
        left = Attribute(version)
        device = {
            "Name": REQUEST,
            "Count": 1,
            "Constraints": [{"LTarget": "${device.attr.l}", "Operand": row["op"], "RTarget": constraint}],
        }
        refused = row["holds"] is None or (constraint, row["op"] == "semver") in unparsable  # job validation parses it
        outcome = "refuse" if refused else "place" if row["holds"] else "not_placed"
        yield Case(row["src"], [attr_group(l=left)], one_device(device), outcome)
    for row in rows("validation", "constraint"):
        if "check_job" in row:
            continue
        device = {
            "Name": REQUEST,
            "Count": 1,
            "Constraints": [{"LTarget": row["attribute"], "Operand": row["operator"], "RTarget": row["value"]}],
        }
        yield Case(row["src"], [attr_group()], one_device(device), "refuse" if row["error"] else "valid")
    for row in rows("validation", "target"):
        if "check_job" in row:
            continue
        device = {
            "Name": REQUEST,
            "Count": 1,
            "Constraints": [{"LTarget": row["target"], "Operand": "=", "RTarget": "x"}],
        }
        yield Case(row["src"], [attr_group()], one_device(device), "refuse" if row["error"] else "valid")
    for row in rows("validation", "affinity"):
        affinity = {
            "LTarget": row["attribute"],
            "Operand": row["operator"],
            "RTarget": row["value"],
            "Weight": row["weight"],
        }
        device = {"Name": REQUEST, "Count": 1, "Affinities": [affinity]}
        yield Case(row["src"], [attr_group()], one_device(device), "refuse" if row["error"] else "valid")
    for row in rows("validation", "device"):
        spec = {"name": row["name"], "count": 1, "constraints": row["constraints"], "affinities": row["affinities"]}
        yield Case(row["src"], [attr_group()], one_device(json_device(spec)), "refuse" if row["error"] else "valid")
    for row in rows("devices", "checker"):
        job = json_job([[json_device(r) for r in row["requests"]]]) if row["requests"] else json_job([[]])
        yield Case(row["src"], node(row["node"]), job, "place" if row["result"] else "not_placed")
    for row in rows("devices", "allocator"):
        group = row["group"]
        chosen = tuple(group) if isinstance(group, list) else (group,) if group else None
        yield Case(
            row["src"], node(row["node"]), one_device(json_device(row["request"])),
            "place" if chosen else "not_placed", chosen, tuple(row.get("ids_subset", [])),
        )  # fmt: skip
    for row in rows("decoder", "hcl"):
        if "error" in row:
            yield Case(
                row["src"], [attr_group()], device_hcl(row["device_body"]).replace('"gpu"', f'"{REQUEST}"'), "refuse"
            )
        elif "count" in row:
            job = device_hcl(row["device_body"]).replace('"gpu"', f'"{REQUEST}"')
            yield Case(row["src"], [attr_group()], job, "valid", count=row["count"])


def node_rule_case(src: str, op: str, left: str | None, right: str | None, holds: bool) -> Case:
    """``${meta.l} <op> <right>`` as a group constraint on a node whose meta holds the row's values.

    The right side is written as a literal, as a job author would, unless it is missing, empty or
    looks like a target: then it is ``${meta.r}``.
    """
    meta = {k: v for k, v in (("l", left), ("r", right)) if v is not None}
    if op in ("is_set", "is_not_set"):
        value = ""
    elif right is None or right == "" or right.startswith("${"):
        value = "${meta.r}"
    else:
        value = right
    job = node_job({"group": {"Constraints": [["${meta.l}", op, value]]}})
    return Case(src, [attr_group()], job, "place" if holds else "not_placed", node=mock_node({"Meta": meta}))


def node_cases() -> Iterator[Case]:
    """Nomad's node-level rows: each rule a group constraint (or affinity) of a job without devices."""
    for row in rows("operators", "string"):
        left, right = row["l"], row["r"]
        if isinstance(left, int) or isinstance(right, int):
            continue  # a Go int: node values are strings; the unit tests hold these rows
        if right is None and row["op"] in ("version", "semver", "regexp"):
            continue  # "${meta.r}" is no version constraint Nomad's validation accepts
        yield node_rule_case(row["src"], row["op"], left, right, row["holds"])
    unparsable = {(r["input"], r["semver"]) for r in rows("versions", "constraint_parse") if r["count"] is None}
    for row in rows("versions", "match"):
        if isinstance(row["version"], int):
            continue
        case = node_rule_case(row["src"], row["op"], row["version"], row["constraint"], bool(row["holds"]))
        if row["holds"] is None or (row["constraint"], row["op"] == "semver") in unparsable:
            case = Case(case.src, case.groups, case.job, "refuse", node=case.node)
        yield case
    for row in rows("validation", "constraint"):
        job = node_job({"group": {"Constraints": [[row["attribute"], row["operator"], row["value"]]]}})
        yield Case(row["src"], [attr_group()], job, "refuse" if row["error"] else "valid", node=mock_node())
    for row in rows("validation", "target"):
        if row["target"] == "":
            continue  # an empty attribute fails the required-attribute check too
        job = node_job({"group": {"Constraints": [[row["target"], "=", "x"]]}})
        yield Case(row["src"], [attr_group()], job, "refuse" if row["error"] else "valid", node=mock_node())
    for row in rows("validation", "affinity"):
        spec = [row["attribute"], row["operator"], row["value"], row["weight"]]
        job = node_job({"group": {"Affinities": [spec]}})
        yield Case(row["src"], [attr_group()], job, "refuse" if row["error"] else "valid", node=mock_node())
    for row in rows("node", "resolve"):
        if "check_job" in row:
            continue
        spec = [row["target"], "=", row["value"]] if row["found"] else [row["target"], "is_not_set", ""]
        yield Case(row["src"], [attr_group()], node_job({"group": {"Constraints": [spec]}}), "place", node=mock_node())
    for row in rows("node", "checker"):
        job = node_job({"group": {"Constraints": row["constraints"]}})
        outcome = "place" if row["result"] else "not_placed"
        yield Case(row["src"], [attr_group()], job, outcome, node=mock_node(row["node"]))
    for row in rows("node", "affinity"):
        job = node_job({"group": {"Affinities": row["affinities"]}})
        yield Case(row["src"], [attr_group()], job, "place", node=mock_node(row["node"]), score=row["score"])
    for row in rows("node", "spread"):
        job = node_job({"group": {"Spreads": [[row["attribute"], row["weight"], row["targets"]]]}})
        yield Case(row["src"], [attr_group()], job, "refuse" if row["error"] else "place", node=mock_node())
    for row in rows("node", "job"):
        job = node_job(row["rules"], row["type"])
        yield Case(row["src"], [attr_group()], job, "refuse" if row["error"] else "place", node=mock_node())


def run(case: Case, tmp: Path, capsys: pytest.CaptureFixture[str]) -> tuple[bool, str]:
    fp, job = tmp / "fp.json", tmp / ("job.json" if case.job.lstrip().startswith("{") else "job.hcl")
    fp.write_text(fingerprint_json(case.groups))
    job.write_text(case.job)
    extra = ["--node-value", "node.pool=default"]  # the tables' nodes are in the default pool (mock.Node)
    if case.node is not None:
        (tmp / "node.json").write_text(json.dumps(case.node))
        extra = ["--node", str(tmp / "node.json")]
    code = check_job.main([str(job), "--fingerprint", str(fp), "--json", *extra])
    doc = json.loads(capsys.readouterr().out)
    outcome = doc["outcome"]
    want_code = {"place": 0, "refuse": 2, "not_placed": 1}
    if case.outcome == "valid":
        agrees = outcome != "refuse"
    else:
        agrees = outcome == case.outcome and code == want_code[case.outcome]
    if agrees and case.chosen:
        (req,) = doc["requests"]
        agrees = req["chosen"] in case.chosen and set(case.ids_subset) <= set(req["picked_ids"])
    if agrees and case.count is not None:
        agrees = doc["requests"][0]["count"] == case.count
    if agrees and case.score is not None:
        (group,) = doc["node_rules"]["groups"]
        agrees = group["affinity_score"] is not None and abs(group["affinity_score"] - case.score) < 1e-12
    rules = doc["node_rules"]
    said = f"{outcome} (exit {code}): " + "; ".join(
        [
            *(p for r in doc["requests"] for p in r["problems"]),
            *(w for r in doc["requests"] for w in r["why"]),
            *rules["problems"],
            *(p for g in rules["groups"] for p in g["problems"]),
            *(
                f"{c['attribute']} {c['operator']} {c['value']!r}: {c['status']} {c['reason']}"
                for g in rules["groups"]
                for c in g["constraints"]
                if c["status"] != "holds"
            ),
        ]
    )
    return agrees, said


def test_check_job_agrees_with_nomads_tables(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    all_cases = [*cases(), *node_cases()]
    differences = []
    for case in all_cases:
        agrees, said = run(case, tmp_path, capsys)
        if not agrees:
            differences.append(f"{case.src}: Nomad {case.outcome}, check-job {said}")
    agreed = len(all_cases) - len(differences)
    share = agreed / len(all_cases)
    with capsys.disabled():
        print(f"\ncheck-job vs Nomad's tables: {agreed}/{len(all_cases)} rows agree ({share:.1%})")
        for line in differences:
            print("  differs:", line)
    assert len(all_cases) >= 150 and sum(1 for c in all_cases if c.node is not None) >= 150
    assert differences == [], "\n".join(differences)
