"""Nomad's own test tables (nomad_tables/*.json), and how a row becomes plugin values or a check-job run.

Every row names the Nomad (or go-version) file and test it comes from, or
the source function a derived row reads. The expected values are Nomad's,
carried over; nothing here computes them.
"""

from __future__ import annotations

import json
import math
from functools import cache
from pathlib import Path
from typing import Any

from nomad_plugin.nomad_view.types import Attribute, Device, DeviceGroup

TABLES = Path(__file__).parent / "nomad_tables"


@cache
def table(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((TABLES / f"{name}.json").read_text())
    return data


def rows(name: str, section: str) -> list[dict[str, Any]]:
    return list(table(name)[section])


def row_id(row: dict[str, Any]) -> str:
    """A pytest id: the test (or function) and the row's inputs."""
    src = row["src"].split(" ", 1)[-1] if " " in row["src"] else row["src"]
    keys = [k for k in row if k not in ("src",)]
    return f"{src[:60]}|" + ",".join(str(row[k])[:30] for k in keys[:3])


def attribute(value: dict[str, Any] | None) -> Attribute | None:
    """A table value ({"int": 3, "unit": "MB"}, {"float": "nan"}, ...) as the plugin's Attribute."""
    if value is None:
        return None
    unit = value.get("unit", "")
    if "float" in value:
        return Attribute(float(value["float"]), unit)  # a string is a Go special: "inf", "-inf", "nan"
    for key in ("int", "string", "bool"):
        if key in value:
            return Attribute(value[key], unit)
    raise ValueError(f"not a table value: {value}")


def same_attribute(a: Attribute, b: Attribute) -> bool:
    """Equal values of the same Go type (NaN equals NaN: the same parse)."""
    if type(a.value) is not type(b.value) or a.unit != b.unit:
        return False
    if isinstance(a.value, float) and isinstance(b.value, float) and math.isnan(a.value):
        return math.isnan(b.value)
    return a.value == b.value


def literal(value: Attribute) -> str | None:
    """A constraint literal that ParseAttribute reads back as exactly ``value``, or None."""
    from nomad_plugin.jobspec.operators import parse_attribute

    if isinstance(value.value, bool):
        text = "true" if value.value else "false"
    elif isinstance(value.value, float):
        text = repr(value.value) if math.isfinite(value.value) else str(value.value)
    else:
        text = str(value.value)
    text += value.unit
    return text if same_attribute(parse_attribute(text), value) else None


def group(spec: dict[str, Any]) -> DeviceGroup:
    attrs = {k: a for k, v in spec.get("attributes", {}).items() if (a := attribute(v)) is not None}
    devices = tuple(Device(i["id"], i["healthy"]) for i in spec.get("instances", []))
    return DeviceGroup(spec["vendor"], spec["type"], spec["name"], devices, attrs)


def node(names: list[str]) -> list[DeviceGroup]:
    specs = table("devices")["groups"]
    return [group(specs[n]) for n in names]


def json_job(tasks: list[list[dict[str, Any]]]) -> str:
    """A job in the API's JSON form: one task group, a task per list of device requests."""
    return json.dumps(
        {
            "Job": {
                "ID": "t",
                "Name": "t",
                "TaskGroups": [
                    {
                        "Name": "g",
                        "Tasks": [
                            {"Name": f"t{i}", "Driver": "raw_exec", "Resources": {"Devices": devices}}
                            for i, devices in enumerate(tasks)
                        ],
                    }
                ],
            }
        }
    )


def json_device(request: dict[str, Any]) -> dict[str, Any]:
    """A table request ({"name", "count", "constraints", "affinities"}) as an API device."""
    return {
        "Name": request["name"],
        "Count": request["count"],
        "Constraints": [{"LTarget": c[0], "Operand": c[1], "RTarget": c[2]} for c in request.get("constraints", [])],
        "Affinities": [
            {"LTarget": a[0], "Operand": a[1], "RTarget": a[2], "Weight": a[3]} for a in request.get("affinities", [])
        ],
    }


def fingerprint_json(groups: list[DeviceGroup]) -> str:
    """What ``fingerprint --json`` writes, which ``check-job --fingerprint`` reads."""
    return json.dumps({"groups": [g.to_json() for g in groups]}, allow_nan=True)


# --- node-level rules (nomad_tables/node.json) -----------------------------------------------


def mock_node(changes: dict[str, Any] | None = None) -> dict[str, Any]:
    """Nomad's mock.Node() as node JSON (``GET /v1/node/<id>``) with a row's changes (maps merged key by key)."""
    base = table("node")["mock_node"]
    node = {k: (dict(v) if isinstance(v, dict) else v) for k, v in base.items()}
    for key, value in (changes or {}).items():
        if isinstance(value, dict):
            node[key] = {**node.get(key, {}), **value}
        else:
            node[key] = value
    return node


def api_rule(spec: list[Any]) -> dict[str, Any]:
    """A table rule ([attribute, operator, value] or with a weight) in the API form."""
    out: dict[str, Any] = {"LTarget": spec[0], "Operand": spec[1], "RTarget": spec[2]}
    if len(spec) > 3:
        out["Weight"] = spec[3]
    return out


def api_spread(spec: list[Any]) -> dict[str, Any]:
    """A table spread ([attribute, weight, [[value, percent], ...]]) in the API form."""
    return {
        "Attribute": spec[0],
        "Weight": spec[1],
        "SpreadTarget": [{"Value": v, "Percent": p} for v, p in spec[2]],
    }


def _level(rules: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind, items in rules.items():
        out[kind] = [api_spread(i) if kind == "Spreads" else api_rule(i) for i in items]
    return out


def node_job(rules: dict[str, dict[str, Any]], job_type: str = "batch") -> str:
    """A JSON job of one group and one task (no device) with rules per level ("job", "group", "task")."""
    task = {"Name": "t", "Driver": "raw_exec", **_level(rules.get("task", {}))}
    group = {"Name": "g", "Tasks": [task], **_level(rules.get("group", {}))}
    job = {"ID": "n", "Name": "n", "Type": job_type, "TaskGroups": [group], **_level(rules.get("job", {}))}
    return json.dumps({"Job": job})
