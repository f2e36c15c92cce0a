"""The Prometheus alert rules (deploy/prometheus) checked by Prometheus's own promtool.

``promtool check rules`` parses every expression and template as Prometheus would load them, and
``promtool test rules`` evaluates the rules over synthetic series: each alert must stay silent
until its ``for`` has passed (or while the condition is false) and then fire with its labels and
its rendered annotations. promtool comes from Debian's ``prometheus`` package, unpacked (not
installed) into ``build/promtool`` by ``make promtool``; CI fails when it is missing, elsewhere
the tests skip and say how to get it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "nomad-device-lingjun.rules.yml"
PROMTOOL = ROOT / "build" / "promtool" / "usr" / "bin" / "promtool"


def promtool() -> Path:
    if PROMTOOL.is_file():
        return PROMTOOL
    found = shutil.which("promtool")
    if found:
        return Path(found)
    if os.environ.get("CI"):
        pytest.fail(f"promtool is missing at {PROMTOOL}: `make test` runs `make promtool` first")
    pytest.skip("promtool is not installed: run `make promtool` (unpacks Debian's prometheus package into build/)")


def rules() -> dict[str, dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    return {r["alert"]: r for g in doc["groups"] for r in g["rules"]}


def render(template: str, labels: dict[str, str], value: str) -> str:
    """The few template forms the rules use: ``{{ $labels.x }}`` and ``{{ $value }}``."""
    text = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels.get(m.group(1), ""), template)
    return text.replace("{{ $value }}", value)


@dataclass
class Case:
    """One alert over one set of input series: silent at ``quiet_at``, firing at ``fires_at``."""

    alert: str
    series: dict[str, str]
    quiet_at: str
    fires_at: str
    labels: dict[str, str]
    value: str = ""
    silent_series: dict[str, str] = field(default_factory=dict)


CASES = [
    Case("LingjunXdmUnreachable", {'lingjun_plugin_xdm_up{instance="n1"}': "1 0 0 0 0 0"}, "2m", "4m", {"instance": "n1"}),
    Case(
        "LingjunXdmSchemaMismatch",
        {'lingjun_plugin_xdm_schema_mismatch{instance="n1"}': "0 0 1 1 1"},
        "2m", "4m", {"instance": "n1"},
    ),
    Case(
        "LingjunLeakedGrants",
        {'lingjun_plugin_leaked_grants_found_total{instance="n1"}': "0 0 0 1 1 1"},
        "2m", "4m", {"instance": "n1"},
    ),
    Case(
        "LingjunUnverifiableGrants",
        {'lingjun_plugin_unverifiable_grants{instance="n1"}': "0 2x20"},
        "10m", "20m", {"instance": "n1"}, value="2",
    ),
    Case(
        "LingjunStaleDeviceStats",
        {'lingjun_device_metrics_age_seconds{instance="n1",uuid="GPU-a",minor="3"}': "1 200+60x10"},
        "4m", "8m", {"instance": "n1", "uuid": "GPU-a", "minor": "3"},
    ),
    Case(
        "LingjunReserveSlow",
        {
            'lingjun_plugin_reserve_duration_seconds_bucket{instance="n1",le="1"}': "0+1x30",
            'lingjun_plugin_reserve_duration_seconds_bucket{instance="n1",le="5"}': "0+10x30",
            'lingjun_plugin_reserve_duration_seconds_bucket{instance="n1",le="+Inf"}': "0+10x30",
        },
        "5m", "25m", {"instance": "n1"},
    ),
    Case(
        "LingjunReserveErrors",
        {'lingjun_plugin_reserve_errors_total{instance="n1",kind="xdm"}': "0 0 0 2 2"},
        "2m", "4m", {"instance": "n1", "kind": "xdm"},
    ),
    Case(
        "LingjunDeviceUnhealthy",
        {'lingjun_device_healthy{instance="n1",minor="2",model="H800",uuid="GPU-b"}': "1 0x10"},
        "3m", "8m", {"instance": "n1", "minor": "2", "model": "H800", "uuid": "GPU-b"},
        silent_series={'lingjun_device_healthy{instance="n1",minor="1",model="H800",uuid="GPU-c"}': "1x10"},
    ),
]  # fmt: skip


def unit_test_file(tmp_path: Path, cases: list[Case]) -> Path:
    """One promtool test group per case, each with its own series."""
    known = rules()
    tests = []
    for case in cases:
        rule = known[case.alert]
        labels = {**case.labels, **rule.get("labels", {})}
        annotations = {k: render(v, case.labels, case.value) for k, v in rule.get("annotations", {}).items()}
        series = {**case.series, **case.silent_series}
        tests.append(
            {
                "interval": "1m",
                "input_series": [{"series": s, "values": v} for s, v in series.items()],
                "alert_rule_test": [
                    {"eval_time": case.quiet_at, "alertname": case.alert, "exp_alerts": []},
                    {
                        "eval_time": case.fires_at,
                        "alertname": case.alert,
                        "exp_alerts": [{"exp_labels": labels, "exp_annotations": annotations}],
                    },
                ],
            }
        )
    path = tmp_path / "rules.test.yml"
    path.write_text(yaml.safe_dump({"rule_files": [str(RULES)], "evaluation_interval": "1m", "tests": tests}))
    return path


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(promtool()), *args], capture_output=True, text=True, timeout=120)


def test_promtool_loads_every_rule() -> None:
    out = run("check", "rules", str(RULES))
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(rules())} rules found" in out.stdout


def test_every_listed_alert_exists() -> None:
    assert {c.alert for c in CASES} <= set(rules())


def test_alerts_stay_silent_then_fire_with_their_labels_and_text(tmp_path: Path) -> None:
    out = run("test", "rules", str(unit_test_file(tmp_path, CASES)))
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_unit_tests_can_fail(tmp_path: Path) -> None:
    """A case whose alert never fires must fail promtool: the harness above is not vacuous."""
    healthy = Case(
        "LingjunXdmUnreachable", {'lingjun_plugin_xdm_up{instance="n1"}': "1x6"}, "2m", "4m", {"instance": "n1"}
    )
    out = run("test", "rules", str(unit_test_file(tmp_path, [healthy])))
    assert out.returncode != 0 and "LingjunXdmUnreachable" in out.stdout + out.stderr
