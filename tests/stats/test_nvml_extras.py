"""NVML fills the official stats XDM lacks (encoder, decoder, BAR1, ECC by location) on XDM nodes."""

from __future__ import annotations

import logging
import time

import pytest

from nomad_plugin.nvml.companion import EXTRAS_SOURCE, NvmlCompanion
from nomad_plugin.nvml.lib import NvmlMissing
from nomad_plugin.stats.feed import MetricsCache
from nomad_plugin.util.threads import Backoff
from tests.doubles.fake_pynvml import FakeNvml, h100


def wait_for(predicate, what: str, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out awaiting {what}"
        time.sleep(0.02)


def test_readings_land_in_the_cache_by_card_uuid() -> None:
    fake = FakeNvml([h100(0), h100(1)])
    fake.gpus[1].encoder_util, fake.gpus[1].decoder_util, fake.gpus[1].ecc_l2_corrected = 12, 34, 5
    cache = MetricsCache()
    companion = NvmlCompanion(loader=lambda: fake, interval=0.05)
    companion.start_extras(lambda samples: cache.update(samples, EXTRAS_SOURCE))
    try:
        wait_for(lambda: "encoder_util_percent" in cache.card_readings([fake.gpus[1].uuid]), "NVML extras")
    finally:
        companion.stop()
    readings = cache.card_readings([fake.gpus[1].uuid])
    assert readings["encoder_util_percent"].value == 12 and readings["decoder_util_percent"].value == 34
    assert readings["bar1_total_mib"].value == 131072 and readings["ecc_l2_corrected"].value == 5
    assert "core_util_percent" not in readings  # only what XDM lacks; XDM's own readings stay XDM's
    assert fake.init_count == 0  # NVML shut down on stop


def test_missing_nvml_backs_off_logs_once_and_stops(caplog: pytest.LogCaptureFixture) -> None:
    attempts: list[float] = []
    fed: list[object] = []

    def missing() -> FakeNvml:
        attempts.append(time.monotonic())
        raise NvmlMissing("the NVML backend needs the Python package nvidia-ml-py")

    caplog.set_level(logging.WARNING)
    companion = NvmlCompanion(loader=missing, interval=0.01, backoff=Backoff(0.01, cap=0.02, jitter=0))
    companion.start_extras(fed.append)
    try:
        wait_for(lambda: len(attempts) >= 3, "three load attempts")
    finally:
        companion.stop()
    warnings = [r for r in caplog.records if "NVML on this XDM node" in r.message]
    assert len(warnings) == 1 and "nvidia-ml-py" in warnings[0].message
    assert fed == []
