"""The journal's owner lock and the operator request watcher (grants release while the plugin runs)."""

from __future__ import annotations

import json
import os
import threading

import pytest

from nomad_plugin.config.model import PluginConfig
from nomad_plugin.journal import Journal, OwnerLock, plugin_running
from nomad_plugin.nomad.reserve import Reserver
from nomad_plugin.reconcile.nomad_api import AllocView
from nomad_plugin.reconcile.requests import RequestWatcher, check_grant_id, submit_release, wait_result
from tests.reserve.fakes import FakeBackend, card_uuid, catalog, whole_group

CAT = catalog(whole_group(4))


def test_owner_lock_is_exclusive_and_dies_with_its_holder(tmp_path):
    assert not plugin_running(tmp_path)
    first = OwnerLock(tmp_path)
    assert first.acquire()
    assert plugin_running(tmp_path)  # another open file description cannot take it
    second = OwnerLock(tmp_path)
    assert not second.acquire(timeout=0.1)
    threading.Timer(0.2, first.release).start()
    assert second.acquire(timeout=5), "the lock was not handed over once released"
    second.release()
    assert not plugin_running(tmp_path)
    assert (tmp_path / "plugin.lock").stat().st_mode & 0o777 == 0o600


def test_grant_ids_are_safe_file_names():
    assert check_grant_id("7d55e706-fc03-4107-bed0-06e64c54300d")
    for bad in ("../journal", "a/b", "", ".hidden"):
        with pytest.raises(ValueError):
            check_grant_id(bad)


def test_watcher_releases_refuses_and_answers(tmp_path):
    backend = FakeBackend()
    reserver = Reserver(backend, lambda: CAT, Journal(tmp_path), PluginConfig(), path_exists=lambda p: False)
    held = reserver.reserve([card_uuid(0)]).container_res.envs["LINGJUN_GRANT_ID"]
    free = reserver.reserve([card_uuid(1)]).container_res.envs["LINGJUN_GRANT_ID"]
    holder = AllocView("alloc-1", "running", frozenset({card_uuid(0)}), "team-a", "train")

    watcher = RequestWatcher(reserver, tmp_path, lambda e: holder if card_uuid(0) in e.device_ids else None)
    watcher.dir.mkdir(mode=0o700)
    submit_release(tmp_path, held, force=False)
    submit_release(tmp_path, free, force=False)
    assert watcher.poll() == 2
    refused = wait_result(tmp_path, held, timeout=1)
    done = wait_result(tmp_path, free, timeout=1)
    assert refused is not None and not refused.ok and "alloc-1" in refused.message and "team-a/train" in refused.message
    assert done is not None and done.ok
    assert held in backend.grants and free not in backend.grants
    assert [e.grant_id for e in reserver.entries()] == [held]

    submit_release(tmp_path, held, force=True)
    watcher.poll()
    forced = wait_result(tmp_path, held, timeout=1)
    assert forced is not None and forced.ok and reserver.entries() == []
    assert reserver.counters.grants_released_by_hand == 2
    assert list(watcher.dir.iterdir()) == []  # requests and results are consumed

    (watcher.dir / "x.release.json").write_text("{not json")
    watcher.poll()
    bad = json.loads((watcher.dir / "x.result.json").read_text())
    assert bad["ok"] is False and "unreadable request" in bad["message"]


def test_the_owner_lock_creates_its_directory_0700_and_never_waits_unless_asked(tmp_path, monkeypatch):
    from nomad_plugin.journal import owner

    slept: list[float] = []
    monkeypatch.setattr(owner.time, "sleep", slept.append)
    data = tmp_path / "a" / "b"
    lock = OwnerLock(data)
    assert lock.acquire() and lock.acquire(), "acquiring a held lock again is a no-op that says yes"
    assert lock.held and (data.stat().st_mode & 0o777) == 0o700
    assert (data / "plugin.lock").read_text() == f"{os.getpid()}\n"
    assert plugin_running(data) and not OwnerLock(data).acquire()
    assert slept == [], "without a timeout nobody waits"
    waits = iter([0.0, 0.0, 10.0])  # monotonic: start, one failed try, then past the deadline
    monkeypatch.setattr(owner.time, "monotonic", lambda: next(waits))
    assert not OwnerLock(data).acquire(timeout=1.0)
    assert slept == [0.05], "one poll interval between tries"
    lock.release()
    assert not lock.held
