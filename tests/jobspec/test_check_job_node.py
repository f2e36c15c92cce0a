"""check-job's node-level rules through the real command: where the node's values come from, and what it says.

The plugin's own keys come from the simulator the fingerprint comes from (the
same inventory, ``model/card.py``), the rest of the node from a node
file, the local agent (a Nomad API double that serves ``/v1/agent/self`` and
``/v1/node/<id>`` as a client agent forwards them) or ``--node-value``; a
value none of them gives is unknown and the verdict says how to know it.
The topology examples check as their comments say against a simulator
profile, as does a saved ``fingerprint --json``.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nomad_plugin import PLUGIN_NAME
from nomad_plugin.cli import check_job, fingerprint
from nomad_plugin.jobspec.node import NodeValues, PluginKeys, node_from_json
from nomad_plugin.sim import Simulator
from tests.doubles.nomad_cluster import NomadClusterDouble
from tests.jobspec.tables import mock_node, node_job

REPO = Path(__file__).resolve().parents[2]
JOBS = REPO / "examples" / "jobs"
NODE_META = str(JOBS / "plugin-node-meta.hcl")
POOL = ["--node-value", "node.pool=default"]  # the node pool decides where a job may run (jobspec/scope.py)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    code = check_job.main([*argv, *POOL, "--json"])
    return code, json.loads(capsys.readouterr().out)


def text(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = check_job.main([*argv, *POOL])
    return code, capsys.readouterr().out


def group_rules(doc: dict[str, Any], group: str) -> dict[str, Any]:
    return next(g for g in doc["node_rules"]["groups"] if g["group"] == group)


def write(tmp: Path, name: str, content: str | dict[str, Any]) -> str:
    path = tmp / name
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return str(path)


# --- the topology examples against a simulator profile ----------------------------------------


@pytest.mark.parametrize(
    ("name", "profile", "group"),
    [
        ("multi-node-training", "h800-8", "workers"),
        ("hyper-node-local", "m890p-8", "pair"),
        ("pod-spread", "h800-8", "workers"),
    ],
)
def test_topology_examples_place_on_a_profile_that_publishes_their_keys(
    name: str, profile: str, group: str, capsys: pytest.CaptureFixture[str]
) -> None:
    job = str(JOBS / f"{name}.nomad.hcl")
    code, doc = run(capsys, job, "--profile", profile, "--plugin-config", NODE_META)
    assert code == 0 and doc["outcome"] == "place", doc["verdict"]
    rules = group_rules(doc, group)
    keys = doc["node_rules"]["node"]["plugin_keys"]
    assert keys["node_meta"] is True and keys["keys"]["lingjun.card_count"] == "8"
    decided = [c for c in rules["constraints"] if c["status"] != "cluster"]
    assert decided and all(c["status"] == "holds" and "the plugin publishes it" in c["left"] for c in decided)
    needs_cluster = [c["operator"] for c in rules["constraints"] if c["status"] == "cluster"]
    spreads = rules["spreads"] or doc["node_rules"]["groups"][0]["spreads"]
    for spread in spreads:
        key = spread["attribute"][len("${meta.") : -1]
        assert spread["status"] == "cluster" and spread["node_value"] == keys["keys"][key]
    named = sorted({*needs_cluster, *(["spread"] if spreads else [])})
    need = "needs" if len(named) == 1 else "need"
    expected = f"Nomad would place this: on this node ({' and '.join(named)} {need} the cluster: not evaluated)"
    assert doc["verdict"] == expected


def test_multi_node_training_elsewhere_names_the_failing_constraint(capsys: pytest.CaptureFixture[str]) -> None:
    """On a PPU node of another point of delivery both the pod constraint and the device block fail."""
    job = str(JOBS / "multi-node-training.nomad.hcl")
    code, out = text(capsys, job, "--profile", "m890p-8", "--plugin-config", NODE_META)
    assert code == 1
    verdict = out.strip().splitlines()[-1]
    assert verdict.startswith("Nomad would not place it on this node: ")
    assert (
        "constraint ${meta.lingjun.point_of_delivery} = 'pod-a01-p1' fails: 'pod-g13-p1' [the plugin publishes it] = 'pod-a01-p1'"
        in verdict
    )
    assert "FAILS    constraint ${meta.lingjun.point_of_delivery} = 'pod-a01-p1'" in out
    assert "holds    constraint ${meta.lingjun.runtime_kit} = 'enabled'" in out


def test_hyper_node_local_on_a_node_without_hyper_nodes(capsys: pytest.CaptureFixture[str]) -> None:
    code, doc = run(capsys, str(JOBS / "hyper-node-local.nomad.hcl"), "--profile", "h800-8", "--set", "node_meta=true")
    assert code == 1 and doc["outcome"] == "not_placed"
    (failed,) = [c for c in group_rules(doc, "pair")["constraints"] if c["status"] == "fails"]
    assert failed["attribute"] == "${meta.lingjun.hyper_node}" and failed["left"].startswith("not set")
    assert "fails: not set [the plugin publishes it]" in doc["verdict"]


def test_keys_the_plugin_does_not_publish_are_unknown_and_the_verdict_says_how_to_know(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out = text(capsys, str(JOBS / "multi-node-training.nomad.hcl"), "--profile", "h800-8")
    assert code == 2
    assert "the plugin computes 'pod-a01-p1' for it but publishes it only with node_meta = true" in out
    verdict = out.strip().splitlines()[-1]
    assert verdict.startswith('check-job cannot tell what Nomad would do: group "workers" ${meta.lingjun')
    assert "--set node_meta=true" in verdict and "--node FILE" in verdict and "--node-value meta.<key>=VALUE" in verdict


def test_a_saved_fingerprint_carries_the_plugins_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert fingerprint.main(["--profile", "h800-8", "--json", "--plugin-config", NODE_META]) == 0
    saved = capsys.readouterr().out
    assert json.loads(saved)["plugin_keys"]["keys"]["lingjun.point_of_delivery"] == "pod-a01-p1"
    fp = write(tmp_path, "fp.json", saved)
    code, doc = run(capsys, str(JOBS / "multi-node-training.nomad.hcl"), "--fingerprint", fp)
    assert code == 0 and doc["outcome"] == "place", doc["verdict"]
    old = json.loads(saved)
    del old["plugin_keys"]
    code, doc = run(
        capsys, str(JOBS / "multi-node-training.nomad.hcl"), "--fingerprint", write(tmp_path, "o.json", old)
    )
    assert code == 2 and doc["outcome"] == "unknown"
    reason = group_rules(doc, "workers")["constraints"][0]["reason"]
    assert "nor are the plugin's keys" in reason and "holds none" in reason


# --- a node file, stated values ------------------------------------------------------------------


def test_a_node_file_gives_attributes_fields_and_static_meta(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    node = mock_node({"Meta": {"lingjun.point_of_delivery": "pod-old"}})
    job = node_job(
        {
            "job": {"Constraints": [["${attr.kernel.name}", "=", "linux"]]},
            "group": {
                "Constraints": [
                    ["${node.datacenter}", "=", "dc1"],
                    ["${meta.lingjun.point_of_delivery}", "=", "pod-old"],
                ],
                "Affinities": [["${meta.database}", "=", "mysql", 40], ["${node.class}", "=", "large", 60]],
            },
        }
    )
    argv = [write(tmp_path, "j.json", job), "--profile", "h800-8", "--node", write(tmp_path, "n.json", node)]
    code, doc = run(capsys, *argv)
    assert code == 0, doc["verdict"]
    rules = group_rules(doc, "g")
    assert [c["level"] for c in rules["constraints"]] == ["job", 'group "g"', 'group "g"']
    stale = rules["constraints"][2]
    assert stale["status"] == "holds" and "the plugin computes 'pod-a01-p1'" in stale["remarks"][0]
    assert rules["affinity_score"] == pytest.approx(0.4)
    # with node_meta = true the plugin's value wins, and the stale copy makes the constraint fail
    code, doc = run(capsys, *argv, "--set", "node_meta=true")
    assert code == 1
    stale = group_rules(doc, "g")["constraints"][2]
    assert stale["status"] == "fails" and "which Nomad sees within about 10 s" in stale["remarks"][0]
    # a stated value wins over every source
    code, doc = run(capsys, *argv, "--node-value", "node.datacenter=dc9")
    assert code == 1 and "group \"g\" constraint ${node.datacenter} = 'dc1' fails" in doc["verdict"]


def test_bad_node_sources_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = write(tmp_path, "j.json", node_job({"group": {"Constraints": [["${attr.kernel.name}", "=", "linux"]]}}))
    fp = tmp_path / "fp.json"
    fp.write_text('{"groups": []}')
    for extra, said in (
        (
            ["--node", write(tmp_path, "n.json", {"ID": "x", "Attributes": {"a": 1}})],
            "Attributes is not an object of strings",
        ),
        (["--node", write(tmp_path, "l.json", "[1, 2]")], "not a Nomad node"),
        (["--node", str(tmp_path / "missing.json")], "cannot read"),
        (["--node-value", "kernel.name=linux"], "write meta.<key>=VALUE"),
        (["--node-value", "meta.rack"], "write meta.<key>=VALUE"),
    ):
        assert check_job.main([job, "--fingerprint", str(fp), *extra]) == 2
        assert said in capsys.readouterr().err


def test_validation_of_node_level_rules_refuses_the_job(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = node_job({"group": {"Affinities": [["${meta.rack}", "=", "r1", 50]]}}, job_type="system")
    code, out = text(capsys, write(tmp_path, "j.json", job), "--profile", "h800-8")
    assert code == 2
    assert 'INVALID group "g": System jobs may not have an affinity block' in out
    assert out.strip().splitlines()[-1] == "Nomad would refuse this job at submission"


def test_hcl_spread_targets_and_task_level_rules(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = """
job "j" {
  spread {
    attribute = "${meta.lingjun.leaf_switch}"
    target "asw-001" { percent = 60 }
    target "asw-002" { percent = 50 }
  }
  group "g" {
    task "t" {
      driver = "raw_exec"
      constraint { distinct_hosts = true }
      affinity {
        attribute = "${meta.lingjun.model}"
        value     = "NVIDIA H800"
      }
    }
  }
}
"""
    code, out = text(capsys, write(tmp_path, "j.hcl", job), "--profile", "h800-8")
    assert code == 2
    assert (
        "INVALID job: Spread 1 validation failed: Sum of spread target percentages must not be greater than 100%; got 110%"
        in out
    )
    assert 'group "g" task "t": Constraint 1 has disallowed Operand at task level: distinct_hosts' in out


# --- the local agent ---------------------------------------------------------------------------


@contextlib.contextmanager
def simulated_node(profile: str, static_meta: dict[str, str]) -> Iterator[tuple[NomadClusterDouble, Path]]:
    """A simulator for the cards and one agent double answering for its own node; a plugin config for both."""
    tmp = Path(tempfile.mkdtemp(prefix="ndl-", dir="/tmp"))  # Unix socket paths must stay short
    sim = Simulator(tmp / "s", profile).start()
    double = NomadClusterDouble().start()
    try:
        double.restart_agent(static_meta=static_meta)
        double.add_node(double, "node-1")  # a client agent forwards /v1/node/<its id> to the servers
        config = tmp / "plugin.hcl"
        config.write_text(
            f'plugin "{PLUGIN_NAME}" {{\n  config {{\n    backend = "xdm"\n'
            f'    xdm_socket = "{tmp / "s" / "dp2mgr.sock"}"\n    config_socket = "{tmp / "s" / "config-daemon.sock"}"\n'
            f'    nvml_enrich = false\n    node_meta = true\n    nomad_address = "{double.address}"\n  }}\n}}\n'
        )
        yield double, config
    finally:
        double.stop()
        sim.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def test_this_nodes_own_config_reads_the_agent_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = node_job(
        {
            "group": {
                "Constraints": [
                    ["${meta.rack}", "=", "r1"],
                    ["${attr.kernel.name}", "=", "linux"],
                    ["${node.unique.id}", "=", "cluster-server"],
                    ["${meta.lingjun.point_of_delivery}", "=", "pod-a01-p1"],
                ]
            }
        }
    )
    with simulated_node("h800-8", {"rack": "r1"}) as (double, config):
        code, doc = run(capsys, write(tmp_path, "j.json", job), "--plugin-config", str(config))
        requests = [path for path, _ in double.requests]
    assert code == 0, doc["verdict"]
    sources = doc["node_rules"]["node"]["sources"]
    assert sources[0] == f"node fields, attributes and meta: Nomad at {double.address}, /v1/node/cluster-server"
    rules = group_rules(doc, "g")["constraints"]
    assert all(c["status"] == "holds" for c in rules), rules
    assert "Nomad sees within about 10 s" in rules[3]["remarks"][0]  # published by the plugin, not registered yet
    assert "/v1/agent/self" in requests and "/v1/node/cluster-server" in requests
    assert not [r for r in requests if r.startswith("POST") or "metadata" in r], requests  # a dry run writes nothing


def test_an_agent_that_does_not_answer_leaves_the_node_unknown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = write(tmp_path, "j.json", node_job({"group": {"Constraints": [["${attr.kernel.name}", "=", "linux"]]}}))
    with simulated_node("h800-8", {}) as (double, config):
        double.set_down(True)
        code, doc = run(capsys, job, "--plugin-config", str(config))
        assert code == 2 and doc["outcome"] == "unknown"
        assert f"the Nomad agent at {double.address} did not give this node" in doc["node_rules"]["node"]["sources"][0]
        double.set_down(False)
        code, doc = run(capsys, job, "--plugin-config", str(config), "--no-agent")
        assert code == 2 and doc["node_rules"]["node"]["sources"][0].endswith("(--no-agent)")
        code, doc = run(capsys, job, "--profile", "h800-8", "--agent", "--set", f'nomad_address="{double.address}"')
        assert code == 0, doc["verdict"]


def test_the_runtime_kit_controller_runs_one_group_per_switch_and_none_without_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = str(JOBS / "runtime-kit-controller.sysbatch.hcl")
    code, doc = run(capsys, job, "--profile", "h800-8", "--node-value", "meta.lj_runtimekit_enable=true")
    # A sysbatch job runs each group on every node where its rules hold: "enable" runs here, and that is the job.
    assert code == 0 and doc["outcome"] == "place", doc["verdict"]
    assert [g["outcome"] for g in doc["node_rules"]["groups"]] == ["place", "not_placed"]
    assert [(g["group"], g["outcome"]) for g in doc["groups"]] == [("enable", "place"), ("disable", "not_placed")]
    assert doc["verdict"].startswith('Nomad would place this: group "enable" on this node, not group "disable" (')
    node = write(tmp_path, "n.json", mock_node())  # a node without the key: left alone
    code, doc = run(capsys, job, "--profile", "h800-8", "--node", node)
    assert code == 1 and [g["outcome"] for g in doc["node_rules"]["groups"]] == ["not_placed", "not_placed"]
    assert doc["outcome"] == "not_placed"


def test_hcl_decoding_refuses_what_gohcl_refuses(capsys: pytest.CaptureFixture[str]) -> None:
    """A task has no spread block (api.Task); a spread's target is a labelled block (api.SpreadTarget)."""
    body = """
job "j" {
  group "g" {
    spread {
      attribute = "${meta.a}"
      target = "x"
    }
    task "t" {
      driver = "raw_exec"
      spread { attribute = "${meta.a}" }
    }
  }
}
"""
    with tempfile.TemporaryDirectory() as tmp:
        job = Path(tmp) / "decoding.hcl"
        job.write_text(body)
        code, out = text(capsys, str(job), "--profile", "h800-8")
    assert code == 2
    assert 'an argument named "target" is not expected here. Did you mean to define a block of type "target"?' in out
    assert 'group "g" task "t": Unsupported block type; Blocks of type "spread" are not expected here.' in out


