"""Which nodes a job may use at all, and what Nomad refuses at decoding, through the real command.

- Only nodes in one of the job's datacenters (``*`` patterns, default ``["*"]``: ``Job.Canonicalize``) and
  in its node pool (default ``default``, ``all`` for every pool) are considered: ``readyNodesInDCsAndPool``
  (scheduler/util.go), ``Node.IsInAnyDC`` and ``Node.IsInPool`` (nomad/structs/structs.go).
- A group volume of type ``host`` needs that host volume on the node (``HostVolumeChecker``,
  scheduler/feasible/feasible.go).
- A task's ``disk`` is accepted: ``ApiResourcesToStructs`` (command/agent/job_endpoint.go) does not copy it,
  so ``Resources.Validate`` never sees it.
- A ``device`` block outside ``resources`` is refused by jobspec2's gohcl decode ("Unsupported block type").
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from nomad_plugin.cli import check_job
from nomad_plugin.jobspec.scope import glob

REPO = Path(__file__).resolve().parents[2]
DEVICE = 'device "nvidia/gpu" {\n count = 1\n}'


@pytest.fixture(scope="module")
def fp(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("fp") / "fp.json"
    result = subprocess.run(
        [sys.executable, "-m", "nomad_plugin", "fingerprint", "--profile", "h800-8", "--json"],
        capture_output=True, text=True, timeout=90, cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    path.write_text(result.stdout)
    return str(path)


def job(tmp_path: Path, top: str = "", group: str = "", task: str = "", resources: str = DEVICE) -> str:
    path = tmp_path / "job.hcl"
    path.write_text(
        textwrap.dedent(f"""\
        job "j" {{
        {top}
        group "g" {{
        {group}
        task "t" {{
        driver = "raw_exec"
        config {{ command = "true" }}
        {task}
        resources {{
        {resources}
        }}
        }}
        }}
        }}
        """)
    )
    return str(path)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any], str]:
    code = check_job.main([*argv, "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert check_job.main(list(argv)) == code
    return code, doc, capsys.readouterr().out


def node_file(tmp_path: Path, **fields: Any) -> str:
    path = tmp_path / "node.json"
    path.write_text(json.dumps({"ID": "n1", "Attributes": {}, "Meta": {}, **fields}))
    return str(path)


def test_the_jobs_datacenters_and_pool_decide_whether_this_node_is_considered(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fp: str
) -> None:
    path = job(tmp_path, top='datacenters = ["us-*", "eu-west"]\nnode_pool = "gpu"')
    here = ["--node-value", "node.datacenter=us-east-1", "--node-value", "node.pool=gpu"]
    code, doc, out = run(capsys, path, "--fingerprint", fp, *here)
    assert (code, doc["outcome"]) == (0, "place"), out
    code, doc, out = run(capsys, path, "--fingerprint", fp, "--node-value", "node.datacenter=ap-1", *here[2:])
    assert (code, doc["outcome"]) == (1, "not_placed"), out
    assert "datacenters ['us-*', 'eu-west'], not 'ap-1'" in doc["verdict"]
    code, doc, out = run(capsys, path, "--fingerprint", fp, *here[:2], "--node-value", "node.pool=default")
    assert (code, doc["outcome"]) == (1, "not_placed") and "node_pool 'gpu', not 'default'" in doc["verdict"]
    # A node file gives both; Nomad registers a node without a pool in "default".
    code, doc, out = run(capsys, path, "--fingerprint", fp, "--node", node_file(tmp_path, Datacenter="eu-west"))
    assert (code, doc["outcome"]) == (1, "not_placed") and "node_pool 'gpu', not 'default'" in doc["verdict"], out


def test_an_unknown_datacenter_or_pool_is_cannot_tell_unless_a_rule_already_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fp: str
) -> None:
    path = job(tmp_path, top='datacenters = ["dc2"]')
    code, doc, out = run(capsys, path, "--fingerprint", fp, "--no-agent")
    assert (code, doc["outcome"]) == (2, "unknown"), out
    assert "--node-value node.datacenter=VALUE" in doc["verdict"] and "--node-value node.pool=VALUE" in doc["verdict"]
    failing = 'constraint {\n attribute = "${attr.kernel.name}"\n value = "windows"\n}'
    path = job(tmp_path, top='datacenters = ["dc2"]', group=failing)
    kernel = ["--node-value", "attr.kernel.name=linux"]
    code, doc, out = run(capsys, path, "--fingerprint", fp, "--no-agent", *kernel)
    assert (code, doc["outcome"]) == (1, "not_placed"), out
    # Every datacenter and every pool: nothing of the node is needed.
    path = job(tmp_path, top='datacenters = ["*", "dc2"]\nnode_pool = "all"')
    code, doc, out = run(capsys, path, "--fingerprint", fp, "--no-agent")
    assert (code, doc["outcome"]) == (0, "place"), out


def test_a_host_volume_needs_the_node_to_have_it(tmp_path: Path, capsys: pytest.CaptureFixture[str], fp: str) -> None:
    volume = 'volume "models" {\n type = "host"\n source = "moosefs"\n}'
    path = job(tmp_path, group=volume)
    pool = ["--node-value", "node.pool=default"]
    code, doc, out = run(capsys, path, "--fingerprint", fp, "--no-agent", *pool)
    assert (code, doc["outcome"]) == (2, "unknown"), out
    assert 'volume "models" (host volume "moosefs")' in doc["verdict"] and "--node FILE" in doc["verdict"]
    has = node_file(tmp_path, HostVolumes={"moosefs": {"Path": "/mnt/moosefs", "ReadOnly": False}})
    code, doc, out = run(capsys, path, "--fingerprint", fp, "--node", has)
    assert (code, doc["outcome"]) == (0, "place"), out
    lacks = node_file(tmp_path, HostVolumes={"scratch": {"Path": "/scratch"}})
    code, doc, out = run(capsys, path, "--fingerprint", fp, "--node", lacks)
    assert (code, doc["outcome"]) == (1, "not_placed") and "this node has no such host volume" in doc["verdict"]
    read_only = node_file(tmp_path, HostVolumes={"moosefs": {"Path": "/mnt", "ReadOnly": True}})
    code, doc, out = run(capsys, path, "--fingerprint", fp, "--node", read_only)
    assert (code, doc["outcome"]) == (1, "not_placed") and "read-only" in doc["verdict"], out
    # A volume of no known type is dropped at submission (ApiTgToStructsTG): it asks nothing of the node.
    path = job(tmp_path, group='volume "v" {\n source = "moosefs"\n}')
    code, doc, out = run(capsys, path, "--fingerprint", fp, "--no-agent", *pool)
    assert (code, doc["outcome"]) == (0, "place"), out


def test_a_tasks_disk_is_accepted(tmp_path: Path, capsys: pytest.CaptureFixture[str], fp: str) -> None:
    path = job(tmp_path, resources=f"cpu = 500\nmemory = 256\ndisk = 2048\n{DEVICE}")
    code, doc, out = run(capsys, path, "--fingerprint", fp, "--no-agent", "--node-value", "node.pool=default")
    assert (code, doc["outcome"]) == (0, "place"), out


def test_a_device_block_outside_resources_is_refused_before_anything_unknown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fp: str
) -> None:
    unknown = 'constraint {\n attribute = "${node.class}"\n value = "linux"\n}'
    path = job(tmp_path, group=unknown, task=DEVICE, resources="cpu = 100")
    code, doc, out = run(capsys, path, "--fingerprint", fp, "--no-agent")
    assert (code, doc["outcome"]) == (2, "refuse"), out
    assert 'group "g" task "t": Unsupported block type; Blocks of type "device" are not expected here.' in out


MATCH = ["*test", "this*", "this*test", "*is *", "*is*a*", "**test**", "**is**a***test*", "* *", "*", "**********",
         "*Ѿ*", "*is a ϗѾ *"]  # fmt: skip
NO_MATCH = ["test*", "*is", "*no*", " ", "* ", " *", "*ʤ*", "this*this is a test"]


def test_datacenter_patterns_match_as_go_glob_does() -> None:
    """go-glob v1.0.0's own table (glob_test.go: TestGlob, TestEmptyPattern, TestEmptySubject), the version
    Nomad's go.mod pins."""
    assert all(glob(p, "this is a ϗѾ test") for p in MATCH)
    assert not any(glob(p, "this is a test") for p in NO_MATCH)
    assert glob("", "") and not glob("", "test") and glob("test", "test")
    assert all(glob(p, "") for p in ("", "*", "**", "*" * 1000))
    assert not any(glob(p, "") for p in ("test", "*test*", "*x", "***x", "x*", "x***", "x*x", "x****x"))


