"""The rows of docs/reliability.md's failure table that no other test already covers.

Each test drives real components (simulator or real-gRPC fake XDM, real
journal files, the Nomad API double) through one failure and checks what the
plugin does, what the operator sees and what recovers by itself.
"""

from __future__ import annotations

import dataclasses
import errno
import math
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

import pytest

from nomad_plugin.config.model import PluginConfig
from nomad_plugin.journal import Journal
from nomad_plugin.journal import store as journal_store
from nomad_plugin.model.errors import BackendUnavailable, PluginError
from nomad_plugin.model.instances import Catalog, GroupKey, Instance, InstanceGroup, Kind
from nomad_plugin.nomad.reserve import JournalWriteFailed, Reserver
from nomad_plugin.sim import Simulator
from nomad_plugin.xdm.client import XdmClient
from tests.this_thread import in_this_thread
from tests.waiting import wait_until

GROUP = GroupKey("nvidia", "gpu", "H800")


@pytest.fixture
def world(tmp_path):
    d = Path(tempfile.mkdtemp(prefix="hfs", dir="/tmp"))
    sim = Simulator(d / "s", profile="h800-8", state_file=d / "state.json")
    config = PluginConfig(
        backend="xdm",
        xdm_socket=str(sim.dp2mgr_path),
        config_socket=str(sim.config_path),
        xdm_call_timeout=1.0,
        xdm_allocate_timeout=1.0,
        data_dir=str(tmp_path / "data"),
        reconcile=False,
        nvml_enrich=False,
    )
    yield sim, config
    sim.stop()
    shutil.rmtree(d, ignore_errors=True)


def _reserver(sim: Simulator, config: PluginConfig) -> tuple[Reserver, XdmClient, list[str]]:
    cards = sim.cards[:2]
    catalog = Catalog((InstanceGroup(GROUP, tuple(Instance(c.uuid, Kind.WHOLE, c.uuid, c.minor) for c in cards)),))
    client = XdmClient(config)
    reserver = Reserver(client, lambda: catalog, Journal(config.data_dir), config, path_exists=lambda p: True)
    return reserver, client, [c.uuid for c in cards]


# --- XDM down at start ----------------------------------------------------------------------------
@pytest.mark.timeout(60)
def test_xdm_down_at_start_then_comes_up(world):
    from nomad_plugin.app import PluginApp

    sim, config = world
    app = PluginApp()
    app.set_config(config)
    cancel = threading.Event()
    try:
        stream = app.fingerprints(cancel)
        first = next(stream)  # the first fingerprint leaves at once, XDM or not
        assert not any(g.devices for g in first.device_group)
        with pytest.raises(PluginError) as err:  # Reserve while XDM is down: a clear UNAVAILABLE-class error
            app.reserve(["GPU-none"])
        assert str(err.value)
        sim.start()  # XDM comes up: the devices appear by themselves
        deadline = time.monotonic() + 30
        fp = first
        while not any(g.devices for g in fp.device_group):
            assert time.monotonic() < deadline, "devices never appeared after XDM came up"
            fp = next(stream)
        device = fp.device_group[0].devices[0].ID
        assert app.reserve([device]).container_res.envs["LINGJUN_GRANT_ID"] in sim.grants()
    finally:
        cancel.set()
        app.close()


# --- XDM gone in the middle of a Reserve -----------------------------------------------------------
@pytest.mark.timeout(60)
def test_xdm_crash_mid_reserve_leaves_no_grant(world):
    sim, config = world
    sim.start()
    # Allocate's deadline stays far above the wait for the crash below, so the crash ends the call; the
    # window in which XDM could still commit a call of unknown outcome (two deadlines) is waited out.
    reserver, client, ids = _reserver(sim, dataclasses.replace(config, xdm_allocate_timeout=5.0))
    sim.set_latency("Allocate", math.inf)  # XDM holds the Allocate until it dies or the client gives up
    failed: list[BaseException] = []

    def reserve() -> None:
        try:
            reserver.reserve([ids[0]])
        except BaseException as exc:
            failed.append(exc)

    worker = threading.Thread(target=reserve, daemon=True)
    worker.start()
    wait_until(lambda: sim.calls().get("Allocate", 0) >= 1, "the Allocate to reach XDM")
    sim.crash()  # XDM dies while the Allocate is in flight
    wait_until(lambda: not worker.is_alive(), "Reserve to return after XDM crashed")
    assert len(failed) == 1 and isinstance(failed[0], BackendUnavailable), failed
    assert "XDM" in str(failed[0]) and "timed out" not in str(failed[0]), failed[0]
    assert all(e.state.value == "releasing" for e in reserver.entries()), reserver.entries()
    sim.set_latency("Allocate", 0)
    sim.revive()
    assert sim.grants() == {}  # the held Allocate never granted anything, even after the restart
    # what the reconciler thread does every round, until the journal holds nothing
    wait_until(lambda: reserver.retry_pending() >= 0 and not reserver.entries(), "the intent to be released", poll=0.2)
    assert sim.grants() == {}
    client.close()


