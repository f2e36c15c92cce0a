"""The xdm-sim command: --help, a foreground run as a subprocess, and ctl over the control socket."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from nomad_plugin._proto.lingjun import api_outer_pb2 as pb
from nomad_plugin._proto.lingjun import api_outer_pb2_grpc as pb_grpc
from nomad_plugin.sim.control import send_command

ROOT = Path(__file__).resolve().parents[2]
CMD = [sys.executable, "-m", "nomad_plugin.cli.main", "xdm-sim"]


def _run(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CMD, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_help_documents_profiles_faults_and_ctl():
    out = _run("--help")
    assert out.returncode == 0
    for word in ("h800-8", "810e-16", "nvidia-nomig-8", "crash", "slow-start", "ctl --socket-dir", "health MINOR",
                 "--nvml-mirror", "0-based"):  # fmt: skip
        assert word in out.stdout, word
    for word in ("--drift", "type-clash", "status-shift", "minor-omit-zero"):  # drift is the tests' (tests/doubles)
        assert word not in out.stdout, word


def test_bad_profile_exits_2_with_message(sock_dir):
    out = _run("--profile", "x9", "--socket-dir", str(sock_dir))
    assert out.returncode == 2 and "unknown profile 'x9'" in out.stderr


def test_ctl_without_simulator_fails_clearly(sock_dir):
    out = _run("ctl", "--socket-dir", str(sock_dir), "status")
    assert out.returncode == 1 and "is xdm-sim running?" in out.stderr


@pytest.fixture
def running(sock_dir):
    proc = subprocess.Popen(
        [*CMD, "--profile", "m890p-8", "--socket-dir", str(sock_dir), "--collect-interval-ms", "100"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    control = sock_dir / "xdm-sim-control.sock"
    deadline = time.monotonic() + 20
    while not control.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert control.exists(), proc.stderr.read() if proc.poll() is not None else "no control socket"
    yield proc, sock_dir
    if proc.poll() is None:
        proc.kill()
        proc.wait(5)


def test_foreground_run_serves_and_stops_on_sigterm(running):
    proc, sock_dir = running
    with grpc.insecure_channel(f"unix:{sock_dir / 'dp2mgr.sock'}") as channel:
        stub = pb_grpc.XpuDeviceManagerServiceStub(channel)
        infos = stub.ListGpuInfo(pb.ListGpuInfoRequest(), timeout=5, wait_for_ready=True).gpuInfos
        assert [i.model for i in infos] == ["PPU M890P"] * 8
        resp = stub.Allocate(pb.AllocateRequest(id="cli", devices=[pb.DeviceRequest(minor=2, core=50)]), timeout=5)
        assert resp.status == 0
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=10)
    assert proc.returncode == 0
    assert out == ""  # the log goes to stderr only
    assert "card 7 PPU-" in err and 'Allocate id: "cli"' in err and "SIGTERM" in err
    assert not (sock_dir / "dp2mgr.sock").exists()


def test_ctl_commands_from_another_process(running):
    _proc, sock_dir = running

    def ctl(*args: str) -> subprocess.CompletedProcess[str]:
        return _run("ctl", "--socket-dir", str(sock_dir), *args)

    with grpc.insecure_channel(f"unix:{sock_dir / 'dp2mgr.sock'}") as channel:
        stub = pb_grpc.XpuDeviceManagerServiceStub(channel)
        stream = stub.ListAndWatch(pb.ListAndWatchRequest(), timeout=20, wait_for_ready=True)
        assert next(stream).devices[3].health == "Healthy"
        out = ctl("health", "3", "unhealthy", "XID 79")
        assert out.returncode == 0, out.stderr
        pushed = next(stream)
        assert pushed.devices[3].health == "Unhealthy"
        assert pushed.devices[3].extenderResources["healthReason"] == "XID 79"
        stream.cancel()
        stub.Allocate(pb.AllocateRequest(id="g1", devices=[pb.DeviceRequest(minor=1)]), timeout=5)
    grants = json.loads(ctl("grants").stdout)
    assert grants["g1"]["minors"] == [1] and grants["g1"]["created"] > 0
    assert ctl("latency", "Allocate", "0.2").returncode == 0
    unknown = ctl("drift", "extra-fields")
    assert unknown.returncode == 1 and "unknown command 'drift'" in unknown.stderr
    status = json.loads(ctl("status").stdout)
    assert "drift" not in status and status["latency"] == {"Allocate": 0.2}
    assert status["cards"][3]["healthy"] is False and status["cards"][3]["reason"] == "XID 79"
    assert ctl("restart", "0.1").returncode == 0
    assert json.loads(ctl("grants").stdout).keys() == {"g1"}
    bad = ctl("health", "99", "healthy")
    assert bad.returncode == 1 and "no card 99" in bad.stderr
    assert ctl("frobnicate").returncode == 1


def test_control_socket_in_process(sim_client):
    sim, c = sim_client
    send_command(sim.control_path, ["crash"])
    assert sim.crashed and sim.dp2mgr_path.exists()
    send_command(sim.control_path, ["revive"])
    assert c.xdm.ListGpuInfo(pb.ListGpuInfoRequest(), timeout=5, wait_for_ready=True).gpuInfos
    for argv in (["error-mode", "grpc"], ["duplicate-id", "idempotent"], ["release-unknown", "ok"],
                 ["exporter", "stopped"], ["disable"], ["remove", "7"], ["slow-start", "0"], ["close-streams"]):  # fmt: skip
        assert send_command(sim.control_path, argv) == "ok", argv
    assert sim.options.error_mode == "grpc" and sim.options.duplicate_id_mode == "idempotent"
    assert sim.exporter_state == "stopped" and not sim.state.enabled and 7 not in sim.present
    with pytest.raises(RuntimeError, match="error_mode: 'loud'"):
        send_command(sim.control_path, ["error-mode", "loud"])
