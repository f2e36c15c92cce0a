"""XdmBackend against the real simulator (nomad_plugin.sim) on real Unix sockets."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nomad_plugin.config.model import PluginConfig
from nomad_plugin.model.card import Inventory
from nomad_plugin.model.grant import DeviceAsk, GrantRequest
from nomad_plugin.sim import Simulator
from nomad_plugin.util.threads import Backoff
from nomad_plugin.xdm.backend import XdmBackend
from tests.doubles.drifted_schemas import served_schema


def _config(sockdir: Path, **kw: object) -> PluginConfig:
    base = {
        "xdm_socket": str(sockdir / "dp2mgr.sock"),
        "config_socket": str(sockdir / "config-daemon.sock"),
        "xdm_call_timeout": 2.0,
        "inventory_resync_period": 0.3,
    }
    base.update(kw)
    return PluginConfig(**base)  # type: ignore[arg-type]


def _wait(pred: Callable[[], bool], timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.02)
    raise AssertionError("condition not reached in time")


@pytest.fixture
def sim(sockdir: Path) -> Iterator[object]:
    s = Simulator(socket_dir=sockdir, profile="h800-8")
    s.start()
    yield s
    s.stop()


@pytest.fixture
def backend(sockdir: Path, sim: object) -> Iterator[XdmBackend]:
    b = XdmBackend(_config(sockdir))
    yield b
    b.stop()


def test_inventory_node_facts_and_health_changes(backend: XdmBackend, sim: object) -> None:
    seen: list[Inventory] = []
    backend.subscribe(lambda inv: (_ for _ in ()).throw(RuntimeError("listener bug")))  # must not kill anything
    backend.subscribe(seen.append)
    backend.start()
    _wait(
        lambda: (
            backend.inventory().reachable
            and len(backend.inventory().cards) == 8
            and backend.inventory().node.get("runtime_kit") == "enabled"
            and bool(backend.inventory().node.get("driver_version"))
        )
    )
    inv = backend.inventory()
    assert inv.node["xpu_types"]
    card = inv.by_minor(2)
    assert card is not None and card.vendor == "nvidia" and card.xpu_type == "gpu" and card.healthy
    assert card.topology.levels, "topology parsed from extenderResources"
    sim.set_health(2, False, "XID 79")  # type: ignore[attr-defined]
    _wait(lambda: not backend.inventory().by_minor(2).healthy)  # type: ignore[union-attr]
    assert seen and seen[-1].generation == backend.inventory().generation


def test_allocate_release_through_backend(backend: XdmBackend, sim: object) -> None:
    backend.start()
    grant = backend.allocate(GrantRequest("a-1", (DeviceAsk(minor=0, core=50, memory_gib=4),)))
    assert grant.devices[0].minor == 0 and grant.devices[0].core == 50
    assert "a-1" in sim.grants()  # type: ignore[attr-defined]
    backend.release("a-1")
    backend.release("a-1")  # idempotent
    assert "a-1" not in sim.grants()  # type: ignore[attr-defined]
    assert backend.metrics_snapshot()


def test_metrics_stream_cancels_cleanly(backend: XdmBackend) -> None:
    cancel = threading.Event()
    batches = []
    for batch in backend.metrics_stream(cancel):
        batches.append(batch)
        cancel.set()
    assert batches and batches[0]


def test_resubscribe_after_restart_keeps_inventory(backend: XdmBackend, sim: object) -> None:
    errors: list[BaseException] = []
    threading.excepthook, old_hook = (lambda args: errors.append(args.exc_value)), threading.excepthook
    try:
        backend.start()
        _wait(lambda: backend.inventory().reachable and len(backend.inventory().cards) == 8)
        first = backend.resubscribes
        sim.restart(downtime=0.5)  # type: ignore[attr-defined]
        _wait(lambda: backend.resubscribes > first and backend.inventory().reachable, timeout=30)
        inv = backend.inventory()
        assert len(inv.cards) == 8
        assert backend.resubscribes - first <= 3, "resubscribed with backoff, not in a busy loop"
        sim.crash()  # type: ignore[attr-defined]
        _wait(lambda: not backend.inventory().reachable)
        inv = backend.inventory()
        assert len(inv.cards) == 8, "the last inventory is kept while XDM is down"
        assert inv.unreachable_reason.startswith(("connection-refused", "socket-missing", "unavailable"))
        assert inv.unreachable_since > 0
        sim.revive()  # type: ignore[attr-defined]
        _wait(lambda: backend.inventory().reachable, timeout=30)
    finally:
        threading.excepthook = old_hook
    assert errors == []


def test_reconnect_schedule_follows_backoff(sockdir: Path) -> None:
    """No XDM at all: the watcher waits 1, 2, 4, 8, 16, 30, 30 s (±20 % jitter) between tries."""
    delays: list[float] = []
    stop_after = 7

    def fake_sleep(delay: float) -> bool:
        delays.append(delay)
        return len(delays) >= stop_after

    backend = XdmBackend(
        _config(sockdir, inventory_resync_period=3600.0), backoff=Backoff(rng=random.Random(7)), sleep=fake_sleep
    )
    backend.start()
    _wait(lambda: len(delays) >= stop_after)
    backend.stop()
    for got, want in zip(delays, [1, 2, 4, 8, 16, 30, 30], strict=True):
        assert want * 0.8 <= got <= min(30.0, want * 1.2), delays
    inv = backend.inventory()
    assert not inv.reachable and inv.unreachable_reason.startswith("socket-missing")


def test_stop_is_clean_and_idempotent(sockdir: Path, sim: object) -> None:
    before = set(threading.enumerate())
    backend = XdmBackend(_config(sockdir))
    backend.start()
    _wait(lambda: backend.inventory().reachable)
    ours = [t for t in set(threading.enumerate()) - before if t.name in ("xdm-watch", "xdm-resync")]
    assert len(ours) == 2
    start = time.monotonic()
    backend.stop()
    backend.stop()
    assert time.monotonic() - start < 5
    # only this backend's threads: other tests may still be tearing theirs down
    assert not [t for t in ours if t.is_alive()]


def test_schema_mismatch_publishes_no_healthy_card_and_recovers_on_rebind(
    sockdir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Builtin numbers on a renumbered XDM: every card unhealthy with the mismatch, and the runtime_kit
    attribute "unknown" (read with the guessed numbers, enabled would say "disabled"); then XDM restarts
    serving reflection and (xdm_schema auto) the plugin re-binds and trusts it."""
    caplog.set_level(logging.INFO, logger="nomad_plugin.xdm.backend")
    sim = Simulator(socket_dir=sockdir, profile="h800-8", schema=served_schema("renumbered"))
    sim.start()
    backend = XdmBackend(_config(sockdir))
    try:
        backend.start()

        def loud() -> bool:
            inv = backend.inventory()
            return bool(inv.cards) and all(
                not c.healthy and c.health_reason.startswith("XDM schema mismatch: ") for c in inv.cards
            )

        _wait(loud)
        _wait(
            lambda: "does not fit the built-in" in caplog.text and backend.inventory().node["runtime_kit"] == "unknown"
        )
        with pytest.raises(Exception, match="XDM schema mismatch"):
            backend.allocate(GrantRequest("g-1", (DeviceAsk(minor=1),)))
        assert sim.grants() == {}
        sim.restart(0.3, reflection=True)

        def trusted() -> bool:
            inv = backend.inventory()
            return (
                len(inv.cards) == 8
                and all(c.healthy for c in inv.cards)
                and inv.reachable
                and inv.node["runtime_kit"] == "enabled"
            )

        _wait(trusted, timeout=30)
        assert {c.uuid for c in backend.inventory().cards} == {c.uuid for c in sim.cards}
        assert backend.client.last_binding is not None and backend.client.last_binding.source == "reflection"
    finally:
        backend.stop()
        sim.stop()


