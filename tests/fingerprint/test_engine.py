"""FingerprintEngine: streaming behaviour against a fake backend."""

from __future__ import annotations

import logging
import queue
import threading
from dataclasses import replace

import pytest

from nomad_plugin._proto.nomad import attribute_pb2, device_pb2
from nomad_plugin.config.model import CardRule, PluginConfig
from nomad_plugin.model.card import Inventory
from nomad_plugin.model.instances import Kind
from nomad_plugin.nomad import fingerprint
from nomad_plugin.nomad.fingerprint import FingerprintEngine
from nomad_plugin.util.threads import CancelEvent

from .helpers import FakeBackend, FakeClock, h800_node, with_health

WAIT = 2.0  # generous upper bound for "arrives"; the benchmark measures real latency
QUIET = 0.3  # how long we wait to conclude "nothing was sent"


class Stream:
    """Consume engine.responses() on its own thread, like the gRPC servicer does."""

    def __init__(self, engine: FingerprintEngine, cancel: threading.Event | None = None) -> None:
        self.cancel = cancel if cancel is not None else threading.Event()
        self.items: queue.Queue[device_pb2.FingerprintResponse] = queue.Queue()
        self.ended = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(engine,), daemon=True)
        self._thread.start()

    def _run(self, engine: FingerprintEngine) -> None:
        for response in engine.responses(self.cancel):
            self.items.put(response)
        self.ended.set()

    def next(self, timeout: float = WAIT) -> device_pb2.FingerprintResponse:
        return self.items.get(timeout=timeout)

    def assert_quiet(self) -> None:
        with pytest.raises(queue.Empty):
            self.items.get(timeout=QUIET)

    def close(self) -> None:
        self.cancel.set()
        assert self.ended.wait(WAIT), "generator did not end after cancel"


def current(engine: FingerprintEngine) -> device_pb2.FingerprintResponse:
    """What a stream opened now gets first: the engine's current response."""
    return next(engine.responses(threading.Event()))


def devices(resp: device_pb2.FingerprintResponse) -> dict[str, tuple[bool, str]]:
    return {d.ID: (d.healthy, d.health_description) for g in resp.device_group for d in g.devices}


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def make(backend, clock, tick=0.05, **cfg) -> FingerprintEngine:
    grants = cfg.pop("grants_view", None)
    kwargs = {"grants_view": grants} if grants else {}
    return FingerprintEngine(
        backend, PluginConfig(**cfg), clock=clock, wall_clock=lambda: 1_800_000_000.0, tick=tick, **kwargs
    )


def test_first_response_immediate_and_empty_before_backend_answers(clock):
    engine = make(FakeBackend(), clock)  # not even started
    s = Stream(engine)
    first = s.next(timeout=0.5)
    assert first == device_pb2.FingerprintResponse()
    s.assert_quiet()
    s.close()


def test_first_response_after_start_has_devices_and_no_resend_on_unchanged(clock):
    inv = h800_node(4)
    backend = FakeBackend(inv)
    engine = make(backend, clock)
    engine.start()
    try:
        s = Stream(engine)
        assert len(devices(s.next())) == 4
        backend.push(replace(inv, generation=7))  # same content, new snapshot
        engine.notify_grants_changed()
        engine.reevaluate()
        s.assert_quiet()
        s.close()
    finally:
        engine.stop()
    assert backend.listener_count == 0


def test_health_flip_and_hysteresis_recovery_by_checks(clock):
    inv = h800_node(2)
    u1 = inv.cards[1].uuid
    backend = FakeBackend(inv)
    engine = make(backend, clock, health_recovery_checks=2, health_recovery_delay=3600.0)
    engine.start()
    try:
        s = Stream(engine)
        assert devices(s.next())[u1] == (True, "")
        backend.push(with_health(inv, 1, False, "XID 79: fallen off the bus"))
        assert devices(s.next())[u1] == (False, "XID 79: fallen off the bus")
        backend.push(with_health(inv, 1, True))
        healthy, desc = devices(s.next())[u1]
        assert not healthy and "recovering from: XID 79" in desc and "1/2 checks" in desc
        backend.push(with_health(inv, 1, True))
        assert devices(s.next())[u1] == (True, "")
        assert devices(current(engine))[inv.cards[0].uuid] == (True, "")
        s.close()
    finally:
        engine.stop()


