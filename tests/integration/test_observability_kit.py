"""The observability kit (deploy/): every metric the Grafana dashboard and the
Prometheus alert rules name is served by the real plugin's /metrics.

The plugin runs under the Go conformance host against a simulated XDM node
with ``metrics_port`` set, makes a grant, and is scraped over HTTP. The metric
names are parsed out of the PromQL expressions (functions, keywords, label
matchers, ranges and grouping labels removed), so a renamed metric or a typo
in a panel fails here rather than as an empty panel or a silent alert.
"""

from __future__ import annotations

import json
import re
import socket
import time
from pathlib import Path
from typing import Any

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.conformance.hostlib import HostProcess, start_host
from tests.integration.harness import Node, first_fingerprint_with_devices, reserve, set_of, sim_node

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "nomad-device-lingjun.json"
RULES = ROOT / "deploy" / "prometheus" / "nomad-device-lingjun.rules.yml"
KEYWORDS = frozenset({"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "bool"})
KEYWORDS |= {"offset", "inf", "nan"}
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_MATCHERS = re.compile(r"\{[^}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_WORD = re.compile(r"(?<![\w.$])[A-Za-z_:][A-Za-z0-9_:]*")


def promql_metric_names(expr: str) -> set[str]:
    """Metric names an expression selects: identifiers that are not functions, keywords or labels."""
    text = _GROUPING.sub(" ", _RANGE.sub("", _MATCHERS.sub("", _STRING.sub('""', expr))))
    names = set()
    for match in _WORD.finditer(text):
        if text[match.end() :].lstrip().startswith("(") or match.group(0).lower() in KEYWORDS:
            continue
        names.add(match.group(0))
    return names


def test_the_extractor_finds_names_and_only_names() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (instance, le) (rate(a_bucket{instance=~"$instance", x="y{z}"}'
        "[$__rate_interval]))) > 2 and on (instance) b_total offset 5m or vector(0) unless max without (uuid) (c)"
    )
    assert promql_metric_names(expr) == {"a_bucket", "b_total", "c"}
    assert promql_metric_names("1e3 < lingjun_x") == {"lingjun_x"}


def dashboard_exprs() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    exprs: list[str] = []

    def walk(panels: list[dict[str, Any]]) -> None:
        for panel in panels:
            exprs.extend(t["expr"] for t in panel.get("targets", []) if t.get("expr"))
            walk(panel.get("panels", []))

    walk(dash["panels"])
    for var in dash["templating"]["list"]:
        query = var.get("query")
        text = query.get("query", "") if isinstance(query, dict) else ""
        found = re.fullmatch(r"label_values\((\w+),\s*\w+\)", text)
        if found:
            exprs.append(found.group(1))
    return exprs


def rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def test_kit_files_are_well_formed() -> None:
    dash = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    assert len(dashboard_exprs()) >= 15
    alerts = rules()
    names = [r["alert"] for r in alerts]
    assert len(names) == len(set(names))
    for rule in alerts:
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule["alert"]
    topics = " ".join(r["expr"] for r in alerts)
    for metric in (
        "lingjun_plugin_leaked_grants_found_total",
        "lingjun_plugin_unverifiable_grants",
        "lingjun_plugin_xdm_up",
        "lingjun_plugin_xdm_schema_mismatch",
        "lingjun_device_metrics_age_seconds",
        "lingjun_plugin_reconcile_errors_total",
        "lingjun_plugin_reserve_duration_seconds_bucket",
    ):
        assert metric in topics, f"no alert on {metric}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def exposed_names(text: str) -> set[str]:
    """Every name a PromQL selector may use against this exposition."""
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        names.update(sample.name for sample in family.samples)
        if family.type == "counter":
            names.add(family.name + "_total")
        if family.type == "histogram":
            names.update(family.name + suffix for suffix in ("_bucket", "_sum", "_count"))
    return names


def _scrape(port: int, want: str, timeout: float = 30.0) -> str:
    """/metrics once it contains ``want`` (the endpoint starts with the engines)."""
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        try:
            last = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
            if want in last:
                return last
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"/metrics on port {port} never showed {want!r} within {timeout} s; last:\n{last[-2000:]}")


def _launch(node: Node, conformance_host: Path, port: int) -> HostProcess:
    sets = (set_of("metrics_port", port), set_of("container_mounts", "never"))
    proc = start_host([*node.plugin_args(*sets, phase="run"), "--duration", "0"], binary=conformance_host)
    first_fingerprint_with_devices(proc)
    return proc


def test_every_metric_the_dashboard_and_rules_name_is_served(node: Node, conformance_host: Path) -> None:
    port = _free_port()
    proc = _launch(node, conformance_host, port)
    try:
        uuid = node.sim.cards[0].uuid
        assert reserve(proc, [uuid], "one")["ok"] is True
        assert reserve(proc, ["no-such-device"], "bad", expect="error")["ok"] is False
        text = _scrape(port, "lingjun_device_metrics_age_seconds{")
    finally:
        proc.finish()
    served = exposed_names(text)
    named = {n for e in dashboard_exprs() + [r["expr"] for r in rules()] for n in promql_metric_names(e)}
    assert named, "no metric names parsed from the kit"
    missing = sorted(named - served)
    assert not missing, f"named by deploy/ but not served by the plugin: {missing}"
    for name in ("lingjun_plugin_xdm_up", "lingjun_plugin_xdm_schema_mismatch", "lingjun_plugin_unverifiable_grants"):
        assert re.search(rf"^{name} 0\.0$|^{name} 1\.0$", text, re.M), f"{name} has no sample"
    assert re.search(r"^lingjun_plugin_xdm_up 1\.0$", text, re.M)
    assert re.search(r"^lingjun_plugin_xdm_schema_mismatch 0\.0$", text, re.M)
    assert re.search(r'^lingjun_plugin_reserve_errors_total\{kind="\w+"\} 1\.0$', text, re.M)


def test_schema_mismatch_gauge_rises_when_xdm_speaks_another_schema(conformance_host: Path) -> None:
    with sim_node("h800-8", drift="package=zz.other") as node:
        port = _free_port()
        sets = (set_of("metrics_port", port),)
        proc = start_host([*node.plugin_args(*sets, phase="run"), "--duration", "0"], binary=conformance_host)
        try:
            proc.wait_for(lambda e: e["event"] == "fingerprint", timeout=30)
            text = _scrape(port, "lingjun_plugin_xdm_schema_mismatch 1.0")
        finally:
            proc.finish()
    assert re.search(r"^lingjun_plugin_xdm_up 0\.0$", text, re.M)
