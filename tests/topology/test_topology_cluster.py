"""``topology`` on a multi-node cluster: five simulated nodes, each with the real plugin publishing its meta.

Each node is a simulator, the real plugin under the conformance host with
``node_meta = true``, and a client agent double that receives the meta; the
cluster double serves the servers' view (node list, nodes with their
registered meta and the device groups the plugins fingerprinted,
allocations). The expected answers are worked out by hand below, from the
layout, not from the code under test:

==== ========= ============================== =========================== ==========================
node profile   pod / leaf switch              allocations                 cards
==== ========= ============================== =========================== ==========================
n1   h800-8    pod-a01-p1 / asw-001,asw-002   3 cards (default ns)        8, card 7 unhealthy: 4 free
n2   h800-8    pod-a01-p1 / asw-003           none                        8 free
n3   h800-8    pod-b02-p1 / asw-b01           2 cards (namespace research) 6 free (8 to a token blind to it)
n4   m890p-8   pod-g13-p1 / asw-001           none                        8 free PPU M890P
n5   l20-8     none (levels removed)          none                        no topology
==== ========= ============================== =========================== ==========================
"""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from nomad_plugin.cli import topology
from tests.conformance.hostlib import start_host
from tests.doubles.nomad_api import NomadApiDouble
from tests.doubles.nomad_cluster import NomadClusterDouble, device_resources
from tests.integration.harness import DEADLINE_S, first_fingerprint_with_devices, set_of, sim_node
from tests.waiting import wait_until

H800 = "NVIDIA H800"
LAYOUT: dict[str, tuple[str, dict[str, str | None]]] = {
    "n1": ("h800-8", {}),
    "n2": ("h800-8", {"leafSwitch": "asw-003"}),
    "n3": ("h800-8", {"pointOfDelivery": "pod-b02-p1", "leafSwitch": "asw-b01"}),
    "n4": ("m890p-8", {}),
    "n5": ("l20-8", {"pointOfDelivery": None, "leafSwitch": None}),
}


@pytest.fixture(scope="module")
def cluster(conformance_host: Path) -> Iterator[NomadClusterDouble]:
    with ExitStack() as stack:
        double = stack.enter_context(NomadClusterDouble())
        double.enable_acls()
        double.add_policy("viewer", 'node { policy = "read" }\nnamespace "default" { policy = "read" }')
        double.add_token("viewer-token", ["viewer"])
        double.add_token("mgmt-token", management=True)
        started = []
        for name, (profile, levels) in LAYOUT.items():
            node = stack.enter_context(sim_node(profile))
            for level, value in levels.items():
                node.sim.set_topology_level(level, value)
            if name == "n1":
                node.sim.set_health(7, False, "XID 79")
            agent = stack.enter_context(NomadApiDouble(meta_batch=(0.2, 0.2)))
            sets = (set_of("node_meta", True), set_of("nomad_address", agent.address))
            proc = start_host([*node.plugin_args(*sets, phase="run"), "--duration", "0"], binary=conformance_host)
            started.append((name, node, agent, proc))
        for name, node, agent, proc in started:
            event = first_fingerprint_with_devices(proc)
            sick = any(not d["healthy"] for g in event["groups"] for d in g["devices"])
            if name == "n1" and not sick:  # the unhealthy card must be in the groups the servers get
                event = proc.wait_for(
                    lambda e: (
                        e["event"] == "fingerprint" and any(not d["healthy"] for g in e["groups"] for d in g["devices"])
                    ),
                    timeout=DEADLINE_S,
                )
            wait_until(lambda: "lingjun.card_count" in agent.registered_meta(), f"{name}'s meta", DEADLINE_S)
            proc.finish()  # the meta stays with the agent, the devices with the servers
            double.add_node(agent, name, device_resources(event["groups"]))
            uuids = [c.uuid for c in node.sim.cards]
            if name == "n1":
                agent.add_alloc("a-n1", uuids[0:3], device=f"nvidia/gpu/{H800}")
                agent.add_alloc("a-n1-old", uuids[3:5], "complete", device=f"nvidia/gpu/{H800}")  # freed
            if name == "n3":
                agent.add_alloc("a-n3", uuids[0:2], device=f"nvidia/gpu/{H800}", namespace="research")
        yield double


def run(cluster: NomadClusterDouble, *argv: str, token: str = "mgmt-token") -> tuple[int, dict[str, Any]]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = topology.main(["--address", cluster.address, "--token", token, "--json", *argv])
    return code, json.loads(out.getvalue())


def text(cluster: NomadClusterDouble, *argv: str, token: str = "mgmt-token") -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = topology.main(["--address", cluster.address, "--token", token, *argv])
    return code, out.getvalue()


def cards(doc: dict[str, Any], key: str, name: str) -> dict[tuple[str, str], tuple[int, int, int]]:
    domain = next(d for d in doc[key] if d["name"] == name)
    return {(c["model"], c["mode"]): (c["cards"], c["healthy"], c["free"]) for c in domain["cards"]}


