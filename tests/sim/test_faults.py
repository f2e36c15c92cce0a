"""Faults (restart, crash, slow start, latency, missing directory) and the config daemon."""

from __future__ import annotations

import errno
import math
import socket
import stat
import threading
import time

import grpc
import pytest

from nomad_plugin._proto.lingjun import api_outer_pb2 as pb
from nomad_plugin._proto.lingjun import config_service_pb2 as cfg
from nomad_plugin.sim import Simulator

from .conftest import Client
from .test_streams import Reader


def _wait(predicate, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False


def test_restart_unlinks_socket_then_rebinds_and_grants_survive(sim_client):
    sim, c = sim_client
    assert c.allocate("keep", {"minor": 1, "core": 60}).status == 0
    law = Reader(c.xdm.ListAndWatch(pb.ListAndWatchRequest()))
    law.next()
    t = threading.Thread(target=sim.restart, kwargs={"downtime": 0.6})
    t.start()
    assert _wait(lambda: not sim.dp2mgr_path.exists() and not sim.config_path.exists())
    assert law.done.wait(3) and law.error.code() == grpc.StatusCode.UNAVAILABLE
    t.join(5)
    assert stat.S_ISSOCK(sim.dp2mgr_path.stat().st_mode)
    assert set(sim.grants()) == {"keep"}
    resp = c.xdm.Allocate(
        pb.AllocateRequest(id="more", devices=[pb.DeviceRequest(minor=1, core=50)]), timeout=5, wait_for_ready=True
    )
    assert resp.status == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]  # the surviving 60% still counts


def test_grants_and_flag_survive_in_state_file(sock_dir, tmp_path):
    state = tmp_path / "state.json"
    with Simulator(sock_dir, "a100-8", state_file=state, control=False) as sim:
        c = Client(sim)
        assert c.allocate("m", {"minor": 0, "slice": 3}).status == 0
        c.config.Disable(cfg.DisableRequest(), timeout=5)
        c.close()
    with Simulator(sock_dir, "a100-8", state_file=state, control=False) as sim2:
        c = Client(sim2)
        assert sim2.grants()["m"].slice == 3
        assert c.config.QueryStatus(cfg.QueryStatusRequest(), timeout=5).enabled is False
        c.close()


def test_restart_reloads_state_file(sock_dir, tmp_path):
    state = tmp_path / "state.json"
    with Simulator(sock_dir, state_file=state, control=False) as sim:
        c = Client(sim)
        assert c.allocate("g", {"minor": 2}).status == 0
        sim.state.grants.clear()  # lose memory: only the file can bring it back
        sim.restart(downtime=0.05)
        assert set(sim.grants()) == {"g"}
        c.close()


def test_crash_leaves_stale_socket_then_revive(sim_client):
    sim, c = sim_client
    assert c.allocate("g", {"minor": 0}).status == 0
    sim.crash()
    assert stat.S_ISSOCK(sim.dp2mgr_path.stat().st_mode)
    with socket.socket(socket.AF_UNIX) as raw, pytest.raises(OSError) as err:
        raw.connect(str(sim.dp2mgr_path))
    assert err.value.errno == errno.ECONNREFUSED
    with pytest.raises(grpc.RpcError) as rpc_err:
        c.xdm.ListGpuInfo(pb.ListGpuInfoRequest(), timeout=1)
    assert rpc_err.value.code() == grpc.StatusCode.UNAVAILABLE
    sim.revive()
    assert len(c.xdm.ListGpuInfo(pb.ListGpuInfoRequest(), timeout=5, wait_for_ready=True).gpuInfos) == 8
    assert set(sim.grants()) == {"g"}


def test_slow_start(sim_client):
    sim, c = sim_client
    sim.slow_start(3.0)
    with pytest.raises(grpc.RpcError) as err:
        c.xdm.ListGpuInfo(pb.ListGpuInfoRequest(), timeout=0.2)
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert len(c.xdm.ListGpuInfo(pb.ListGpuInfoRequest(), timeout=30).gpuInfos) == 8
    # Once started, no more slow start: far below the 3 s it took (a bound a loaded box keeps).
    start = time.monotonic()
    c.xdm.ListGpuInfo(pb.ListGpuInfoRequest(), timeout=30)
    assert time.monotonic() - start < 1.5


