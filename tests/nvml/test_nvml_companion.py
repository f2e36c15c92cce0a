"""Enrichment of XDM's cards by the NVML companion, through its public calls."""

from __future__ import annotations

import logging

import pytest

from nomad_plugin.model.card import Card, Inventory
from nomad_plugin.model.errors import BackendUnavailable
from nomad_plugin.nvml.companion import CardFacts, NvmlCompanion, apply_facts, read_facts
from nomad_plugin.util.threads import Backoff
from tests.doubles.fake_pynvml import NVML_ERROR_DRIVER_NOT_LOADED, FakeNvml, write_sysfs_numa


def _companion(fake: FakeNvml, sysfs_root: str = "/nonexistent", **kw) -> NvmlCompanion:
    return NvmlCompanion(loader=lambda: fake, sysfs_root=sysfs_root, **kw)


def _xdm_card(minor: int, uuid: str, **kw) -> Card:
    kw.setdefault("vendor", "nvidia")
    return Card(minor=minor, uuid=uuid, model="H100", xpu_type="gpu", memory_mib=81559, **kw)


def test_fills_pci_numa_and_clocks_matching_by_uuid(fake: FakeNvml, tmp_path) -> None:
    write_sysfs_numa(tmp_path, "0000:39:00.0", 1)
    inv = Inventory(cards=(_xdm_card(7, fake.gpus[1].uuid),), node={"driver_version": "550.54.15"}, generation=4)
    out = _companion(fake, str(tmp_path)).enrich(inv)
    card = out.cards[0]
    assert (card.minor, card.pci_bus_id, card.numa_node) == (7, "0000:39:00.0", 1)
    assert card.extra["cores_clock"] == "1980" and card.extra["memory_clock"] == "3201"
    assert card.extra["power_limit"] == "700" and card.extra["power"] == "72"  # limit and draw, W
    assert card.extra["pci_bandwidth"] == str(3072 * 16)  # nomad-device-nvidia's gen5 lane rate x16
    assert card.extra["bar1"] == "131072"
    assert (card.extra["display_state"], card.extra["persistence_mode"]) == (
        "0",
        "1",
    )  # the enum number, as the official
    assert out.generation == 4 and out.node == inv.node


def test_falls_back_to_minor_when_uuid_unknown(fake: FakeNvml) -> None:
    inv = Inventory(cards=(_xdm_card(2, "xdm-serial-123"), _xdm_card(2, "ppu-1", vendor="alibaba")))
    out = _companion(fake).enrich(inv)
    assert out.cards[0].pci_bus_id == "0000:87:00.0" and out.cards[0].numa_node == 1
    assert out.cards[1] == inv.cards[1]  # another vendor's minor says nothing about NVML's cards


def test_xdm_values_win_and_unmatched_cards_untouched() -> None:
    facts = [CardFacts(uuid="GPU-a", minor=0, pci_bus_id="0000:18:00.0", numa_node=0, extra={"power_limit_w": "700"})]
    xdm = _xdm_card(0, "GPU-a", pci_bus_id="0000:1a:00.0", numa_node=1, extra={"power_limit_w": "650"})
    other = _xdm_card(4, "GPU-z")
    inv = Inventory(cards=(xdm, other))
    out = apply_facts(inv, facts)
    assert out.cards[0].pci_bus_id == "0000:1a:00.0" and out.cards[0].numa_node == 1
    assert out.cards[0].extra == {"power_limit_w": "650"}
    assert out.cards[1] is other
    assert apply_facts(Inventory(cards=(other,)), facts) == Inventory(cards=(other,))


def test_read_facts_skips_a_lost_card(fake: FakeNvml) -> None:
    fake.nvmlInit()
    fake.lose_gpu(0)
    facts = read_facts(fake, "/nonexistent")
    assert [f.uuid for f in facts] == [fake.gpus[1].uuid, fake.gpus[2].uuid]


