"""ListAndWatch pushes and the exporter (snapshot, stream, config, status)."""

from __future__ import annotations

import queue
import threading
import time

import grpc
import pytest

from nomad_plugin._proto.lingjun import api_outer_pb2 as pb
from nomad_plugin.model.metrics import GRANT_LABEL, METRIC_IDS, METRIC_NAMES


class Reader:
    """Reads a server stream on a thread; ``error`` holds the RpcError that ended it."""

    def __init__(self, stream) -> None:
        self.stream = stream
        self.items: queue.Queue = queue.Queue()
        self.error: grpc.RpcError | None = None
        self.done = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        try:
            for item in self.stream:
                self.items.put(item)
        except grpc.RpcError as exc:
            self.error = exc
        finally:
            self.done.set()

    def next(self, timeout: float = 3.0):
        return self.items.get(timeout=timeout)


def _health(resp: pb.ListAndWatchResponse) -> dict[int, str]:
    return {d.minor: d.health for d in resp.devices}


def test_many_subscribers_get_every_push(sim_client):
    sim, c = sim_client
    readers = [Reader(c.xdm.ListAndWatch(pb.ListAndWatchRequest())) for _ in range(5)]
    for r in readers:
        assert len(r.next().devices) == 8  # full list immediately
    deadline = time.monotonic() + 3
    while sim.subscriber_count() < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    sim.set_health(3, False, "XID 79")
    sim.set_health(3, True)
    sim.set_health(5, False, "ECC")
    for r in readers:
        pushes = [r.next() for _ in range(3)]
        assert [_health(p)[3] for p in pushes] == ["Unhealthy", "Healthy", "Healthy"]
        assert _health(pushes[2])[5] == "Unhealthy"
        assert pushes[2].devices[5].extenderResources["healthReason"] == "ECC"
        r.stream.cancel()


def test_remove_and_add_device_pushes_complete_list(sim_client):
    sim, c = sim_client
    r = Reader(c.xdm.ListAndWatch(pb.ListAndWatchRequest()))
    r.next()
    sim.remove_device(2)
    assert [d.minor for d in r.next().devices] == [0, 1, 3, 4, 5, 6, 7]
    sim.add_device(2)
    assert len(r.next().devices) == 8
    r.stream.cancel()


def test_initial_push_can_be_disabled(make_sim):
    sim, c = make_sim(initial_push=False)
    r = Reader(c.xdm.ListAndWatch(pb.ListAndWatchRequest()))
    with pytest.raises(queue.Empty):
        r.next(timeout=0.4)
    sim.set_health(0, False)
    assert _health(r.next())[0] == "Unhealthy"
    r.stream.cancel()


def test_periodic_repush_and_allocation_push(make_sim):
    sim, c = make_sim(repush_interval=0.1, push_on_allocation=True)
    r = Reader(c.xdm.ListAndWatch(pb.ListAndWatchRequest()))
    r.next()
    r.next(timeout=1.0)  # a re-push with no change
    r.stream.cancel()
    sim.options.repush_interval = 0.0
    r2 = Reader(c.xdm.ListAndWatch(pb.ListAndWatchRequest()))
    r2.next()
    c.allocate("a", {"minor": 0})
    assert len(r2.next(timeout=1.0).devices) == 8
    r2.stream.cancel()


def test_close_streams_ends_with_unavailable(sim_client):
    sim, c = sim_client
    law = Reader(c.xdm.ListAndWatch(pb.ListAndWatchRequest()))
    data = Reader(c.xdm.ExporterDataStream(pb.ExporterDataRequest()))
    law.next()
    data.next()
    sim.close_streams()
    assert law.done.wait(3) and data.done.wait(3)
    assert law.error.code() == grpc.StatusCode.UNAVAILABLE
    assert data.error.code() == grpc.StatusCode.UNAVAILABLE


def _by(samples, **labels):
    return [s for s in samples if all(s.labels.get(k) == v for k, v in labels.items())]


def test_metrics_catalogue_and_capacities(sim_client):
    _, c = sim_client
    data = c.xdm.ExporterGetDataList(pb.ExporterDataRequest(), timeout=5).dataList
    assert {d.metricId for d in data} == set(METRIC_NAMES)
    assert {d.device for d in data} == {str(m) for m in range(8)}
    for d in data:
        assert d.metricName == METRIC_NAMES[d.metricId] and d.timestamp > 0
    per_card = {(d.device, d.metricId): d.value for d in data}
    for m in range(8):
        used, total = (
            per_card[(str(m), METRIC_IDS["memory_used_mib"])],
            per_card[(str(m), METRIC_IDS["memory_total_mib"])],
        )
        assert 0 <= used <= total == 81559
        assert 0 <= per_card[(str(m), METRIC_IDS["core_util_percent"])] <= 100
        assert per_card[(str(m), METRIC_IDS["power_w"])] <= per_card[(str(m), METRIC_IDS["power_limit_w"])]
        assert per_card[(str(m), METRIC_IDS["health"])] == 1.0


