"""The topology examples ask for keys the plugin really publishes, and the sysbatch controller's command works.

``check-job`` dry-runs the device blocks of every example (tests/operator/test_check_job.py);
the group-level rules on ``${meta.lingjun.*}`` need a cluster, so here each one
is checked against the keys the plugin publishes for the example's profile
(``node-meta --profile``), and the runtime-kit controller's command line is
run as written against a simulator.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import hcl2
import pytest

from nomad_plugin import PLUGIN_NAME
from nomad_plugin.cli import fingerprint, runtime_kit
from nomad_plugin.sim import Simulator

REPO = Path(__file__).resolve().parents[2]
JOBS = REPO / "examples" / "jobs"
META = re.compile(r"^\$\{meta\.(.+)\}$")


def unquote(value: Any) -> Any:
    if isinstance(value, str) and len(value) >= 2 and value[0] == value[-1] == '"':
        return value[1:-1]
    return value


def job(path: Path) -> dict[str, Any]:
    doc = hcl2.load(path.open())
    (body,) = doc["job"][0].values()
    return dict(body)


def profile_of(path: Path) -> str:
    header = next(line for line in path.read_text().splitlines() if line.startswith("# check-job:"))
    return header.split("--profile", 1)[1].split()[0]


def published(profile: str) -> dict[str, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert fingerprint.node_meta_command(["--profile", profile, "--json"]) == 0
    return dict(json.loads(out.getvalue()))


@pytest.mark.parametrize("name", ["multi-node-training", "hyper-node-local", "pod-spread"])
def test_group_rules_use_published_keys_that_match_the_profile(name: str) -> None:
    path = JOBS / f"{name}.nomad.hcl"
    keys = published(profile_of(path))
    rules = 0
    for group in job(path)["group"]:
        (body,) = group.values()
        for kind in ("constraint", "spread", "affinity"):
            for rule in body.get(kind, []):
                match = META.match(unquote(rule.get("attribute", "")))
                if match is None:
                    continue
                key = match.group(1)
                assert key.startswith("lingjun.") and key in keys, (name, key, sorted(keys))
                rules += 1
                operator, value = unquote(rule.get("operator", "=")), unquote(rule.get("value", ""))
                if kind != "constraint" or operator == "is_set":
                    continue
                if operator == "set_contains":
                    assert value in keys[key].split(","), (key, value, keys[key])
                elif operator == ">=":
                    assert int(keys[key]) >= int(value), (key, value)
                else:
                    assert keys[key] == value, (key, value, keys[key])
    assert rules, f"{name} has no rule on the published meta"


def test_pod_spread_no_longer_asks_for_hand_copied_meta() -> None:
    text = (JOBS / "pod-spread.nomad.hcl").read_text()
    assert "${meta.pod}" not in text and "meta { pod" not in text
    assert "node_meta = true" in text and "node-meta" in text


def test_runtime_kit_controller_runs_the_command_on_the_meta_it_names(tmp_path: Path) -> None:
    body = job(JOBS / "runtime-kit-controller.sysbatch.hcl")
    assert unquote(body["type"]) == "sysbatch"
    assert unquote(body["periodic"][0]["crons"][0]) == "0 3 * * *"  # off-peak
    groups = {name: group for g in body["group"] for name, group in g.items()}
    wanted = {'"enable"': "true", '"disable"': "false"}
    directory = Path(tempfile.mkdtemp(prefix="rkc-", dir="/tmp"))
    try:
        with Simulator(directory / "s", "h800-8", enabled=False) as sim:
            agent = tmp_path / "nomad.d"
            agent.mkdir()
            (agent / "plugin.hcl").write_text(
                f'plugin "{PLUGIN_NAME}" {{\n  config {{\n    config_socket = "{sim.config_path}"\n'
                f'    data_dir = "{tmp_path / "data"}"\n  }}\n}}\n'
            )
            for label, meta_value in wanted.items():
                group = groups[label]
                (constraint,) = group["constraint"]
                assert unquote(constraint["attribute"]) == "${meta.lj_runtimekit_enable}"
                assert unquote(constraint["value"]) == meta_value
                (task,) = group["task"][0].values()
                assert unquote(task["driver"]) == "raw_exec"
                config = task["config"][0]
                assert unquote(config["command"]).endswith(f"/{PLUGIN_NAME}")
                args = [unquote(a) for a in config["args"]]
                assert args[0] == "runtime-kit" and "--yes" in args
                args[args.index("--plugin-config") + 1] = str(agent)  # /etc/nomad.d on a real node
                with contextlib.redirect_stdout(io.StringIO()) as out:
                    assert runtime_kit.main(args[1:]) == 0
                assert sim.status()["enabled"] is (meta_value == "true"), out.getvalue()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
