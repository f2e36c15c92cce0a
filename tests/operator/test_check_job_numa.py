"""The real ``check-job`` command on numa blocks, the Nomad release it models, unreleased Nomad work,
and the constraints public job files write on the GPU Feature Discovery attributes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from nomad_plugin.sim.profiles import build_cards, resolve_profile

REPO = Path(__file__).resolve().parents[2]
POOL = ["--node-value", "node.pool=default"]  # the node pool decides where a job may run (jobspec/scope.py)
TOPOLOGY_DOC = REPO / "docs" / "topology.md"
FINGERPRINT_DOC = REPO / "docs" / "fingerprint.md"
SHIM = REPO / "tests" / "doubles" / "nvml_shim"


def doc_job() -> str:
    text = TOPOLOGY_DOC.read_text()
    found = re.search(r"<!-- numa-training-job:[^>]*-->\n```hcl\n(.*?)```", text, re.S)
    assert found, "docs/topology.md shows the NUMA training job"
    return found.group(1)


def check_job(tmp: Path, job: str, *args: str, env: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    path = tmp / ("job.json" if job.lstrip().startswith("{") else "job.nomad.hcl")
    path.write_text(job)
    run = subprocess.run(
        [sys.executable, "-m", "nomad_plugin", "check-job", str(path), "--json", "--no-agent", *POOL, *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**os.environ, **(env or {})},
    )
    assert run.stdout.startswith("{"), run.stderr[-2000:]
    return run.returncode, json.loads(run.stdout)


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    """The kernel's PCI tree for the h800-8 simulator's cards: cards 0-3 on NUMA node 0, 4-7 on node 1."""
    root = tmp_path / "root"
    for card in build_cards(resolve_profile("h800-8")):
        device = root / "sys" / "bus" / "pci" / "devices" / card.pci_bus_id
        device.mkdir(parents=True)
        (device / "numa_node").write_text(f"{card.numa_node}\n")
    other = root / "sys" / "bus" / "pci" / "devices" / "0000:00:1f.0"  # a chipset function without a node
    other.mkdir()
    (other / "numa_node").write_text("-1\n")
    return root


def ent(sysfs: Path) -> tuple[str, ...]:
    return ("--profile", "h800-8", "--nomad-edition", "ent", "--sysfs-root", str(sysfs))


def test_community_edition_refuses_the_documented_numa_job(tmp_path: Path) -> None:
    code, doc = check_job(tmp_path, doc_job(), "--profile", "h800-8")
    assert (code, doc["outcome"], doc["numa"]["outcome"]) == (2, "refuse", "refuse"), doc
    assert "numa scheduling requires Nomad Enterprise" in doc["numa"]["lines"][0]
    assert doc["nomad"][0] == "check-job models Nomad 2.0.5 Community Edition (--nomad-edition ce|ent)"


def test_enterprise_places_the_documented_job_on_either_numa_node(tmp_path: Path, sysfs: Path) -> None:
    code, doc = check_job(tmp_path, doc_job(), *ent(sysfs))
    assert (code, doc["outcome"]) == (0, "place"), doc
    assert "the cards fit on NUMA node 0 or 1, with 32 cores" in doc["numa"]["lines"][0]
    assert any(line.startswith("older Nomad: before 1.11.1 and 1.10.7 Enterprise") for line in doc["numa"]["lines"])
    assert doc["nomad"][0].startswith("check-job models Nomad 2.0.5 Enterprise")


def test_enterprise_does_not_place_more_cards_than_one_numa_node_holds(tmp_path: Path, sysfs: Path) -> None:
    code, doc = check_job(tmp_path, doc_job().replace("count = 4", "count = 5"), *ent(sysfs))
    assert (code, doc["outcome"]) == (1, "not_placed"), doc
    assert "no NUMA node holds the cards" in doc["numa"]["lines"][0]
    assert "node 0: " in doc["numa"]["lines"][0] and "NVIDIA H800: 4" in doc["numa"]["lines"][0]
    # Without numa the same five cards are placed: the block alone decides.
    plain = re.sub(r"numa \{.*?\n        \}\n", "", doc_job().replace("count = 4", "count = 5"), flags=re.S)
    assert "numa {" not in plain
    code, doc = check_job(tmp_path, plain, *ent(sysfs))
    assert (code, doc["outcome"], doc["numa"]) == (0, "place", None), doc


def test_prefer_with_no_node_holding_the_cards_cannot_be_told(tmp_path: Path, sysfs: Path) -> None:
    job = doc_job().replace("count = 4", "count = 5").replace('"require"', '"prefer"')
    code, doc = check_job(tmp_path, job, *ent(sysfs))
    assert (code, doc["outcome"]) == (2, "unknown"), doc
    assert "not public code" in doc["numa"]["lines"][0]


def test_a_short_device_name_ties_no_card_to_the_node(tmp_path: Path, sysfs: Path) -> None:
    job = doc_job().replace("nvidia/gpu/NVIDIA H800", "nvidia/gpu").replace("count = 4", "count = 5")
    code, doc = check_job(tmp_path, job, *ent(sysfs))
    assert (code, doc["outcome"]) == (0, "place"), doc  # five cards over two nodes: nothing ties them
    note = next(line for line in doc["numa"]["lines"] if line.startswith("note"))
    assert 'numa device "nvidia/gpu" ties no card' in note and '"nvidia/gpu/NVIDIA H800"' in note


def test_nomad_validation_of_the_block(tmp_path: Path, sysfs: Path) -> None:
    job = doc_job().replace('devices  = ["nvidia/gpu/NVIDIA H800"]', 'devices  = ["nvidia/gpu/NVIDIA H100"]')
    code, doc = check_job(tmp_path, job, *ent(sysfs))
    assert (code, doc["outcome"]) == (2, "refuse"), doc
    assert 'numa device "nvidia/gpu/NVIDIA H100" not requested as task resource' in doc["numa"]["lines"][0]
    code, doc = check_job(tmp_path, doc_job().replace('"require"', '"always"'), *ent(sysfs))
    assert "numa affinity must be one of none, prefer, or require" in doc["numa"]["lines"][0]
    code, doc = check_job(tmp_path, doc_job().replace('"require"', '"none"'), "--profile", "h800-8")
    assert (code, doc["outcome"], doc["numa"]["lines"]) == (0, "place", []), doc  # "none" asks nothing


def test_without_the_kernels_map_it_cannot_tell(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    code, doc = check_job(tmp_path, doc_job(), *ent(empty))
    assert (code, doc["outcome"]) == (2, "unknown"), doc
    assert str(empty / "sys" / "bus" / "pci" / "devices") in doc["numa"]["lines"][0]


def test_the_servers_map_from_a_node_record(tmp_path: Path) -> None:
    buses = {card.pci_bus_id: card.numa_node for card in build_cards(resolve_profile("h800-8"))}
    node = {
        "ID": "9a1c0e7e-0000-4000-8000-000000000001",
        "Name": "gpu-1",
        "Attributes": {"kernel.name": "linux"},
        "Meta": {},
        "NodeResources": {"Processors": {"Topology": {"Nodes": [0, 1], "BusAssociativity": buses}}},
    }
    (tmp_path / "node.json").write_text(json.dumps(node))
    empty = tmp_path / "empty"
    empty.mkdir()
    args = ("--profile", "h800-8", "--nomad-edition", "ent", "--sysfs-root", str(empty))
    code, doc = check_job(tmp_path, doc_job(), *args, "--node", str(tmp_path / "node.json"))
    assert (code, doc["outcome"]) == (0, "place"), doc
    assert "the cards fit on NUMA node 0 or 1" in doc["numa"]["lines"][0]
    del node["NodeResources"]  # `nomad node status -json` prints the API's node, which has no map
    (tmp_path / "node.json").write_text(json.dumps(node))
    code, doc = check_job(tmp_path, doc_job(), *args, "--node", str(tmp_path / "node.json"))
    assert (code, doc["outcome"]) == (2, "unknown"), doc


def test_a_json_job_numa_block(tmp_path: Path) -> None:
    task = {
        "Name": "train",
        "Driver": "exec",
        "Resources": {
            "Cores": 8,
            "Devices": [{"Name": "nvidia/gpu/NVIDIA H800", "Count": 2}],
            "NUMA": {"Affinity": "require", "Devices": ["nvidia/gpu/NVIDIA H800"]},
        },
    }
    job = json.dumps({"Job": {"ID": "j", "Name": "j", "TaskGroups": [{"Name": "g", "Tasks": [task]}]}})
    code, doc = check_job(tmp_path, job, "--profile", "h800-8")
    assert (code, doc["numa"]["outcome"]) == (2, "refuse"), doc


def test_share_devices_is_named_as_unreleased_nomad_work(tmp_path: Path) -> None:
    job = doc_job().replace(
        "count = 4\n", "count = 4\n          share_devices {\n            enabled = true\n          }\n"
    )
    code, doc = check_job(tmp_path, job, "--profile", "h800-8")
    assert code == 2 and doc["outcome"] == "refuse", doc
    assert '"share_devices"' in doc["requests"][0]["problems"][0], doc["requests"][0]
    assert any(n.startswith("note: share_devices is Nomad's unreleased device-sharing work") for n in doc["nomad"])


def test_share_devices_in_a_json_job_is_dropped_by_nomad_and_named(tmp_path: Path) -> None:
    device = {"Name": "nvidia/gpu", "Count": 1, "ShareDevices": {"Enabled": True}}
    task = {"Name": "t", "Driver": "exec", "Resources": {"Devices": [device]}}
    job = json.dumps({"Job": {"ID": "j", "Name": "j", "TaskGroups": [{"Name": "g", "Tasks": [task]}]}})
    code, doc = check_job(tmp_path, job, "--profile", "h800-8")
    assert (code, doc["outcome"]) == (0, "place"), doc  # the field is dropped: the device is not shared
    assert any(n.startswith("note: share_devices is Nomad's unreleased") for n in doc["nomad"]), doc


def test_a_devices_shared_state_in_a_saved_fingerprint_is_named_not_read(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "nomad_plugin", "fingerprint", "--profile", "h800-8", "--json"],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip
    saved = json.loads(run.stdout)
    saved["groups"][0]["devices"][0]["shared"] = "active"
    (tmp_path / "fp.json").write_text(json.dumps(saved))
    job = re.sub(r"numa \{.*?\n        \}\n", "", doc_job(), flags=re.S)
    code, doc = check_job(tmp_path, job, "--fingerprint", str(tmp_path / "fp.json"))
    assert (code, doc["outcome"]) == (0, "place"), doc
    assert any("Shared state of nvidia/gpu/NVIDIA H800" in n and "unreleased" in n for n in doc["nomad"]), doc


def test_an_older_nomad_accepted_an_unknown_constraint_target(tmp_path: Path) -> None:
    job = doc_job().replace(
        "count = 4\n",
        'count = 4\n          constraint {\n            attribute = "$device.attr.model"\n'
        '            value     = "NVIDIA H800"\n          }\n',
    )
    code, doc = check_job(tmp_path, job, "--profile", "h800-8")
    assert code == 2, doc
    assert any(n.startswith("older Nomad: before 1.11.2") for n in doc["nomad"]), doc


# --- the GPU Feature Discovery attributes, as public job files constrain them ----------------------


def nvml_env(tmp: Path) -> dict[str, str]:
    """The plugin check-job launches imports the NVML double (an H100 and an L40S) as pynvml."""
    libc = next(line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines() if "/libc.so" in line)
    lib = Path(tempfile.mkdtemp(dir=tmp))
    (lib / "libnvidia-ml.so.1").symlink_to(libc)
    return {
        "PYTHONPATH": os.pathsep.join([str(SHIM), str(REPO), os.environ.get("PYTHONPATH", "")]),
        "LD_LIBRARY_PATH": str(lib),
        "FAKE_NVML_GPUS": json.dumps([{"profile": "h100", "index": 0}, {"profile": "l40s", "index": 1}]),
    }


def gpu_job(*constraints: tuple[str, str, str]) -> str:
    blocks = "".join(
        f'          constraint {{\n            attribute = "{a}"\n            operator  = "{o}"\n'
        f'            value     = "{v}"\n          }}\n'
        for a, o, v in constraints
    )
    return (
        'job "gpu" {\n  group "g" {\n    task "t" {\n      driver = "exec"\n      resources {\n'
        f'        device "nvidia/gpu" {{\n          count = 1\n{blocks}        }}\n      }}\n    }}\n  }}\n}}\n'
    )


CC = "${device.attr.compute_capability}"
CUDA = "${device.attr.cuda_driver_version}"


@pytest.mark.parametrize(
    ("value", "placed"),
    [("6.0", True), ("7.0", True), ("8.0", True), ("9.0", True), ("10.0", False)],  # public jobs' values
)
def test_public_jobs_compute_capability_constraint(tmp_path: Path, value: str, placed: bool) -> None:
    code, doc = check_job(tmp_path, gpu_job((CC, ">=", value)), "--set", 'backend="nvml"', env=nvml_env(tmp_path))
    assert doc["outcome"] == ("place" if placed else "not_placed"), doc
    assert code == (0 if placed else 1)


def test_the_documented_constraints_place_on_the_hopper_card(tmp_path: Path) -> None:
    text = FINGERPRINT_DOC.read_text()
    block = re.search(r"### Constraints real jobs write on these.*?```hcl\n(.*?)```", text, re.S)
    assert block
    job = 'job "gpu" {\n  group "g" {\n    task "t" {\n      driver = "exec"\n      resources {\n'
    job += block.group(1) + "      }\n    }\n  }\n}\n"
    code, doc = check_job(tmp_path, job, "--set", 'backend="nvml"', env=nvml_env(tmp_path))
    assert (code, doc["outcome"]) == (0, "place"), doc
    assert "NVIDIA H100 80GB HBM3" in str(doc["requests"][0]["chosen"]), doc["requests"][0]


def test_a_type_mismatch_names_the_operator_that_works(tmp_path: Path) -> None:
    env = nvml_env(tmp_path)
    code, doc = check_job(tmp_path, gpu_job((CUDA, ">=", "12.0")), "--set", 'backend="nvml"', env=env)
    assert code == 1, doc
    reasons = json.dumps(doc["requests"][0])
    assert 'write operator = \\"version\\" and value = \\">= 12.0\\"' in reasons, reasons
    code, doc = check_job(tmp_path, gpu_job((CC, "version", ">= 8.0")), "--set", 'backend="nvml"', env=env)
    assert code == 1, doc
    reasons = json.dumps(doc["requests"][0])
    assert 'write operator = \\">=\\" and value = \\"8.0\\"' in reasons, reasons
    code, doc = check_job(tmp_path, gpu_job((CUDA, "version", ">= 12.0")), "--set", 'backend="nvml"', env=env)
    assert (code, doc["outcome"]) == (0, "place"), doc
