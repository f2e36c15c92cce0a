"""The Runtime Kit switch beside the real plugin process (conformance host, simulator, Nomad API double).

``runtime-kit disable`` then ``status`` says disabled, the fingerprint's
``runtime_kit`` attribute and the ``lingjun.runtime_kit`` meta key follow
within one inventory period, Reserve is refused while disabled (the
simulator's safest reading), and ``enable`` restores all of it. The
simulator's call counts prove the plugin itself never called Enable or
Disable: every one it received came from the command.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

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
from tests.waiting import wait_until

RESYNC_S = 1.0


@pytest.fixture
def node() -> Iterator[Node]:
    with sim_node("h800-8") as n:
        yield n


@pytest.fixture
def api() -> Iterator[NomadApiDouble]:
    with NomadApiDouble(meta_batch=(0.3, 0.3)) as double:
        yield double


def runtime_kit(node: Node, *argv: str) -> subprocess.CompletedProcess[str]:
    """The command as an operator (or the sysbatch job) runs it: its own process."""
    sets = ["--set", f'config_socket="{node.sim.config_path}"', "--set", f'data_dir="{node.data_dir}"']
    return subprocess.run(
        [sys.executable, "-m", "nomad_plugin", "runtime-kit", *argv, *sets],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def says(event: dict[str, object], status: str) -> bool:
    groups = event.get("groups") or []
    assert isinstance(groups, list)
    return bool(groups) and all(g["attributes"].get("runtime_kit", {}).get("value") == status for g in groups)


def fingerprint_says(proc: HostProcess, status: str) -> None:
    """The latest fingerprint (already received, or the next ones) carries ``runtime_kit = status``."""
    received = [e for e in proc.events if e["event"] == "fingerprint" and e["groups"]]
    if received and says(received[-1], status):
        return
    proc.wait_for(lambda e: e["event"] == "fingerprint" and says(e, status), timeout=DEADLINE_S)


def test_disable_then_enable_shows_in_status_fingerprint_and_meta(
    node: Node, api: NomadApiDouble, conformance_host: Path
) -> None:
    sets = (
        set_of("node_meta", True),
        set_of("nomad_address", api.address),
        set_of("inventory_resync_period", f"{RESYNC_S:g}s"),
    )
    proc = start_host([*node.plugin_args(*sets, phase="run"), "--duration", "0"], binary=conformance_host)
    first_fingerprint_with_devices(proc)
    fingerprint_says(proc, "enabled")
    wait_until(lambda: api.registered_meta().get("lingjun.runtime_kit") == "enabled", "meta: enabled", DEADLINE_S)

    done = runtime_kit(node, "disable", "--yes")
    assert done.returncode == 0 and "enabled -> disabled" in done.stdout, done.stderr
    status = runtime_kit(node, "status", "--json")
    assert json.loads(status.stdout)["status"] == "disabled"
    fingerprint_says(proc, "disabled")
    wait_until(lambda: api.registered_meta().get("lingjun.runtime_kit") == "disabled", "meta: disabled", DEADLINE_S)
    refused = reserve(proc, [node.sim.cards[0].uuid], "while-disabled", expect="error")
    assert refused["ok"] is False and "disabled" in json.dumps(refused), refused

    done = runtime_kit(node, "enable", "--yes")
    assert done.returncode == 0 and "disabled -> enabled" in done.stdout, done.stderr
    assert json.loads(runtime_kit(node, "status", "--json").stdout)["status"] == "enabled"
    fingerprint_says(proc, "enabled")
    wait_until(lambda: api.registered_meta().get("lingjun.runtime_kit") == "enabled", "meta: enabled", DEADLINE_S)
    granted = reserve(proc, [node.sim.cards[0].uuid], "after-enable")
    assert granted["ok"] is True, granted

    run = proc.finish()
    assert_conformant(run)
    calls = node.sim.calls()
    assert calls.get("QueryStatus", 0) > 4  # the plugin polls it every period
    assert (calls.get("Disable", 0), calls.get("Enable", 0)) == (1, 1), calls  # the command's two, none more


def test_the_plugin_never_calls_enable_or_disable(node: Node, api: NomadApiDouble, conformance_host: Path) -> None:
    """A whole session of the plugin, Runtime Kit switched under it by the simulator itself."""
    sets = (set_of("nomad_address", api.address), set_of("inventory_resync_period", f"{RESYNC_S:g}s"))
    proc = start_host([*node.plugin_args(*sets, phase="run"), "--duration", "0"], binary=conformance_host)
    first_fingerprint_with_devices(proc)
    node.sim.set_enabled(False)
    fingerprint_says(proc, "disabled")
    reserve(proc, [node.sim.cards[1].uuid], "refused", expect="error")
    node.sim.set_enabled(True)
    fingerprint_says(proc, "enabled")
    assert reserve(proc, [node.sim.cards[1].uuid], "granted")["ok"] is True
    node.sim.restart(0.2)
    first_fingerprint_with_devices(proc)
    assert_conformant(proc.finish())
    calls = node.sim.calls()
    assert calls.get("QueryStatus", 0) >= 2 and calls.get("Allocate", 0) >= 1
    assert "Enable" not in calls and "Disable" not in calls, calls