def test_one_session_backs_off_after_a_failure_and_recovers(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeNvml()
    fake.init_error = NVML_ERROR_DRIVER_NOT_LOADED
    caplog.set_level(logging.WARNING)
    backoff = Backoff(initial=60.0, jitter=0.0)
    companion = _companion(fake, backoff=backoff)
    inv = Inventory(cards=(_xdm_card(0, fake.gpus[0].uuid),))
    assert companion.enrich(inv) is inv
    assert "Driver Not Loaded" in companion.last_error
    fake.init_error = None
    assert companion.enrich(inv) is inv and fake.init_calls == 1, "retried within the backoff"
    with pytest.raises(BackendUnavailable, match="Driver Not Loaded"):
        companion.metrics_snapshot()  # the metrics fallback shares the session and its backoff
    assert [r.message for r in caplog.records].count(
        "NVML on this XDM node (enrichment, extra stats) unavailable: Driver Not Loaded (NVML error 9)"
    ) == 1, "a failure is logged once"
    backoff.initial = 0.0
    companion._retry_at = 0.0  # the backoff has run out
    out = companion.enrich(inv)
    assert out.cards[0].pci_bus_id == "0000:18:00.0" and companion.last_error == ""
    companion.enrich(inv)
    companion.metrics_snapshot()
    assert fake.init_count == 1 and fake.init_calls == 2  # one session, reused by enrichment and the fallback
    companion.stop()
    assert fake.init_count == 0


def test_metrics_fallback_reads_every_card_and_its_mig_instances(fake: FakeNvml) -> None:
    companion = _companion(fake)
    samples = companion.metrics_snapshot()
    by_card = {(s.device, s.name): s.value for s in samples}
    assert by_card[(fake.gpus[0].uuid, "memory_total_mib")] == 81559
    assert (fake.gpus[0].uuid, "temperature_c") in by_card and (fake.gpus[0].uuid, "encoder_util_percent") in by_card
    mig = fake.gpus[2].migs[0]
    assert by_card[(mig.uuid, "memory_total_mib")] == mig.memory_total_mib
    assert not any(s.name == "health" for s in samples), "health on an XDM node is XDM's"
    fake.driver_gone = NVML_ERROR_DRIVER_NOT_LOADED
    with pytest.raises(BackendUnavailable, match="Driver Not Loaded"):
        companion.metrics_snapshot()
    companion.stop()


def test_without_bindings_the_probe_says_why() -> None:
    from nomad_plugin.nvml import lib

    def missing():
        raise lib.NvmlMissing("the NVML backend needs the Python package nvidia-ml-py")

    companion = NvmlCompanion(loader=missing)
    assert "nvidia-ml-py" in companion.open()
    inv = Inventory(cards=(_xdm_card(0, "GPU-a"),))
    assert companion.enrich(inv) is inv and "nvidia-ml-py" in companion.last_error


def test_without_an_xdm_exporter_the_stats_come_from_the_companion(fake: FakeNvml) -> None:
    """The metrics feed's last resort on an XDM node: both exporter calls answer "unimplemented"."""
    from nomad_plugin.stats.feed import MetricsFeed
    from tests.doubles.stats_fakes import FakeBackend
    from tests.waiting import wait_until

    xdm = FakeBackend()
    xdm.stream_mode = xdm.snapshot_mode = "unimplemented"
    companion = _companion(fake)
    backoff = Backoff(initial=0.05, cap=0.2, jitter=0.0)
    feed = MetricsFeed(xdm, 0.02, backoff=backoff, nvml_source=companion.metrics_snapshot)  # type: ignore[arg-type]
    feed.start()
    try:
        wait_until(lambda: feed.source == "nvml", "the feed to read NVML")
        wait_until(lambda: feed.cache.card(fake.gpus[0].uuid, "temperature_c") is not None, "NVML's temperature")
    finally:
        feed.stop()
        companion.stop()
    assert fake.init_count == 0