def test_hysteresis_recovery_by_delay_without_new_push(clock):
    inv = h800_node(1)
    u0 = inv.cards[0].uuid
    backend = FakeBackend(inv)
    engine = make(backend, clock, health_recovery_checks=100, health_recovery_delay=30.0)
    engine.start()
    try:
        s = Stream(engine)
        s.next()
        backend.push(with_health(inv, 0, False, "ecc"))
        assert not devices(s.next())[u0][0]
        backend.push(with_health(inv, 0, True))
        assert not devices(s.next())[u0][0]
        clock.advance(29)
        s.assert_quiet()
        clock.advance(2)  # the timer thread notices the expired delay by itself
        assert devices(s.next())[u0] == (True, "")
        s.close()
    finally:
        engine.stop()


def test_nothing_waits_for_the_safety_tick():
    """The plugin's tick is a 10 s safety net: a recovery delay and a grant change act on their own.

    A one-hour tick and the real clock: the recovery delay wakes the timer
    when it expires, and a grant change is acted on when notified.
    """
    assert fingerprint.SAFETY_TICK_S >= 10.0
    inv = h800_node(2)
    u0 = inv.cards[0].uuid
    grants: dict[str, frozenset[Kind]] = {}
    backend = FakeBackend(inv)
    engine = make(
        backend,
        fingerprint.time.monotonic,
        tick=3600.0,
        grants_view=lambda: dict(grants),
        health_recovery_checks=100,
        health_recovery_delay=0.3,
        cards=(CardRule("1", "tdm", shares=2),),
    )
    engine.start()
    try:
        s = Stream(engine)
        s.next()
        backend.push(with_health(inv, 0, False, "ecc"))
        assert not devices(s.next(timeout=30))[u0][0]
        backend.push(with_health(inv, 0, True))
        assert not devices(s.next(timeout=30))[u0][0]  # recovering: the delay runs
        assert devices(s.next(timeout=30))[u0] == (True, ""), "the expired delay must wake the timer"
        u1 = inv.cards[1].uuid
        grants[u1] = frozenset({Kind.WHOLE})
        engine.notify_grants_changed()
        marked = devices(s.next(timeout=30))
        assert marked[f"{u1}-share-0"] == (False, "card 1 held whole (another mode); unavailable as share"), marked
        s.close()
    finally:
        engine.stop()


def test_outage_marks_all_unhealthy_keeps_devices_and_recovers(clock):
    inv = h800_node(3)
    backend = FakeBackend(inv)
    engine = make(backend, clock)
    engine.start()
    try:
        s = Stream(engine)
        assert len(devices(s.next())) == 3
        backend.push(Inventory(reachable=False, unreachable_reason="socket missing", unreachable_since=1_700_000_000.0))
        down = devices(s.next())
        assert len(down) == 3  # last inventory kept: the node is not wiped
        assert {v for v in down.values()} == {(False, "xdm unreachable since 2023-11-14T22:13:20Z: socket missing")}
        assert len(engine.catalog().all_ids()) == 3
        # a second outage push with the same cause changes nothing
        backend.push(Inventory(reachable=False, unreachable_reason="socket missing", unreachable_since=1_700_000_000.0))
        s.assert_quiet()
        backend.push(inv)
        assert set(devices(s.next()).values()) == {(True, "")}
        s.close()
    finally:
        engine.stop()


def test_outage_without_timestamp_uses_first_seen_wall_clock(clock):
    backend = FakeBackend(h800_node(1))
    engine = make(backend, clock)
    engine.start()
    try:
        backend.push(Inventory(reachable=False))
        ((healthy, desc),) = devices(current(engine)).values()
        assert not healthy and desc == "xdm unreachable since 2027-01-15T08:00:00Z"
    finally:
        engine.stop()


def test_conflicts_follow_grants_view_on_notify(clock):
    inv = h800_node(2)
    u0 = inv.cards[0].uuid
    grants: dict[str, frozenset[Kind]] = {}
    lock = threading.Lock()

    def view():
        with lock:  # the reserve layer's lock; notify is called while holding it
            return dict(grants)

    backend = FakeBackend(inv)
    engine = make(backend, clock, grants_view=view, cards=(CardRule("0", "tdm", shares=2),))
    engine.start()
    try:
        s = Stream(engine)
        assert all(h for h, _ in devices(s.next()).values())
        with lock:
            grants[u0] = frozenset({Kind.WHOLE})
            engine.notify_grants_changed()  # must not deadlock with view()
        marked = devices(s.next())
        assert marked[f"{u0}-share-0"] == (False, "card 0 held whole (another mode); unavailable as share")
        assert marked[inv.cards[1].uuid] == (True, "")
        with lock:
            grants.clear()
            engine.notify_grants_changed()
        assert all(h for h, _ in devices(s.next()).values())
        s.close()
    finally:
        engine.stop()


