"""The documented upgrade procedure (docs/operator.md, "Upgrading"), end to end:
replace the plugin executable in plugin_dir, restart the agent. Grants made by
the old version are kept while their allocations run and released by the new
version once they end.

The plugin file in a private plugin_dir is a small launcher script standing
for one release (it records its version, then runs the real plugin). The
Go conformance host plays the Nomad client: it launches that file the way
Nomad does and, at the end of a run, stops it the way an agent shutdown does
(GRPCController.Shutdown, then kill). Between the two runs the file is
replaced atomically (a new file renamed over the old one), as
`install -m 0755` does.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from nomad_plugin.sim import GrantRecord
from tests.conformance.hostlib import HostProcess, real_plugin, start_host
from tests.doubles.nomad_api import NomadApiDouble
from tests.integration.harness import Node, assert_conformant, first_fingerprint_with_devices, reserve, set_of

GRACE_S = 1.0
DEVICE = "nvidia/gpu/NVIDIA H800"
PLUGIN_FILE = "nomad-device-lingjun"


def _install(plugin_dir: Path, version: str, launches: Path) -> Path:
    """Write release ``version`` to plugin_dir the safe way: a new file renamed over the old one."""
    target = plugin_dir / PLUGIN_FILE
    tmp = plugin_dir / f".{PLUGIN_FILE}.new"
    tmp.write_text(f'#!/bin/sh\necho "{version} $$" >> "{launches}"\nexec "{real_plugin()}" "$@"\n')
    tmp.chmod(0o755)
    os.replace(tmp, target)
    return target


def _start_agent(node: Node, api: NomadApiDouble, plugin: Path, host_binary: Path) -> HostProcess:
    sets = (
        set_of("reconcile", True),
        set_of("nomad_address", api.address),
        set_of("release_grace_period", f"{GRACE_S:g}s"),
    )
    args = node.plugin_args(*sets, phase="run")
    args[args.index("--plugin") + 1] = str(plugin)
    proc = start_host([*args, "--duration", "0"], binary=host_binary)
    first_fingerprint_with_devices(proc)
    return proc


def _wait_grants(node: Node, predicate: Callable[[dict[str, GrantRecord]], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate(node.sim.grants()):
            return
        time.sleep(0.05)
    raise AssertionError(f"waited {timeout} s for {what}; XDM holds {sorted(node.sim.grants())}")


def _versions(launches: Path) -> list[str]:
    return [line.split()[0] for line in launches.read_text().splitlines()]


def test_upgrade_keeps_running_grants_and_releases_them_after_their_allocations_end(
    node: Node, api: NomadApiDouble, conformance_host: Path
) -> None:
    plugin_dir = node.root / "plugins"
    plugin_dir.mkdir()
    launches = node.root / "launches.log"
    plugin = _install(plugin_dir, "v1", launches)
    uuids = [c.uuid for c in node.sim.cards]

    # Version 1 runs and grants two allocations' devices.
    agent = _start_agent(node, api, plugin, conformance_host)
    grants = {}
    for alloc, ids in (("alloc-long", uuids[0:2]), ("alloc-short", uuids[2:3])):
        api.add_alloc(alloc, ids, "running", device=DEVICE)
        event = reserve(agent, ids, alloc)
        assert event["ok"] is True, event
        grants[alloc] = str(event["envs"]["LINGJUN_GRANT_ID"])
    assert set(node.sim.grants()) == set(grants.values())

    # Upgrade: stop the agent (it stops the plugin), replace the file, start the agent.
    assert_conformant(agent.finish())
    assert set(node.sim.grants()) == set(grants.values()), "stopping the agent must not release grants"
    plugin = _install(plugin_dir, "v2", launches)
    agent = _start_agent(node, api, plugin, conformance_host)
    assert _versions(launches)[-1] == "v2" and "v1" in _versions(launches)

    # Both allocations still run: v2 keeps both grants well past the grace period.
    time.sleep(GRACE_S + 1.5)
    assert set(node.sim.grants()) == set(grants.values()), "the new version released a running allocation's grant"

    # One ends, then the other: v2 releases each after its allocation ends.
    api.set_status("alloc-short", "complete")
    _wait_grants(node, lambda g: grants["alloc-short"] not in g, GRACE_S + 10, "alloc-short's grant released")
    assert grants["alloc-long"] in node.sim.grants()
    api.set_status("alloc-long", "complete")
    _wait_grants(node, lambda g: not g, GRACE_S + 10, "every grant released")

    # The freed cards are usable by the new version.
    api.add_alloc("alloc-next", uuids[0:2], "running", device=DEVICE)
    assert reserve(agent, uuids[0:2], "next")["ok"] is True
    assert_conformant(agent.finish())
    assert set(_versions(launches)) == {"v1", "v2"}
