"""The stats path against the real XDM simulator over real gRPC on Unix sockets.

The feed reads the simulator's ExporterDataStream through the XDM client
(and through ``XdmBackend`` once that lands), survives an exporter restart,
and the layout shows the simulator's numbers as fresh values.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from nomad_plugin import sim as sim_module
from nomad_plugin.config.model import PluginConfig
from nomad_plugin.model.card import Card, Inventory
from nomad_plugin.model.instances import Catalog, GroupKey, Instance, InstanceGroup, Kind
from nomad_plugin.model.metrics import MetricSample
from nomad_plugin.stats.engine import build_stats, no_grants
from nomad_plugin.stats.feed import MetricsFeed
from nomad_plugin.util.threads import Backoff
from nomad_plugin.xdm import backend as backend_module
from nomad_plugin.xdm import client as client_module
from tests.doubles.stats_fakes import count_updates


class ClientMetrics:
    """The metrics half of the Backend contract, straight on ``XdmClient``."""

    name = "xdm-client"

    def __init__(self, config: PluginConfig) -> None:
        self.client = client_module.XdmClient(config)

    def metrics_snapshot(self) -> Sequence[MetricSample]:
        return list(self.client.exporter_get_data_list())

    def metrics_stream(self, cancel: threading.Event) -> Iterator[Sequence[MetricSample]]:
        sub = self.client.exporter_data_stream()
        watcher = threading.Thread(target=lambda: (cancel.wait(), sub.cancel()), daemon=True)
        watcher.start()
        try:
            yield from sub
        finally:
            sub.cancel()


def wait_until(cond: Callable[[], bool], timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


@pytest.fixture
def sim() -> Iterator[object]:
    folder = Path(tempfile.mkdtemp(prefix="st", dir="/tmp"))
    simulator = sim_module.Simulator(folder, "h800-8", collect_interval_ms=50)
    simulator.start()
    yield simulator
    simulator.stop()
    shutil.rmtree(folder, ignore_errors=True)


def whole_catalog(cards: Sequence[Card]) -> Catalog:
    insts = tuple(Instance(c.uuid, Kind.WHOLE, c.uuid, c.minor) for c in cards)
    return Catalog(groups=(InstanceGroup(GroupKey("nvidia", "gpu", cards[0].model), insts),))


def config_for(sim: object) -> PluginConfig:
    return PluginConfig(xdm_socket=str(sim.dp2mgr_path), config_socket=str(sim.config_path))  # type: ignore[attr-defined]


def test_feed_from_simulator_exporter_survives_restart(sim) -> None:  # type: ignore[no-untyped-def]
    backend = ClientMetrics(config_for(sim))
    feed = MetricsFeed(backend, 0.05, backoff=Backoff(initial=0.1, cap=0.5, jitter=0.0))  # type: ignore[arg-type]
    update_count = count_updates(feed.cache)
    feed.start()
    try:
        cards = [
            Card(minor=c.minor, uuid=c.uuid, model=c.model, vendor="nvidia", xpu_type="gpu", memory_mib=c.memory_mib)
            for c in sim.cards
        ]
        inventory = Inventory(cards=tuple(cards))
        catalog = whole_catalog(cards)
        assert wait_until(lambda: feed.source == "stream" and update_count() >= 3)

        response = build_stats(catalog, inventory, feed.cache, no_grants, time.monotonic(), 0.05)
        assert sorted(response.groups[0].instance_stats) == sorted(catalog.all_ids())
        for card in cards:
            attrs = response.groups[0].instance_stats[card.uuid].stats.attributes
            mem = attrs["Memory state"]
            assert mem.HasField("int_numerator_val"), mem
            assert 0 <= mem.int_numerator_val.value <= mem.int_denominator_val.value
            assert mem.int_denominator_val.value == card.memory_mib
            assert attrs["Temperature"].HasField("int_numerator_val")
            assert "stale" not in mem.desc

        subscriptions = feed.stream_subscriptions
        sim.restart(downtime=0.3)  # the stream ends UNAVAILABLE, the sockets vanish for 0.3 s
        assert wait_until(lambda: feed.stream_subscriptions > subscriptions and feed.source == "stream")
        updates = update_count()
        assert wait_until(lambda: update_count() >= updates + 3)
    finally:
        feed.stop()
        backend.client.close()
    assert not feed.running


def test_feed_through_xdm_backend(sim) -> None:  # type: ignore[no-untyped-def]
    backend = backend_module.XdmBackend(config_for(sim))
    backend.start()
    feed = MetricsFeed(backend, 0.05, backoff=Backoff(initial=0.1, cap=0.5, jitter=0.0))
    update_count = count_updates(feed.cache)
    feed.start()
    try:
        assert wait_until(lambda: update_count() >= 3 and feed.source in ("stream", "poll"))
        assert wait_until(lambda: len(backend.inventory().cards) == len(sim.cards))
        inventory = backend.inventory()
        catalog = whole_catalog(inventory.cards)
        response = build_stats(catalog, inventory, feed.cache, no_grants, time.monotonic(), 0.05)
        for card in inventory.cards:
            mem = response.groups[0].instance_stats[card.uuid].stats.attributes["Memory state"]
            assert mem.HasField("int_numerator_val"), mem
    finally:
        feed.stop()
        backend.stop()
