"""``container_mounts`` end to end: the real plugin under the conformance host,
a simulated NVIDIA node whose Allocate answers carry a read-only driver mount,
and the Nomad API double serving allocations with their job (host volumes
included), the way a Nomad agent would when the client calls Reserve from the
task's prestart hooks (the allocation is already known, often still pending).
"""

from __future__ import annotations

from pathlib import Path

from nomad_plugin.reconcile.reconciler import ReconcilerState, reconciler_state_path
from nomad_plugin.sim.allocation import NVIDIA_DRIVER_DIR
from tests.conformance.hostlib import HostProcess, HostRun, start_host
from tests.doubles.nomad_api import NomadApiDouble
from tests.doubles.nomad_jobs import HostVolume, add_alloc_with_job
from tests.integration.harness import (
    Node,
    assert_conformant,
    first_fingerprint_with_devices,
    reserve,
    set_of,
)
from tests.waiting import wait_until

DEVICE = "nvidia/gpu/NVIDIA H800"
EMPTY = ReconcilerState(updated_at=0.0, grace=0.0, view_complete=False, view_reason="")
DRIVER_MOUNT = {"task_path": NVIDIA_DRIVER_DIR, "host_path": NVIDIA_DRIVER_DIR, "read_only": True}


def _launch(node: Node, api: NomadApiDouble, host_binary: Path, mode: str, *more: str) -> HostProcess:
    sets = (set_of("container_mounts", mode), set_of("nomad_address", api.address), *more)
    proc = start_host([*node.plugin_args(*sets, phase="run"), "--duration", "0"], binary=host_binary)
    first_fingerprint_with_devices(proc)
    return proc


def _mounts(proc: HostProcess, ids: list[str], tag: str) -> list[dict[str, object]]:
    event = reserve(proc, ids, tag)
    assert event["ok"] is True, event
    assert event["envs"]["LINGJUN_DEVICE_IDS"] == ",".join(ids)  # the grant itself is made either way
    return list(event["mounts"])


def _finish(proc: HostProcess) -> HostRun:
    run = proc.finish()
    assert_conformant(run)
    return run


def test_auto_passes_mounts_only_to_tasks_without_volume_mounts(
    node: Node, api: NomadApiDouble, conformance_host: Path
) -> None:
    proc = _launch(node, api, conformance_host, "auto")
    uuids = [c.uuid for c in node.sim.cards]

    add_alloc_with_job(api, "a-plain", uuids[0:1], "pending", device=DEVICE)
    assert _mounts(proc, uuids[0:1], "plain") == [DRIVER_MOUNT]

    add_alloc_with_job(api, "a-volume", uuids[1:3], "pending", device=DEVICE, volumes=[HostVolume()])
    assert _mounts(proc, uuids[1:3], "volume") == [], "a task with a host volume would lose it"

    # An old allocation with the same IDs still stopping, its replacement (with a volume) starting.
    add_alloc_with_job(api, "a-old", uuids[3:4], "running", device=DEVICE, desired_status="stop")
    add_alloc_with_job(api, "a-new", uuids[3:4], "pending", device=DEVICE, volumes=[HostVolume()])
    assert _mounts(proc, uuids[3:4], "replacement") == []

    # Nobody holds these IDs (yet): the plugin cannot tell, so it withholds.
    assert _mounts(proc, uuids[4:5], "unknown") == []

    # The Nomad API is down: cannot tell, withhold.
    add_alloc_with_job(api, "a-down", uuids[5:6], "pending", device=DEVICE)
    api.set_down(True)
    assert _mounts(proc, uuids[5:6], "api-down") == []
    api.set_down(False)

    # A terminal allocation does not count; the live one does.
    add_alloc_with_job(api, "a-done", uuids[6:7], "complete", device=DEVICE, volumes=[HostVolume()])
    add_alloc_with_job(api, "a-live", uuids[6:7], "running", device=DEVICE)
    assert _mounts(proc, uuids[6:7], "terminal-ignored") == [DRIVER_MOUNT]

    run = _finish(proc)
    assert "no live allocation on node" in run.stderr, "the reason for withholding is not logged"
    assert "the Nomad API could not be asked" in run.stderr


def test_always_passes_mounts_even_to_a_task_with_a_host_volume(
    node: Node, api: NomadApiDouble, conformance_host: Path
) -> None:
    proc = _launch(node, api, conformance_host, "always")
    uuids = [c.uuid for c in node.sim.cards]
    add_alloc_with_job(api, "a-volume", uuids[0:2], "pending", device=DEVICE, volumes=[HostVolume()])
    assert _mounts(proc, uuids[0:2], "volume") == [DRIVER_MOUNT]
    api.set_down(True)  # "always" never asks Nomad
    assert _mounts(proc, uuids[2:3], "no-alloc") == [DRIVER_MOUNT]
    _finish(proc)
    assert not [path for path, _ in api.requests if "/allocations" in path]


def test_never_withholds_mounts_from_a_task_without_volumes(
    node: Node, api: NomadApiDouble, conformance_host: Path
) -> None:
    proc = _launch(node, api, conformance_host, "never")
    uuids = [c.uuid for c in node.sim.cards]
    add_alloc_with_job(api, "a-plain", uuids[0:1], "running", device=DEVICE)
    assert _mounts(proc, uuids[0:1], "plain") == []
    _finish(proc)
    assert not [path for path, _ in api.requests if "/allocations" in path]


def test_auto_beside_the_reconciler_gives_the_same_verdicts(
    node: Node, api: NomadApiDouble, conformance_host: Path
) -> None:
    """With the reconciler watching the same agent, a Reserve reads only the allocation the reconciler's
    last answer names (afresh), and the verdicts are those the node list gives."""
    proc = _launch(node, api, conformance_host, "auto", set_of("reconcile", True), set_of("nomad_node_id", api.node_id))
    uuids = [c.uuid for c in node.sim.cards]
    add_alloc_with_job(api, "a-plain", uuids[0:1], "pending", device=DEVICE)
    add_alloc_with_job(api, "a-volume", uuids[1:3], "pending", device=DEVICE, volumes=[HostVolume()])
    state = reconciler_state_path(str(node.data_dir))
    wait_until(
        lambda: {"a-plain", "a-volume"} <= {a.id for a in (ReconcilerState.load(state) or EMPTY).allocs},
        "the reconciler to see both allocations",
    )
    mark = len(api.requests)
    assert _mounts(proc, uuids[0:1], "plain") == [DRIVER_MOUNT]
    assert _mounts(proc, uuids[1:3], "volume") == []
    asked = [path for path, _ in api.requests[mark:]]
    assert [p for p in asked if p.startswith("/v1/allocation/")] == [
        "/v1/allocation/a-plain",
        "/v1/allocation/a-volume",
    ]
    run = _finish(proc)
    for line in ("task a-plain/task has no volume_mount", "task a-volume/task has volume_mount"):
        assert line in run.stderr, "the audit line names the task the answer came from"
