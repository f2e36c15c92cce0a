"""--nvml-mirror: real GPUs presented as an XDM node, or a clear error where there are none."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from nomad_plugin._proto.lingjun import api_outer_pb2 as pb
from nomad_plugin.model.metrics import METRIC_IDS
from nomad_plugin.sim import Simulator
from nomad_plugin.sim.nvml_mirror import MirrorUnavailable, load_cards

from .conftest import Client

ROOT = Path(__file__).resolve().parents[2]


def _gpu_count() -> int:
    try:
        return len(load_cards()[0])
    except MirrorUnavailable:
        return 0


HAVE_GPU = _gpu_count() > 0


@pytest.mark.skipif(HAVE_GPU, reason="this machine has an NVIDIA GPU; the error path needs one without")
def test_no_gpu_is_a_clear_error(sock_dir):
    with pytest.raises(MirrorUnavailable, match="nvml mirror: "):
        Simulator(sock_dir, "nvml")
    out = subprocess.run(
        [sys.executable, "-m", "nomad_plugin.cli.main", "xdm-sim", "--nvml-mirror", "--socket-dir", str(sock_dir)],
        cwd=ROOT, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert out.returncode == 2 and "xdm-sim: nvml mirror:" in out.stderr


@pytest.mark.gpu
@pytest.mark.skipif(not HAVE_GPU, reason="needs a real NVIDIA GPU (NVML); covered on the device machine")
def test_mirror_presents_real_gpus(sock_dir):
    with Simulator(sock_dir, "nvml", collect_interval_ms=100) as sim:
        c = Client(sim)
        infos = c.xdm.ListGpuInfo(pb.ListGpuInfoRequest(), timeout=5).gpuInfos
        assert infos and all(i.uuid.startswith("GPU-") and i.totalMemory > 0 for i in infos)
        stream = c.xdm.ListAndWatch(pb.ListAndWatchRequest(), timeout=5)
        devices = next(stream).devices
        stream.cancel()
        assert [(d.minor, d.uuid, d.totalMemory) for d in devices] == [(i.minor, i.uuid, i.totalMemory) for i in infos]
        data = c.xdm.ExporterGetDataList(pb.ExporterDataRequest(devices=["0"]), timeout=5).dataList
        values = {d.metricId: d.value for d in data if "allocation_id" not in d.labels}
        assert 0 < values[METRIC_IDS["temperature_c"]] < 120
        assert 0 <= values[METRIC_IDS["memory_used_mib"]] <= values[METRIC_IDS["memory_total_mib"]]
        assert 0 < values[METRIC_IDS["power_w"]]
        resp = c.allocate("real", {"minor": 0, "core": 50, "memory": 4})
        assert resp.status == 0 and resp.devices[0].uuid == infos[0].uuid
        print("NVML MIRROR", [(i.minor, i.model, i.totalMemory, i.pciBusId, i.migEnabled) for i in infos], values)
        c.close()


def test_mirror_maps_what_nvml_reports(sock_dir, monkeypatch):
    """The mirror's mapping without a GPU: the shared NVML double (tests/doubles/fake_pynvml.py) is pynvml."""
    from tests.doubles.fake_pynvml import FakeNvml, h100, l40s

    fake = FakeNvml([h100(0), l40s(1)])
    fake.gpus[0].memory_used_mib = 2048
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    with Simulator(sock_dir, "nvml", control=False, collect_interval_ms=100) as sim:
        c = Client(sim)
        infos = c.xdm.ListGpuInfo(pb.ListGpuInfoRequest(), timeout=5).gpuInfos
        assert [(i.minor, i.uuid, i.model, i.totalMemory, i.pciBusId, i.migEnabled) for i in infos] == [
            (0, fake.gpus[0].uuid, "NVIDIA H100 80GB HBM3", 81559, "0000:18:00.0", True),
            (1, fake.gpus[1].uuid, "NVIDIA L40S", 46068, "0000:42:00.0", False),
        ]
        assert sim.profile == "nvml" and {i.driverVersion for i in infos} == {"550.54.15"}
        data = c.xdm.ExporterGetDataList(pb.ExporterDataRequest(devices=["1"]), timeout=5).dataList
        values = {d.metricId: d.value for d in data}
        assert values[METRIC_IDS["temperature_c"]] == 34 and values[METRIC_IDS["power_w"]] == 36.0
        assert values[METRIC_IDS["power_limit_w"]] == 350 and values[METRIC_IDS["sm_clock_mhz"]] == 2520
        used = {d.metricId: d.value for d in c.xdm.ExporterGetDataList(pb.ExporterDataRequest(devices=["0"])).dataList}
        assert used[METRIC_IDS["memory_used_mib"]] == 2048 and used[METRIC_IDS["memory_util_percent"]] == round(
            2048 / 81559 * 100, 2
        )
        c.close()
