from __future__ import annotations

import threading

import pytest

from nomad_plugin.model.errors import BackendUnavailable
from nomad_plugin.model.metrics import METRIC_IDS
from nomad_plugin.nvml.devices import PARENT_LABEL
from tests.doubles.fake_pynvml import FakeNvml


def _by(samples, device):
    return {s.name: s.value for s in samples if s.device == device}


def test_card_readings_match_nvml(fake: FakeNvml, make_backend) -> None:
    gpu = fake.gpus[0]
    gpu.util_gpu, gpu.util_memory, gpu.memory_used_mib = 87, 41, 40960
    gpu.temperature_c, gpu.power_mw, gpu.power_limit_mw = 61, 512_345, 700_000
    gpu.ecc_sbe, gpu.ecc_dbe, gpu.remapped_rows = 4, 0, (2, 1)
    gpu.sm_clock_mhz, gpu.memory_clock_mhz = 1755, 2619
    gpu.clock_event_reasons = fake.nvmlClocksEventReasonSwPowerCap | fake.nvmlClocksEventReasonHwThermalSlowdown
    backend = make_backend(fake, clock=lambda: 1700000000.5)
    samples = backend.metrics_snapshot()
    values = _by(samples, gpu.uuid)
    assert values == {
        "core_util_percent": 87,
        "memory_util_percent": 41,
        "memory_used_mib": 40960,
        "memory_total_mib": 81559,
        "temperature_c": 61,
        "power_w": 512.345,
        "power_limit_w": 700,
        "ecc_sbe_total": 4,
        "ecc_dbe_total": 0,
        "sm_clock_mhz": 1755,
        "memory_clock_mhz": 2619,
        "throttle_reasons": 0x44,
        "remapped_rows_total": 3,
        "encoder_util_percent": 0,
        "decoder_util_percent": 0,
        "bar1_used_mib": 2,
        "bar1_total_mib": 131072,
        "ecc_l1_corrected": 0,
        "ecc_l2_corrected": 0,
        "ecc_memory_corrected": 4,
        "health": 1.0,
        "xid_errors": 0,
    }
    assert all(s.metric_id == METRIC_IDS[s.name] and s.timestamp_ms == 1700000000500 for s in samples)


def test_throttle_reasons_fall_back_to_the_older_call(fake: FakeNvml, make_backend) -> None:
    fake.has_clock_event_reasons = False
    fake.gpus[1].clock_event_reasons = fake.nvmlClocksEventReasonSwPowerCap
    backend = make_backend(fake)
    assert _by(backend.metrics_snapshot(), fake.gpus[1].uuid)["throttle_reasons"] == 4
    assert "nvmlDeviceGetCurrentClocksThrottleReasons" in fake.calls


def test_mig_card_skips_utilisation_and_reports_per_instance_memory(fake: FakeNvml, make_backend) -> None:
    backend = make_backend(fake)
    samples = backend.metrics_snapshot()
    parent = fake.gpus[2]
    values = _by(samples, parent.uuid)
    assert "core_util_percent" not in values  # NVML: NotSupported with MIG on; never faked as 0
    assert values["memory_total_mib"] == 81920
    for mig in parent.migs:
        mig_samples = [s for s in samples if s.device == mig.uuid]
        assert {s.name: s.value for s in mig_samples} == {
            "memory_used_mib": mig.memory_used_mib,
            "memory_total_mib": mig.memory_total_mib,
        }
        assert all(s.labels == {PARENT_LABEL: parent.uuid} for s in mig_samples)


def test_lost_gpu_in_a_poll_turns_unhealthy(fake: FakeNvml, make_backend, wait_for) -> None:
    backend = make_backend(fake)
    fake.lose_gpu(1)
    samples = backend.metrics_snapshot()
    values = _by(samples, fake.gpus[1].uuid)
    assert values == {"health": 0.0, "xid_errors": 0}
    card = backend.inventory().by_minor(1)
    assert not card.healthy and "GPU is lost" in card.health_reason
    assert _by(samples, fake.gpus[0].uuid)["health"] == 1.0


def test_xid_count_reported(fake: FakeNvml, make_backend, wait_for) -> None:
    backend = make_backend(fake)
    assert fake.wait_registered([0])
    fake.inject_xid(0, 79)
    fake.inject_xid(0, 13)  # ignored: not counted as an error
    assert wait_for(lambda: not backend.inventory().by_minor(0).healthy)
    values = _by(backend.metrics_snapshot(), fake.gpus[0].uuid)
    assert values["xid_errors"] == 1 and values["health"] == 0.0


def test_stream_polls_until_cancelled(fake: FakeNvml, make_backend, monkeypatch) -> None:
    import nomad_plugin.nvml.backend as backend_module

    monkeypatch.setattr(backend_module, "STREAM_PERIOD_S", 0.01)
    backend = make_backend(fake)
    cancel = threading.Event()
    batches = []
    for batch in backend.metrics_stream(cancel):
        batches.append(batch)
        if len(batches) == 3:
            cancel.set()
    assert len(batches) == 3 and all(len(b) > 20 for b in batches)


def test_snapshot_before_nvml_works_is_unavailable(fake: FakeNvml, make_backend) -> None:
    backend = make_backend(fake, start=False)
    with pytest.raises(BackendUnavailable, match="NVML is not available"):
        backend.metrics_snapshot()
