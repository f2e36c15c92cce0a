"""Node metadata through the real plugin process (conformance host) against the Nomad API double.

What a Nomad server would see of the node (the double's ``registered_meta``,
after Nomad's batching) must hold the topology keys equal to the simulator's
topology JSON, on every profile; follow a topology change; come back after
an agent restart that lost the client state; and a token without
``node:write`` must give one clear log line while Fingerprint, Reserve and
Stats carry on.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nomad_plugin.cli import doctor
from nomad_plugin.config.model import PluginConfig
from nomad_plugin.sim.profiles import PROFILES
from tests.conformance.hostlib import HostProcess, start_host
from tests.doubles.nomad_api import NomadApiDouble
from tests.integration.harness import (
    DEADLINE_S,
    Node,
    assert_conformant,
    first_fingerprint_with_devices,
    reserve,
    set_of,
    sim_node,
)
from tests.topology.test_node_meta_keys import expected_keys
from tests.waiting import wait_until

RESYNC_S = 1.0
#: Nomad's batching in the double, shortened (the real one is 5 s + up to 5 s of stagger).
BATCH = (0.5, 0.5)
STATIC = {"rack": "r1"}


def launch(node: Node, api: NomadApiDouble, host: Path, *extra: str) -> HostProcess:
    sets = (
        set_of("node_meta", True),
        set_of("nomad_address", api.address),
        set_of("inventory_resync_period", f"{RESYNC_S:g}s"),
        *extra,
    )
    proc = start_host([*node.plugin_args(*sets, phase="run"), "--duration", "0", "--stats-interval", "1"], binary=host)
    first_fingerprint_with_devices(proc)
    return proc


def ours(meta: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in meta.items() if k.startswith("lingjun.")}


@pytest.fixture
def api() -> Iterator[NomadApiDouble]:
    with NomadApiDouble(static_meta=STATIC, meta_batch=BATCH) as double:
        double.meta.apply({"team": "ml"})  # someone else's dynamic key
        yield double


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_registered_meta_equals_the_simulators_topology(
    profile: str, api: NomadApiDouble, conformance_host: Path
) -> None:
    with sim_node(profile) as node:
        proc = launch(node, api, conformance_host)
        want = expected_keys(profile)
        wait_until(lambda: ours(api.registered_meta()) == want, f"{profile}: the servers to see {want}", DEADLINE_S)
        meta = api.registered_meta()
        assert meta["rack"] == "r1" and meta["team"] == "ml"  # never touched
        assert ours({k: v for k, v in api.meta.read()["Dynamic"].items() if v is not None}) == want
        assert all(k.startswith("lingjun.") for post in api.meta.posts[1:] for k in post)
        assert_conformant(proc.finish())


def test_a_topology_change_and_a_lost_agent_state_reach_the_servers(
    api: NomadApiDouble, conformance_host: Path
) -> None:
    with sim_node("m890p-8") as node:
        proc = launch(node, api, conformance_host)
        wait_until(lambda: ours(api.registered_meta()) == expected_keys("m890p-8"), "the first publish", DEADLINE_S)
        writes = len(api.meta.posts)

        started = time.monotonic()
        node.sim.set_topology_level("leafSwitch", "asw-107", [4, 5, 6, 7])
        node.sim.set_topology_level("hyperNode", None)
        wait_until(
            lambda: (
                api.registered_meta().get("lingjun.leaf_switch") == "asw-001,asw-107"
                and "lingjun.hyper_node" not in api.registered_meta()
            ),
            "the new topology on the servers",
            DEADLINE_S,
        )
        took = time.monotonic() - started
        # Only the changed keys were written, the vanished one as null.
        changed = {k: v for post in api.meta.posts[writes:] for k, v in post.items()}
        assert changed == {"lingjun.leaf_switch": "asw-001,asw-107", "lingjun.hyper_node": None}, api.meta.posts
        print(f"topology change on the servers after {took:.2f} s (resync {RESYNC_S} s, batching {BATCH})")

        api.restart_agent()  # state kept: Nomad persisted the keys, nothing to write
        api.restart_agent(lose_state=True)  # a wiped client data dir
        wait_until(
            lambda: api.registered_meta().get("lingjun.leaf_switch") == "asw-001,asw-107",
            "the keys written again after the agent lost its state",
            DEADLINE_S,
        )
        assert_conformant(proc.finish())


def test_a_token_without_node_write_says_so_once_and_interrupts_nothing(
    api: NomadApiDouble, conformance_host: Path
) -> None:
    api.enable_acls()
    api.add_policy("plugin", 'node { policy = "read" }\nagent { policy = "read" }')
    api.add_token("read-only", ["plugin"])
    with sim_node("h800-8") as node:
        proc = launch(node, api, conformance_host, set_of("nomad_token", "read-only"))
        wait_until(lambda: "node:write" in proc.stderr_text(), "the 403 in the plugin's log", DEADLINE_S)
        uuids = [c.uuid for c in node.sim.cards]
        event = reserve(proc, uuids[:2], "after-403")
        assert event["ok"] is True, event
        node.sim.set_health(3, False, "XID 79")  # the fingerprint stream still follows changes
        proc.wait_for(
            lambda e: e["event"] == "fingerprint" and any(not d["healthy"] for g in e["groups"] for d in g["devices"]),
            timeout=DEADLINE_S,
        )
        stats_before = sum(1 for e in proc.events if e["event"] == "stats")
        proc.wait_for(lambda e: e["event"] == "stats", timeout=DEADLINE_S)
        node.sim.set_topology_level("leafSwitch", "asw-555")  # more chances to repeat the message
        time.sleep(3 * RESYNC_S)  # several rounds pass (only makes the count below stricter)
        # doctor names it too: from the token's policies, and from what the running plugin met.
        config = PluginConfig(
            node_meta=True, nomad_address=api.address, nomad_token="read-only", data_dir=str(node.data_dir)
        )
        check = doctor.Doctor(host=doctor.Host(environ={}), config=config)
        check.check_node_meta()
        rows = [(f.check, f.status, f.summary, f.next_step) for f in check.findings]
        run = proc.finish()
    failed = [summary for _, status, summary, _ in rows if status == "fail"]
    assert any("lacks node:write" in s for s in failed), rows
    assert any(s.startswith("the running plugin could not publish") and "node:write" in s for s in failed), rows
    lines = [line for line in run.stderr.splitlines() if "node:write" in line]
    assert len(lines) == 1, lines
    line = lines[0]
    assert "[ERROR]" in line or "error" in line.lower(), line
    assert 'node { policy = \\"write\\" }' in line or 'node { policy = "write" }' in line, line
    assert "node-meta" in line and "keeps serving" in line, line
    assert "lingjun." not in json.dumps(api.meta.read()["Meta"])  # nothing was written
    assert stats_before >= 1 and run.of("stats")
    assert_conformant(run)