def test_reflection_mode_without_reflection_says_why(sockdir: Path, sim: object) -> None:
    backend = XdmBackend(_config(sockdir, xdm_schema="reflection"))
    try:
        backend.start()
        _wait(lambda: "does not serve gRPC server reflection" in backend.inventory().unreachable_reason)
        assert not backend.inventory().reachable and not backend.inventory().cards
    finally:
        backend.stop()


def test_a_restart_that_no_call_saw_is_found_by_its_new_socket_and_rebinds(sockdir: Path) -> None:
    """XDM restarts serving another schema while no call or stream is under way (the plugin's watch
    stream between resubscribes, say). gRPC would redial the new daemon on the next call as if
    nothing happened, with the old binding; the new socket file gives the restart away."""
    from nomad_plugin.xdm.client import XdmClient

    sim = Simulator(socket_dir=sockdir, profile="h800-8", schema=served_schema("renumbered"), reflection=True)
    sim.start()
    client = XdmClient(_config(sockdir))
    try:
        before = client.list_gpu_info()
        client.list_gpu_info()
        assert client.binds == 1, "the same daemon: no re-bind per call"
        assert client.last_binding is not None
        digest = client.last_binding.digest
        sim.restart(0.3, schema=served_schema("foreign"), reflection=True)
        after = client.list_gpu_info()
        assert client.binds == 2 and client.last_binding.digest != digest
        assert sorted((g.minor, g.uuid) for g in after) == sorted((g.minor, g.uuid) for g in before)
        client.list_gpu_info()
        assert client.binds == 2
    finally:
        client.close()
        sim.stop()