def test_slow_start_after_crash_brings_sockets_back_hanging(sim_client):
    sim, c = sim_client
    sim.crash()
    sim.slow_start(0.4)
    assert stat.S_ISSOCK(sim.dp2mgr_path.stat().st_mode)
    start = time.monotonic()
    c.xdm.ListGpuInfo(pb.ListGpuInfoRequest(), timeout=5, wait_for_ready=True)
    assert time.monotonic() - start >= 0.2


def test_latency_per_rpc_and_hang(sim_client):
    sim, c = sim_client
    sim.set_latency("Allocate", 3.0)
    start = time.monotonic()
    c.allocate("slow", {"minor": 0, "core": 5})
    assert time.monotonic() - start >= 3.0
    # Other RPCs keep no latency: far below Allocate's 3 s (a bound a loaded box keeps).
    start = time.monotonic()
    c.xdm.ListGpuInfo(pb.ListGpuInfoRequest(), timeout=30)
    assert time.monotonic() - start < 1.5
    sim.set_latency("*", math.inf)
    with pytest.raises(grpc.RpcError) as err:
        c.xdm.ListGpuInfo(pb.ListGpuInfoRequest(), timeout=0.3)
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    sim.set_latency("*", 0)
    sim.set_latency("Allocate", 0)
    c.xdm.ListGpuInfo(pb.ListGpuInfoRequest(), timeout=1)
    with pytest.raises(ValueError, match="rpc: unknown RPC 'Alocate'"):
        sim.set_latency("Alocate", 1)


def test_socket_directory_missing_during_restart(make_sim):
    sim, c = make_sim(control=False)
    t = threading.Thread(target=sim.restart, kwargs={"downtime": 0.5, "remove_dir": True})
    t.start()
    assert _wait(lambda: not sim.socket_dir.exists())
    t.join(5)
    assert sim.socket_dir.is_dir()
    assert c.xdm.ListGpuInfo(pb.ListGpuInfoRequest(), timeout=5, wait_for_ready=True).gpuInfos


def test_start_creates_missing_directory(tmp_path):
    deep = tmp_path / "a" / "b"
    with Simulator(deep, control=False) as sim:
        assert stat.S_ISSOCK(sim.dp2mgr_path.stat().st_mode) and sim.config_path.exists()
    assert not sim.dp2mgr_path.exists()


def test_config_daemon_enable_disable_query(sim_client):
    sim, c = sim_client
    assert c.config.QueryStatus(cfg.QueryStatusRequest(), timeout=5).enabled is True
    resp = c.config.Disable(cfg.DisableRequest(), timeout=5)
    assert resp.success
    assert c.config.QueryStatus(cfg.QueryStatusRequest(), timeout=5).enabled is False
    assert c.config.Enable(cfg.EnableRequest(), timeout=5).success
    assert c.config.QueryStatus(cfg.QueryStatusRequest(), timeout=5).enabled is True
    sim.config_fail = True  # Enable and Disable answer success: false while set
    failed = c.config.Disable(cfg.DisableRequest(), timeout=5)
    assert not failed.success and "failed" in failed.message
    assert c.config.QueryStatus(cfg.QueryStatusRequest(), timeout=5).enabled is True


def test_stop_ends_streams_and_removes_sockets(sock_dir):
    sim = Simulator(sock_dir, control=False, collect_interval_ms=100).start()
    c = Client(sim)
    r = Reader(c.xdm.ExporterDataStream(pb.ExporterDataRequest()))
    r.next()
    sim.stop()
    assert r.done.wait(3) and r.error.code() == grpc.StatusCode.UNAVAILABLE
    assert not sim.dp2mgr_path.exists() and not sim.config_path.exists()
    c.close()