def test_every_concurrent_stream_gets_every_update(clock):
    inv = h800_node(2)
    backend = FakeBackend(inv)
    engine = make(backend, clock)
    engine.start()
    try:
        streams = [Stream(engine) for _ in range(3)]
        for s in streams:
            assert len(devices(s.next())) == 2
        backend.push(with_health(inv, 0, False, "gone"))
        for s in streams:
            assert devices(s.next())[inv.cards[0].uuid] == (False, "gone")
        late = Stream(engine)  # a new stream starts from the current state
        assert devices(late.next())[inv.cards[0].uuid] == (False, "gone")
        for s in [*streams, late]:
            s.close()
    finally:
        engine.stop()


def test_failures_are_logged_and_the_last_good_response_kept(clock, caplog):
    inv = h800_node(2)
    broken = threading.Event()

    def view():
        if broken.is_set():
            raise RuntimeError("reserve layer exploded")
        return {}

    backend = FakeBackend(inv)
    engine = make(backend, clock, grants_view=view)
    engine.start()
    try:
        s = Stream(engine)
        good = s.next()
        broken.set()
        with caplog.at_level(logging.ERROR, logger=fingerprint.__name__):
            backend.push(with_health(inv, 0, False, "x"))  # must not raise into the backend
        assert "keeping the last good response" in caplog.text
        s.assert_quiet()
        assert current(engine) == good and not s.ended.is_set()
        broken.clear()
        backend.push(with_health(inv, 0, False, "x"))
        assert devices(s.next())[inv.cards[0].uuid] == (False, "x")
        s.close()
    finally:
        engine.stop()


def test_backend_inventory_raising_at_start_still_serves_empty(clock):
    class Failing(FakeBackend):
        def inventory(self):
            raise OSError("xdm socket missing")

    backend = Failing()
    engine = make(backend, clock)
    engine.start()
    try:
        s = Stream(engine)
        assert s.next() == device_pb2.FingerprintResponse()
        backend.push(h800_node(1))
        assert len(devices(s.next())) == 1
        s.close()
    finally:
        engine.stop()


def test_invalid_attribute_never_reaches_the_stream(clock, monkeypatch, caplog):
    real = fingerprint.build_response

    def with_bad_unit(catalog, verdicts):
        resp = real(catalog, verdicts)
        for g in resp.device_group:
            g.attributes["temperature"].CopyFrom(attribute_pb2.Attribute(int_val=40, unit="C"))
        return resp

    monkeypatch.setattr(fingerprint, "build_response", with_bad_unit)
    engine = make(FakeBackend(h800_node(1)), clock)
    with caplog.at_level(logging.ERROR, logger=fingerprint.__name__):
        engine.start()
    try:
        s = Stream(engine)
        (group,) = s.next().device_group
        assert "temperature" not in group.attributes and "memory" in group.attributes
        assert "unknown unit 'C'" in caplog.text
        s.close()
    finally:
        engine.stop()


def test_catalog_config_update_and_problems(clock, caplog):
    backend = FakeBackend(h800_node(2, model="NVIDIA L20", memory_mib=46068))
    engine = make(backend, clock, default_mode="mig")
    with caplog.at_level(logging.WARNING, logger=fingerprint.__name__):
        engine.start()
    try:
        assert [str(g.key) for g in engine.catalog().groups] == ["nvidia/gpu/NVIDIA L20"]
        said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("config: ")]
        assert len(said) == 2 and all("not MIG-capable" in m for m in said), said
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger=fingerprint.__name__):
            engine.update_config(PluginConfig(default_mode="tdm", tdm_shares=4))
        assert [str(g.key) for g in engine.catalog().groups] == [
            "nvidia/gpu-share/NVIDIA L20 card0",
            "nvidia/gpu-share/NVIDIA L20 card1",
        ]
        assert not [r for r in caplog.records if r.getMessage().startswith("config: ")]
    finally:
        engine.stop()


def test_cancel_ends_stream_and_stop_is_idempotent(clock):
    engine = make(FakeBackend(h800_node(1)), clock)
    engine.start()
    s = Stream(engine)
    s.next()
    s.close()
    engine.stop()
    engine.stop()


def test_a_cancel_event_wakes_the_stream_without_polling(clock, monkeypatch):
    """With the CancelEvent every gRPC stream gets, cancel is a callback, not a 4-per-second poll."""
    monkeypatch.setattr(fingerprint, "_CANCEL_POLL_S", 3600.0)  # a poll would now never notice
    engine = make(FakeBackend(h800_node(1)), clock)
    engine.start()
    try:
        s = Stream(engine, CancelEvent())
        s.next()
        s.close()
    finally:
        engine.stop()