@pytest.mark.timeout(60)
def test_xdm_allocate_timeout_is_undone(world):
    sim, config = world
    sim.start()
    reserver, client, ids = _reserver(sim, config)
    sim.set_latency("Allocate", 3.0)  # longer than xdm_allocate_timeout = 1 s
    with pytest.raises(BackendUnavailable, match="timed out"):  # not the simulator's late answer
        reserver.reserve([ids[0]])
    sim.set_latency("Allocate", 0)
    wait_until(lambda: not sim.grants(), "the simulator to drop the cancelled Allocate")
    # Kept as releasing until XDM can no longer commit it late; then a retry drops it.
    (entry,) = reserver.entries()
    assert entry.state.value == "releasing" and entry.settle_until > time.time()
    reserver.journal.put(dataclasses.replace(entry, settle_until=0.0))  # the window has closed
    assert reserver.retry_pending() == 1 and reserver.entries() == []
    client.close()


@pytest.mark.timeout(60)
def test_allocate_completed_after_deadline_is_released_eventually(tmp_path):
    from tests.doubles.fake_xdm import FakeXdm, short_socket_dir

    sockets = short_socket_dir()
    fake = FakeXdm(str(sockets / "dp2mgr.sock"), str(sockets / "config-daemon.sock")).start()
    # The fake, unlike the simulator, commits even after the client gave up: here 1.5 deadlines after the
    # call began, inside the two deadlines an intent is kept for.
    fake.latency["Allocate"] = 1.5
    config = PluginConfig(
        xdm_socket=fake.socket_path,
        config_socket=str(sockets / "config-daemon.sock"),
        xdm_service="xdm.XpuDeviceManagerService",
        xdm_call_timeout=0.5,
        xdm_allocate_timeout=1.0,
        data_dir=str(tmp_path / "data"),
    )
    catalog = Catalog((InstanceGroup(GROUP, (Instance("GPU-0", Kind.WHOLE, "GPU-0", 0),)),))
    client = XdmClient(config)
    reserver = Reserver(client, lambda: catalog, Journal(config.data_dir), config, path_exists=lambda p: True)
    try:
        with pytest.raises(BackendUnavailable):
            reserver.reserve(["GPU-0"])
        # The timed-out grant stays journalled as releasing for the late-grant window.
        (entry,) = reserver.entries()
        assert entry.state.value == "releasing" and entry.settle_until > time.time()
        # XDM commits the grant late (after its 1.5 s latency): wait for that, not a fixed time.
        wait_until(lambda: entry.grant_id in _grants(fake), f"the fake XDM to commit grant {entry.grant_id} late")
        reserver.retry_pending()
        if time.time() < entry.settle_until:  # on a slow box the window may have closed meanwhile
            assert [e.grant_id for e in reserver.entries()] == [entry.grant_id], "kept until the window closes"
        wait_until(lambda: reserver.retry_pending() >= 0 and not reserver.entries(), "a retry after the window")
        assert fake.grants == {}, f"grant {list(fake.grants)} leaked at XDM"
    finally:
        client.close()
        fake.stop()
        shutil.rmtree(sockets, ignore_errors=True)


def _grants(fake) -> dict:
    with fake.lock:
        return dict(fake.grants)


# --- disk full -------------------------------------------------------------------------------------
def _enospc_after(n_ok: int):
    real_write = os.write
    calls = {"n": 0}

    def write(fd: int, data: bytes) -> int:
        calls["n"] += 1
        if calls["n"] > n_ok:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    return in_this_thread(write, real_write)


@pytest.mark.timeout(60)
def test_disk_full_before_allocate_refuses_without_granting(world, monkeypatch):
    sim, config = world
    sim.start()
    reserver, client, ids = _reserver(sim, config)
    monkeypatch.setattr(journal_store.os, "write", _enospc_after(0))
    with pytest.raises(JournalWriteFailed, match="No space left on device; no grant was made") as err:
        reserver.reserve([ids[0]])
    assert isinstance(err.value.__cause__, OSError) and err.value.__cause__.errno == errno.ENOSPC
    assert sim.grants() == {}, "a grant was made although it could not be journalled"
    monkeypatch.undo()
    # Space is back: the next Reserve works, and the journal on disk is intact.
    gid = reserver.reserve([ids[1]]).container_res.envs["LINGJUN_GRANT_ID"]
    assert set(sim.grants()) == {gid} and {e.grant_id for e in Journal(config.data_dir).entries()} == {gid}
    client.close()


