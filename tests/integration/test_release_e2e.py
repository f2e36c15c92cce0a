"""Release lifecycle end to end: Nomad never tells a device plugin that a task
ended, so the plugin must notice through the Nomad API and release the XDM
grant itself.

The real plugin runs under the conformance host with reconcile on, pointed at
the Nomad API double (tests/doubles/nomad_api.py) and a simulated XDM
node. Allocations are registered in the double the way Nomad would hold them
(the device IDs Reserve got), then ended; the simulator's own grant table
(sim.grants()) says whether XDM still holds the cards.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

from nomad_plugin.sim import GrantRecord
from tests.conformance.hostlib import HostProcess, start_host
from tests.doubles.nomad_api import NomadApiDouble
from tests.integration.harness import (
    Node,
    assert_conformant,
    first_fingerprint_with_devices,
    reserve,
    set_of,
)

GRACE_S = 1.0
DEVICE = "nvidia/gpu/NVIDIA H800"


def _launch(node: Node, api: NomadApiDouble, host_binary: Path) -> HostProcess:
    sets = (
        set_of("reconcile", True),
        set_of("nomad_address", api.address),
        set_of("release_grace_period", f"{GRACE_S:g}s"),
    )
    args = [*node.plugin_args(*sets, phase="run"), "--duration", "0", "--stats-interval", "1"]
    proc = start_host(args, binary=host_binary)
    first_fingerprint_with_devices(proc)
    return proc


def _wait_grants(node: Node, predicate: Callable[[dict[str, GrantRecord]], bool], timeout: float) -> float:
    """Poll sim.grants() until predicate holds; return the seconds it took."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if predicate(node.sim.grants()):
            return time.monotonic() - start
        time.sleep(0.05)
    raise AssertionError(f"grants did not reach the expected state in {timeout} s: {sorted(node.sim.grants())}")


def _reserve_for(proc: HostProcess, api: NomadApiDouble, alloc_id: str, ids: list[str]) -> str:
    """Nomad's order: the allocation exists (with its device IDs), then Reserve is called."""
    api.add_alloc(alloc_id, ids, "running", device=DEVICE)
    event = reserve(proc, ids, alloc_id)
    assert event["ok"] is True, event
    return str(event["envs"]["LINGJUN_GRANT_ID"])


def test_grant_released_after_its_allocation_completes(node: Node, api: NomadApiDouble, conformance_host: Path) -> None:
    proc = _launch(node, api, conformance_host)
    uuids = [c.uuid for c in node.sim.cards]
    done = _reserve_for(proc, api, "alloc-done", uuids[0:2])
    live = _reserve_for(proc, api, "alloc-live", uuids[2:3])
    assert set(node.sim.grants()) == {done, live}

    # Running allocations keep their grants well past the grace period.
    time.sleep(GRACE_S + 1.5)
    assert set(node.sim.grants()) == {done, live}

    api.set_status("alloc-done", "complete")
    took = _wait_grants(node, lambda g: done not in g, timeout=GRACE_S + 30)
    assert took >= GRACE_S * 0.9, f"released after {took:.2f} s, before the {GRACE_S} s grace period"
    assert live in node.sim.grants()

    # The freed cards can be reserved again (Nomad would hand them to the next allocation).
    again = _reserve_for(proc, api, "alloc-next", uuids[0:2])
    assert set(node.sim.grants()) == {again, live}

    api.remove_alloc("alloc-live")  # garbage-collected: gone from the API altogether
    _wait_grants(node, lambda g: live not in g, timeout=GRACE_S + 30)
    assert set(node.sim.grants()) == {again}

    assert_conformant(proc.finish())


def test_relaunched_plugin_releases_what_ended_while_it_was_down(
    node: Node, api: NomadApiDouble, conformance_host: Path
) -> None:
    proc = _launch(node, api, conformance_host)
    uuids = [c.uuid for c in node.sim.cards]
    keep = _reserve_for(proc, api, "alloc-keep", uuids[0:1])
    ended = _reserve_for(proc, api, "alloc-ended", uuids[1:3])
    assert set(node.sim.grants()) == {keep, ended}

    plugin_pid = next(e["pid"] for e in proc.events if e["event"] == "launch" and e["launch"] == 3)
    os.kill(plugin_pid, signal.SIGKILL)
    proc.finish(timeout=10)  # the first host run ends with the killed plugin; not judged

    # While no plugin runs, one allocation ends; XDM still holds both grants.
    api.set_status("alloc-ended", "complete")
    time.sleep(GRACE_S + 0.5)
    assert set(node.sim.grants()) == {keep, ended}

    # Same data_dir: the new process reads the journal and reconciles.
    relaunched = _launch(node, api, conformance_host)
    _wait_grants(node, lambda g: ended not in g, timeout=GRACE_S + 30)
    time.sleep(GRACE_S + 1.0)
    assert set(node.sim.grants()) == {keep}, "the grant of a live allocation was released"

    assert_conformant(relaunched.finish())