def test_a_block_or_argument_no_body_takes_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fp: str
) -> None:
    """gohcl decodes each body into api.Job, api.TaskGroup or api.Task: a name none has is refused."""
    path = job(tmp_path, top='volume "v" {\n type = "host"\n source = "s"\n}\nvault_token = "x"', task="network {}")
    code, doc, out = run(capsys, path, "--fingerprint", fp, "--no-agent")
    assert (code, doc["outcome"]) == (2, "refuse"), out
    for line in (
        'job: Unsupported block type; Blocks of type "volume" are not expected here.',
        'job: Unsupported argument; An argument named "vault_token" is not expected here.',
        'group "g" task "t": Unsupported block type; Blocks of type "network" are not expected here.',
    ):
        assert line in out
    # What decodeJob, decodeTaskGroup and decodeTask take themselves is accepted.
    path = job(tmp_path, top='meta = { a = "b" }', group='meta { a = "b" }', task='env = { A = "b" }')
    code, doc, out = run(capsys, path, "--fingerprint", fp, "--no-agent", "--node-value", "node.pool=default")
    assert (code, doc["outcome"]) == (0, "place"), out


def test_the_simulated_node_is_a_client_with_nomads_defaults(
    tmp_path: Path, fp: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """--profile simulates a node of its own: datacenter dc1 and pool default, as a Nomad client by default
    (command/agent/config.go DefaultConfig), said in the output and changed with --node-value."""
    plain = job(tmp_path)
    code, doc, out = run(capsys, plain, "--profile", "h800-8", "--no-agent")
    assert code == 0 and doc["outcome"] == "place", doc
    elsewhere = job(tmp_path, top='datacenters = ["home"]')
    code, doc, out = run(capsys, elsewhere, "--profile", "h800-8", "--no-agent")
    assert code == 1 and doc["outcome"] == "not_placed", doc
    assert "the simulated node: node.datacenter='dc1', node.pool='default'" in out
    assert out.rstrip().endswith("""datacenters ['home'], not 'dc1'""")
    code, doc, _ = run(capsys, elsewhere, "--profile", "h800-8", "--no-agent", "--node-value", "node.datacenter=home")
    assert code == 0 and doc["outcome"] == "place", doc
    gpu_pool = job(tmp_path, top='node_pool = "gpu"')
    code, doc, _ = run(capsys, gpu_pool, "--fingerprint", fp, "--no-agent")
    assert code == 2 and doc["outcome"] == "unknown", doc  # a saved fingerprint's node is no simulated one