@pytest.mark.timeout(60)
def test_disk_full_after_allocate_releases_the_grant(world, monkeypatch):
    sim, config = world
    sim.start()
    reserver, client, ids = _reserver(sim, config)
    monkeypatch.setattr(journal_store.os, "write", _enospc_after(1))  # the intent lands, "granted" does not
    with pytest.raises(OSError):
        reserver.reserve([ids[0]])
    assert sim.grants() == {}, "the grant stayed at XDM although Reserve failed"
    monkeypatch.undo()
    # Left on disk: at most the intent entry. Startup recovery releases it, and keeps it (releasing) until
    # XDM could no longer commit it: the restarted plugin cannot know that XDM answered the Allocate.
    fresh = Reserver(client, reserver.catalog_source, Journal(config.data_dir), config, path_exists=lambda p: True)
    fresh.recover()
    assert sim.grants() == {}
    assert all(e.state.value == "releasing" and e.settle_until > time.time() for e in fresh.entries())
    wait_until(lambda: fresh.retry_pending() >= 0 and not fresh.entries(), "the window to close and a retry to drop it")
    assert sim.grants() == {}
    client.close()


# --- clock jumps -------------------------------------------------------------------------------------
def _on_the_monotonic_clock(stamp: float, offset: float = 0.0) -> bool:
    """``stamp`` (minus ``offset``) was read from time.monotonic just now, not from the wall clock.

    The two clocks differ by the boot time (decades of seconds apart), so a
    timer recorded on the wrong one is off by far more than this slack.
    """
    return abs(stamp - offset - time.monotonic()) < 60 and abs(stamp - offset - time.time()) > 3600


def test_grace_and_health_timers_use_the_monotonic_clock(tmp_path):
    """Built as app.py builds them (no clock given), the timers they keep are monotonic times."""
    from nomad_plugin.nomad.fingerprint import FingerprintEngine, HealthTracker
    from nomad_plugin.reconcile.nomad_api import AllocPage, AllocView
    from nomad_plugin.reconcile.reconciler import Reconciler
    from tests.doubles.reserve_fakes import FakeBackend, card_uuid, catalog, whole_group
    from tests.fingerprint.helpers import FakeBackend as FingerprintBackend

    assert time.time() - time.monotonic() > 7200, "this check needs a box booted after 1970 + 2 h"
    fault, ok = {"c": (False, "XID 79")}, {"c": (True, "")}
    tracker = HealthTracker(recovery_checks=100, recovery_delay=30.0)
    tracker.observe(fault)
    tracker.observe(ok)  # recovering: eligible 30 s after this, on the tracker's clock
    assert _on_the_monotonic_clock(tracker.next_deadline(), 30.0), tracker.next_deadline()

    engine = FingerprintEngine(FingerprintBackend(), PluginConfig(health_recovery_delay=30.0))
    engine._tracker.observe(fault)  # the engine hands its clock to its tracker
    engine._tracker.observe(ok)
    assert _on_the_monotonic_clock(engine._tracker.next_deadline(), 30.0)

    cat = catalog(whole_group(2))
    reserver = Reserver(FakeBackend(), lambda: cat, Journal(tmp_path / "d"), PluginConfig(), path_exists=lambda p: True)
    gid = reserver.reserve([card_uuid(0)]).container_res.envs["LINGJUN_GRANT_ID"]
    rec = Reconciler(reserver, None, lambda: cat, grace=30.0)
    rec.observe(AllocPage(allocs=(AllocView(id="a1", client_status="complete", device_ids=frozenset()),), index=1))
    assert _on_the_monotonic_clock(rec.timers.orphaned_since[gid]), rec.timers


@pytest.mark.timeout(60)
def test_wall_clock_jump_does_not_release_early(tmp_path, monkeypatch):
    from nomad_plugin.reconcile.nomad_api import NomadApiSettings, NomadClient
    from nomad_plugin.reconcile.reconciler import Reconciler
    from tests.doubles.nomad_api import NomadApiDouble
    from tests.doubles.reserve_fakes import FakeBackend, card_uuid, catalog, whole_group

    cat = catalog(whole_group(2))
    backend = FakeBackend()
    reserver = Reserver(backend, lambda: cat, Journal(tmp_path / "d"), PluginConfig(), path_exists=lambda p: True)
    ids = [card_uuid(0)]
    gid = reserver.reserve(ids).container_res.envs["LINGJUN_GRANT_ID"]
    with NomadApiDouble() as api:
        api.add_alloc("a1", ids, status="complete")  # the allocation ended: grace starts
        client = NomadClient(NomadApiSettings(address=api.address))
        rec = Reconciler(reserver, client, lambda: cat, grace=2.0, node_id=api.node_id, max_wait=0.2)
        rec.round()
        real_time = time.time
        monkeypatch.setattr(time, "time", lambda: real_time() + 86400 * 30)  # the wall clock jumps 30 days
        rec.round()
        assert gid in backend.grants, "released early after a wall-clock jump"
        monkeypatch.setattr(time, "time", lambda: real_time() - 86400)  # and back, past where it was
        time.sleep(2.2)
        rec.round()
        assert gid not in backend.grants, "not released after the grace period (monotonic)"
        client.close()
