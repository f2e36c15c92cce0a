"""Schema-drift modes (tests/doubles/drift.py, served by DriftedSimulator) produce the intended wire shapes
(checked on raw bytes, read with protobuf's own unknown-field parser: every field of a message parsed as
``Empty`` is unknown)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from google.protobuf import empty_pb2
from google.protobuf.unknown_fields import UnknownFieldSet

from nomad_plugin._proto.lingjun import api_outer_pb2 as pb
from nomad_plugin._proto.lingjun import config_service_pb2 as cfg
from tests.waiting import DEADLINE_S, wait_until

GPU_INFO = "/xdm.XpuDeviceManagerService/ListGpuInfo"
VARINT, LEN = 0, 2  # protobuf wire types
CTL = [sys.executable, "-m", "nomad_plugin.cli.main", "xdm-sim", "ctl"]


def _first_stream_message(client, path: str, request: bytes = b"") -> bytes:
    call = client.channel.unary_stream(path, request_serializer=None, response_deserializer=None)
    stream = call(request, timeout=5)
    first = next(stream)
    stream.cancel()
    return first


def _fields(data: bytes, number: int) -> list:
    return [f for f in UnknownFieldSet(empty_pb2.Empty.FromString(data)) if f.field_number == number]


def test_no_drift_baseline(sim_client):
    _, c = sim_client
    raw = c.raw(GPU_INFO)
    assert not _fields(raw, 1000)
    assert pb.ListGpuInfoResponse.FromString(raw).gpuInfos[0].totalMemory == 81559


@pytest.mark.parametrize(("package", "prefix"), [("api", "api."), ("none", "")])
def test_package_drift(make_sim, package, prefix):
    _, c = make_sim(drift=f"package={package}")
    with pytest.raises(grpc.RpcError) as err:
        c.raw(GPU_INFO)
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    raw = c.raw(f"/{prefix}XpuDeviceManagerService/ListGpuInfo")
    assert len(pb.ListGpuInfoResponse.FromString(raw).gpuInfos) == 8
    assert _first_stream_message(c, f"/{prefix}XpuDeviceManagerService/ListAndWatch")


def test_split_services(make_sim):
    sim, c = make_sim(drift="none")
    sim.set_drift("split-services")
    with pytest.raises(grpc.RpcError) as err:
        c.xdm.ListGpuInfo(pb.ListGpuInfoRequest(), timeout=5)
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert pb.ListGpuInfoResponse.FromString(c.raw("/xdm.XpuExporterService/ListGpuInfo")).gpuInfos
    for rpc in ("ExporterGetConfig", "ExporterGetStatus", "ExporterGetDataList"):
        c.raw(f"/xdm.XpuExporterService/{rpc}")
    assert _first_stream_message(c, "/xdm.XpuExporterService/ExporterDataStream")
    assert c.allocate("still-here", {"minor": 0}).status == 0  # resource RPCs stay in the main service
    sim.set_drift(None)
    assert c.xdm.ListGpuInfo(pb.ListGpuInfoRequest(), timeout=5).gpuInfos


def test_extra_fields_everywhere(make_sim):
    _sim, c = make_sim(drift="extra-fields")
    raw = c.raw(GPU_INFO)
    assert [f.data for f in _fields(raw, 1000)] == [1]
    assert [f.data for f in _fields(raw, 1001)] == [b"xdm-sim-extra"]
    for info in _fields(raw, 3):
        assert _fields(info.data, 1000) and _fields(info.data, 1001)
    parsed = pb.ListGpuInfoResponse.FromString(raw)  # the stubs still parse it
    assert len(parsed.gpuInfos) == 8 and len(UnknownFieldSet(parsed)) == 2
    law = _first_stream_message(c, "/xdm.XpuDeviceManagerService/ListAndWatch")
    assert _fields(law, 1000) and all(_fields(d.data, 1001) for d in _fields(law, 1))
    alloc = c.allocate("e", {"minor": 1})
    assert alloc.status == 0 and len(UnknownFieldSet(alloc)) == 2
    assert len(UnknownFieldSet(alloc.devices[0])) == 2
    status = c.config.QueryStatus(cfg.QueryStatusRequest(), timeout=5)
    assert status.enabled and len(UnknownFieldSet(status)) == 2


def test_type_clash(make_sim):
    sim, c = make_sim(drift="type-clash")
    sim.set_health(1, False, "XID 79")
    law = _first_stream_message(c, "/xdm.XpuDeviceManagerService/ListAndWatch")
    devices = [d.data for d in _fields(law, 1)]
    health = [_fields(d, 5)[0] for d in devices]
    assert all(h.wire_type == VARINT for h in health)
    assert [h.data for h in health[:3]] == [1, 0, 1]
    total = _fields(devices[0], 6)[0]
    assert (total.wire_type, total.data) == (LEN, b"81559")
    parsed = pb.ListAndWatchResponse.FromString(law)  # declared fields come back empty
    assert parsed.devices[0].health == "" and parsed.devices[0].totalMemory == 0
    assert {u.field_number for u in UnknownFieldSet(parsed.devices[0])} == {5, 6}
    info = _fields(c.raw(GPU_INFO), 3)[0].data
    assert _fields(info, 7)[0].data == b"81559"
    data = c.raw(
        "/xdm.XpuDeviceManagerService/ExporterGetDataList", pb.ExporterDataRequest(metricIds=[4]).SerializeToString()
    )
    sample = _fields(data, 3)[0].data
    assert (_fields(sample, 2)[0].wire_type, _fields(sample, 2)[0].data) == (LEN, b"4")


def test_status_shift_makes_failure_look_like_success(make_sim):
    _, c = make_sim(drift="status-shift")
    call = c.channel.unary_unary(
        "/xdm.XpuDeviceManagerService/Allocate", request_serializer=None, response_deserializer=None
    )
    bad = pb.AllocateRequest(id="x", devices=[pb.DeviceRequest(minor=42)]).SerializeToString()
    raw = call(bad, timeout=5)
    assert not _fields(raw, 1) and not _fields(raw, 2)
    assert _fields(raw, 15)[0].data == grpc.StatusCode.NOT_FOUND.value[0]
    assert b"no card 42" in _fields(raw, 16)[0].data
    parsed = pb.AllocateResponse.FromString(raw)
    assert parsed.status == 0 and not parsed.devices  # "success" without a grant
    assert c.allocate("ok", {"minor": 0}).devices[0].minor == 0  # successes are unchanged


def test_minor_omit_zero(make_sim):
    sim, c = make_sim(drift="none")
    assert c.allocate("w0", {"minor": 0}).status == 0
    assert c.allocate("a", {"minor": 0, "core": 10}).status != 0  # explicit card 0 is busy
    sim.set_drift("minor-omit-zero")
    resp = c.allocate("b", {"minor": 0, "core": 10})
    assert resp.status == 0 and resp.devices[0].minor == 1  # treated as "left empty": auto-assigned elsewhere


def test_combined_modes_and_bad_mode(make_sim):
    sim, _ = make_sim(drift="none")
    sim.set_drift("split-services, extra-fields, package=amp.xdm")
    assert sim.drift.describe() == "package=amp.xdm,split-services,extra-fields"
    with pytest.raises(ValueError, match="drift: unknown mode 'shuffle'"):
        sim.set_drift("shuffle")


def test_drifted_simulator_process_takes_drift_over_the_control_socket(sock_dir):
    """``python -m tests.doubles.drifted_sim``: real sockets, ``xdm-sim ctl`` drives its drift."""
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.doubles.drifted_sim", "--socket-dir", str(sock_dir), "--drift", "extra-fields"],
        cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        control = sock_dir / "xdm-sim-control.sock"
        wait_until(lambda: control.exists() or proc.poll() is not None, f"drifted_sim's control socket {control}")
        assert proc.poll() is None, proc.communicate()[1]

        def ctl(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([*CTL, "--socket-dir", str(sock_dir), *args], cwd=root, capture_output=True,
                                  text=True, timeout=60)  # fmt: skip

        assert json.loads(ctl("status").stdout)["drift"] == "extra-fields"
        with grpc.insecure_channel(f"unix:{sock_dir / 'dp2mgr.sock'}") as channel:
            call = channel.unary_unary(GPU_INFO, request_serializer=None, response_deserializer=None)
            assert _fields(call(b"", timeout=5, wait_for_ready=True), 1000)
            assert ctl("drift", "none").returncode == 0
            assert not _fields(call(b"", timeout=5), 1000)
        assert json.loads(ctl("status").stdout)["drift"] == "none"
        bad = ctl("drift", "shuffle")
        assert bad.returncode == 1 and "drift: unknown mode 'shuffle'" in bad.stderr
    finally:
        proc.terminate()
        proc.communicate(timeout=DEADLINE_S)
    assert proc.returncode == 0
    assert not (sock_dir / "dp2mgr.sock").exists()