def test_metrics_follow_grants(sim_client):
    _sim, c = sim_client
    assert c.allocate("share", {"minor": 1, "core": 30, "memory": 4}).status == 0
    assert c.allocate("mig", {"minor": 2, "slice": 2, "memory": 3}).status == 0
    assert c.allocate("whole", {"minor": 3}).status == 0
    for _ in range(5):  # values drift between collections but stay consistent
        data = c.xdm.ExporterGetDataList(pb.ExporterDataRequest(), timeout=5).dataList
        share = {d.metricId: d.value for d in data if d.labels.get(GRANT_LABEL) == "share"}
        assert share[METRIC_IDS["memory_used_mib"]] <= 4 * 1024
        assert share[METRIC_IDS["core_util_percent"]] <= 30
        mig = {d.metricId: d.value for d in data if d.labels.get(GRANT_LABEL) == "mig"}
        assert mig[METRIC_IDS["memory_used_mib"]] <= 3 * 1024
        assert not [d for d in data if d.labels.get(GRANT_LABEL) == "whole"]  # whole cards: card samples only
        card1 = {d.metricId: d.value for d in data if d.device == "1" and GRANT_LABEL not in d.labels}
        assert share[METRIC_IDS["memory_used_mib"]] <= card1[METRIC_IDS["memory_used_mib"]] <= 81559
        time.sleep(0.12)
    c.xdm.Release(pb.ReleaseRequest(id="share"), timeout=5)
    data = c.xdm.ExporterGetDataList(pb.ExporterDataRequest(), timeout=5).dataList
    assert not [d for d in data if d.labels.get(GRANT_LABEL) == "share"]


def test_metrics_unhealthy_card(sim_client):
    sim, c = sim_client
    sim.set_health(4, False, "XID 79")
    data = c.xdm.ExporterGetDataList(pb.ExporterDataRequest(devices=["4"], metricIds=[6, 7]), timeout=5).dataList
    values = {d.metricId: d.value for d in data}
    assert values == {6: 0.0, 7: 1.0}


def test_filters(sim_client):
    sim, c = sim_client
    uuid3 = sim.cards[3].uuid
    by_uuid = c.xdm.ExporterGetDataList(pb.ExporterDataRequest(devices=[uuid3], metricIds=[4]), timeout=5).dataList
    assert [(d.device, d.metricId) for d in by_uuid] == [("3", 4)]
    by_minor = c.xdm.ExporterGetDataList(pb.ExporterDataRequest(devices=["3", "5"]), timeout=5).dataList
    assert {d.device for d in by_minor} == {"3", "5"} and len(by_minor) == 32
    assert not c.xdm.ExporterGetDataList(pb.ExporterDataRequest(devices=["42"]), timeout=5).dataList
    assert not c.xdm.ExporterGetDataList(pb.ExporterDataRequest(metricIds=[99]), timeout=5).dataList


def test_unknown_filter_error_option(make_sim):
    _, c = make_sim(unknown_filter="error")
    resp = c.xdm.ExporterGetDataList(pb.ExporterDataRequest(metricIds=[99]), timeout=5)
    assert resp.status == grpc.StatusCode.NOT_FOUND.value[0] and not resp.dataList


def test_data_stream_pushes_each_interval(sim_client):
    _, c = sim_client
    r = Reader(c.xdm.ExporterDataStream(pb.ExporterDataRequest(devices=["0"], metricIds=[1, 4])))
    snaps = [r.next() for _ in range(4)]
    stamps = [s.dataList[0].timestamp for s in snaps]
    assert all(len(s.dataList) == 2 for s in snaps)
    assert stamps == sorted(stamps) and len(set(stamps[1:])) == 3
    r.stream.cancel()


def test_exporter_config_and_status(sim_client):
    sim, c = sim_client
    config = c.xdm.ExporterGetConfig(pb.ExporterGetConfigRequest(), timeout=5)
    assert config.collectIntervalMs == 100 and list(config.metricIds) == sorted(METRIC_NAMES)
    time.sleep(0.25)
    status = c.xdm.ExporterGetStatus(pb.ExporterGetStatusRequest(), timeout=5)
    assert status.running and status.state == "running" and status.version
    assert abs(status.lastCollectTimestamp / 1000 - time.time()) < 2
    sim.set_exporter_state("error")
    status = c.xdm.ExporterGetStatus(pb.ExporterGetStatusRequest(), timeout=5)
    assert not status.running and status.state == "error" and status.message
    sim.set_exporter_state("stopped")
    assert c.xdm.ExporterGetStatus(pb.ExporterGetStatusRequest(), timeout=5).state == "stopped"


def test_unlimited_memory_shares_fit_the_card(make_sim):
    _, c = make_sim("l20-8")
    assert c.allocate("a", {"minor": 0, "core": 40}).status == 0
    assert c.allocate("b", {"minor": 0, "core": 40}).status == 0
    for _ in range(3):
        data = c.xdm.ExporterGetDataList(pb.ExporterDataRequest(devices=["0"], metricIds=[2]), timeout=5).dataList
        shares = [d.value for d in data if GRANT_LABEL in d.labels]
        card = next(d.value for d in data if GRANT_LABEL not in d.labels)
        assert len(shares) == 2 and all(v <= 46068 / 2 for v in shares)
        assert sum(shares) <= card <= 46068
        time.sleep(0.11)
