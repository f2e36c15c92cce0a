"""SIGKILL a Reserve at each step, recover in a fresh process: no leaked, no double grants.

Checked against the simulator's own grant list (``sim.grants()``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import grpc
import pytest

from nomad_plugin import sim as sim_mod
from nomad_plugin._proto.lingjun import api_outer_pb2 as pb
from nomad_plugin._proto.lingjun import api_outer_pb2_grpc as pb_grpc
from tests.doubles.nomad_api import NomadApiDouble
from tests.doubles.reserve_fakes import STEPS

ROOT = str(Path(__file__).resolve().parents[2])


@pytest.fixture
def world(tmp_path):
    sockets = tempfile.mkdtemp(prefix="ljc-", dir="/tmp")
    # "ok": Release of an unknown id answers status 0. The default "not-found" mode is
    # covered by test_unknown_grant_release_counts_as_released (needs XdmBackend).
    sim = sim_mod.Simulator(sockets, profile="810e-16", release_unknown="ok").start()
    with NomadApiDouble() as api:
        yield sim, api, tmp_path, sockets
    sim.stop()


def write_spec(tmp_path, sim, api, sockets, ids):
    spec = {
        "data_dir": str(tmp_path / "data"),
        "socket_dir": sockets,
        "cards": [[c.minor, c.uuid] for c in sim.cards],
        "device_ids": ids,
        "nomad_address": api.address,
    }
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    return str(path)


def run(mode, spec, stop_at=""):
    env = dict(os.environ, LINGJUN_CRASH_STOP_AT=stop_at, PYTHONPATH=ROOT)
    return subprocess.Popen(
        [sys.executable, "-m", "tests.reserve.crash_driver", mode, spec],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def reserve_killed_at(spec, step):
    proc = run("reserve", spec, step)
    line = proc.stdout.readline()
    assert line.strip() == f"STOPPED {step}", proc.stderr.read() if proc.poll() is not None else line
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)


def recover(spec):
    proc = run("recover", spec)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.parametrize("step", STEPS)
def test_kill_at_step_then_recover_leaves_no_grant(world, step):
    sim, api, tmp_path, sockets = world
    ids = [sim.cards[3].uuid, sim.cards[4].uuid]
    spec = write_spec(tmp_path, sim, api, sockets, ids)
    reserve_killed_at(spec, step)
    expected_at_xdm = 0 if step == "before-allocate" else 1
    assert len(sim.grants()) == expected_at_xdm
    # The allocation has ended (Nomad failed the task when the plugin died).
    report = recover(spec)
    assert sim.grants() == {}, f"leaked: {list(sim.grants())}"
    assert report["left"] == []
    # The same IDs can be granted again, exactly once.
    proc = run("reserve", spec)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    gid = out.split()[-1]
    assert list(sim.grants()) == [gid]


@pytest.mark.parametrize("step", ["before-allocate", "after-allocate"])
def test_a_kill_around_allocate_finds_the_intent_on_disk_and_recovery_releases_it(world, step):
    """The intent is on disk before Allocate is called: whatever kills the Reserve, the next plugin names it."""
    from nomad_plugin.journal.store import decode

    sim, api, tmp_path, sockets = world
    spec = write_spec(tmp_path, sim, api, sockets, [sim.cards[5].uuid])
    reserve_killed_at(spec, step)
    [intent] = decode((tmp_path / "data" / "journal.json").read_bytes())
    assert intent.state.value == "intent" and intent.settle_until > 0
    assert list(sim.grants()) == ([] if step == "before-allocate" else [intent.grant_id])
    report = recover(spec)
    assert report["released_at_startup"] == 1, report
    assert sim.grants() == {}, f"leaked: {list(sim.grants())}"
    assert report["left"] == []


def test_journalled_grant_of_running_alloc_survives_recovery(world):
    sim, api, tmp_path, sockets = world
    ids = [sim.cards[7].uuid]
    spec = write_spec(tmp_path, sim, api, sockets, ids)
    reserve_killed_at(spec, "after-journal")
    [gid] = list(sim.grants())
    api.add_alloc("alloc-live", ids)
    report = recover(spec)
    assert report["left"] == [{"grant_id": gid, "state": "granted"}]
    assert list(sim.grants()) == [gid]
    api.set_status("alloc-live", "complete")
    assert recover(spec)["left"] == [] and sim.grants() == {}


def test_unknown_grant_release_counts_as_released(tmp_path):
    """Route (d) end to end: the simulator's default NOT_FOUND answer is "released"; other refusals are not."""
    from nomad_plugin.config.model import PluginConfig
    from nomad_plugin.model.errors import BackendRefused
    from tests.reserve.crash_driver import make_backend

    unknown = "7d55e706-fc03-4107-bed0-06e64c54300d"
    sockets = tempfile.mkdtemp(prefix="ljn-", dir="/tmp")
    sim = sim_mod.Simulator(sockets, profile="810e-16").start()
    backend = make_backend(
        PluginConfig(xdm_socket=f"{sockets}/dp2mgr.sock", config_socket=f"{sockets}/config-daemon.sock")
    )
    try:
        # The simulator really answers NOT_FOUND here (else the test proves nothing).
        with grpc.insecure_channel(f"unix:{sockets}/dp2mgr.sock") as channel:
            stub = pb_grpc.XpuDeviceManagerServiceStub(channel)
            answer = stub.Release(pb.ReleaseRequest(id=unknown), timeout=5)
        assert answer.status == grpc.StatusCode.NOT_FOUND.value[0], answer  # in-band, the simulator's default
        backend.release(unknown)  # not found = released: must not raise
        # Any other refusal still fails the release: an empty id is INVALID_ARGUMENT.
        with pytest.raises(BackendRefused):
            backend.release("")
        assert sim.grants() == {}
    finally:
        backend.stop()
        sim.stop()
        shutil.rmtree(sockets, ignore_errors=True)