# --- the plugin's keys as the node's meta (pure) -------------------------------------------------


def test_published_keys_win_and_unpublished_levels_wait_for_the_topology() -> None:
    node = node_from_json(mock_node({"Meta": {"lingjun.hyper_node": "old", "rack": "r1"}}), "node file")
    keys = {"lingjun.card_count": "8", "lingjun.leaf_switch": "asw-001"}
    published = NodeValues(node, PluginKeys(keys, publishes=True))
    assert published.resolve("${meta.lingjun.card_count}").value == "8"
    gone = published.resolve("${meta.lingjun.hyper_node}")
    assert gone.known and gone.value is None and "the plugin unsets it" in gone.remark
    assert published.resolve("${meta.rack}").value == "r1"  # outside the prefix: the node's
    # no card carries a topology yet: the publisher keeps the node's level keys, so they are the node's
    waiting = NodeValues(node, PluginKeys(keys, publishes=True, topology_known=False))
    assert waiting.resolve("${meta.lingjun.hyper_node}").value == "old"
    assert (
        not NodeValues(None, PluginKeys(keys, publishes=True, topology_known=False))
        .resolve("${meta.lingjun.hyper_node}")
        .known
    )
    # not published: the node's static copy, or unknown without the node
    static = NodeValues(node, PluginKeys(keys, publishes=False))
    assert static.resolve("${meta.lingjun.card_count}").value is None
    unknown = NodeValues(None, PluginKeys(keys, publishes=False)).resolve("${meta.lingjun.card_count}")
    assert (
        not unknown.known and "computes '8'" in unknown.why_unknown and unknown.hints[0].startswith("--set node_meta")
    )
    # another prefix is not the plugin's
    other = NodeValues(node, PluginKeys({"lj.card_count": "8"}, prefix="lj.", publishes=True))
    assert other.resolve("${meta.lingjun.hyper_node}").value == "old"