def test_domains_nodes_and_counts(cluster: NomadClusterDouble) -> None:
    code, doc = run(cluster)
    assert code == 0 and doc["allocations_complete"] is True and doc["reserves"] is False
    assert doc["nodes_with_devices"] == 5
    pods = {d["name"]: d for d in doc["points_of_delivery"]}
    assert sorted(pods) == ["pod-a01-p1", "pod-b02-p1", "pod-g13-p1"]
    assert pods["pod-a01-p1"]["nodes"] == ["n1", "n2"]
    assert cards(doc, "points_of_delivery", "pod-a01-p1") == {(H800, "whole"): (16, 15, 12)}
    assert cards(doc, "points_of_delivery", "pod-b02-p1") == {(H800, "whole"): (8, 8, 6)}
    assert cards(doc, "points_of_delivery", "pod-g13-p1") == {("PPU M890P", "whole"): (8, 8, 8)}
    leaves = {d["name"]: d for d in doc["leaf_switches"]}
    assert sorted(leaves) == [
        "pod-a01-p1/asw-001,asw-002",
        "pod-a01-p1/asw-003",
        "pod-b02-p1/asw-b01",
        "pod-g13-p1/asw-001",  # the same switch name in another pod is another switch
    ]
    assert leaves["pod-a01-p1/asw-001,asw-002"]["spans"] is True
    assert cards(doc, "leaf_switches", "pod-a01-p1/asw-003") == {(H800, "whole"): (8, 8, 8)}
    assert doc["without_topology"] == [{"node": "n5", "why": "no lingjun.point_of_delivery or lingjun.leaf_switch"}]


@pytest.mark.parametrize(
    ("need", "per_node", "expected"),
    [
        (8, 1, ["pod-a01-p1/asw-003", "pod-a01-p1"]),  # the leaf switch first; n1's spanning cards never count
        (6, 1, ["pod-b02-p1/asw-b01", "pod-a01-p1/asw-003", "pod-b02-p1", "pod-a01-p1"]),
        (12, 1, ["pod-a01-p1"]),
        (13, 1, []),
        (8, 8, ["pod-a01-p1/asw-003", "pod-a01-p1"]),  # n1's 4 free are no whole allocation of 8
        (16, 8, []),
        (12, 4, ["pod-a01-p1"]),  # 4 on n1 + 8 on n2
    ],
)
def test_need_lists_exactly_the_domains_that_fit(
    cluster: NomadClusterDouble, need: int, per_node: int, expected: list[str]
) -> None:
    code, doc = run(cluster, "--need", str(need), "--model", "nvidia h800", "--per-node", str(per_node))
    assert [f["name"] for f in doc["fits"]] == expected
    assert code == (0 if expected else 1)


def test_other_models_and_modes(cluster: NomadClusterDouble) -> None:
    code, doc = run(cluster, "--need", "8", "--model", "PPU M890P")
    assert code == 0 and [f["name"] for f in doc["fits"]] == ["pod-g13-p1/asw-001", "pod-g13-p1"]
    code, doc = run(cluster, "--need", "1", "--model", H800, "--mode", "tdm")
    assert code == 1 and doc["fits"] == []
    code, out = text(cluster, "--need", "1", "--model", "NVIDIA B200")
    assert code == 1 and "no 'NVIDIA B200' cards in the cluster" in out and "NVIDIA H800" in out


def test_a_token_that_cannot_see_every_namespace_is_told_so(cluster: NomadClusterDouble) -> None:
    code, doc = run(cluster, "--need", "8", "--model", H800, token="viewer-token")
    assert code == 0 and doc["allocations_complete"] is False and "research" not in doc["visibility"]
    assert "namespace" in doc["visibility"]
    # The research allocation is invisible: pod-b02's 2 held cards look free.
    assert cards(doc, "points_of_delivery", "pod-b02-p1") == {(H800, "whole"): (8, 8, 8)}
    assert "pod-b02-p1/asw-b01" in [f["name"] for f in doc["fits"]]
    _, out = text(cluster, "--need", "8", "--model", H800, token="viewer-token")
    assert "NOT all visible, free counts may be too high" in out


def test_text_says_it_does_not_gang_reserve(cluster: NomadClusterDouble) -> None:
    code, out = text(cluster, "--need", "8", "--model", H800)
    assert code == 0
    assert "point of delivery pod-a01-p1: 2 node(s) (n1, n2)" in out
    assert "NVIDIA H800 (whole): 16 cards, 15 healthy, 12 free" in out
    assert "leaf switch pod-a01-p1/asw-003: 8 free on 1 node(s)" in out
    assert "not a reservation" in out and "no gang scheduling" in out
    assert "${meta.lingjun.point_of_delivery}" in out
    assert "n5: no lingjun.point_of_delivery or lingjun.leaf_switch" in out


def test_errors_exit_2(cluster: NomadClusterDouble, capsys: pytest.CaptureFixture[str]) -> None:
    assert topology.main(["--address", cluster.address, "--token", "nope"]) == 2
    assert "ACL token not found" in capsys.readouterr().err
    cluster.add_token("no-node", [])
    assert topology.main(["--address", cluster.address, "--token", "no-node"]) == 2
    assert "node:read" in capsys.readouterr().err
    assert topology.main(["--need", "8"]) == 2
