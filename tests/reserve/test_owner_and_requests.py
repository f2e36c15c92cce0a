"""The journal's owner lock and the operator request watcher (grants release while the plugin runs)."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest

from nomad_plugin.config.model import PluginConfig
from nomad_plugin.journal import Journal, OwnerLock, plugin_running
from nomad_plugin.nomad.reserve import Reserver
from nomad_plugin.reconcile.nomad_api import AllocView
from nomad_plugin.reconcile.requests import (
    RequestWatcher,
    Result,
    check_grant_id,
    submit_release,
    wait_result,
    withdraw,
)
from tests.doubles.reserve_fakes import UNAVAILABLE, FakeBackend, card_uuid, catalog, whole_group
from tests.this_thread import in_this_thread
from tests.waiting import wait_until

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
    from nomad_plugin.journal import datadir as owner

    slept: list[float] = []
    monkeypatch.setattr(owner.time, "sleep", in_this_thread(slept.append, time.sleep))
    data = tmp_path / "a" / "b"
    lock = OwnerLock(data)
    assert lock.acquire() and lock.acquire(), "acquiring a held lock again is a no-op that says yes"
    assert lock.held and (data.stat().st_mode & 0o777) == 0o700
    assert (data / "plugin.lock").read_text() == f"{os.getpid()}\n"
    assert plugin_running(data) and not OwnerLock(data).acquire()
    assert slept == [], "without a timeout nobody waits"
    waits = iter([0.0, 0.0, 10.0])  # monotonic: start, one failed try, then past the deadline
    monkeypatch.setattr(owner.time, "monotonic", in_this_thread(lambda: next(waits), time.monotonic))
    assert not OwnerLock(data).acquire(timeout=1.0)
    assert slept == [0.05], "one poll interval between tries"
    lock.release()
    assert not lock.held


def running_threads(name):
    return [t for t in threading.enumerate() if t.name == name and t.is_alive()]


def test_watcher_thread_answers_on_its_own_and_survives_an_error(tmp_path, caplog):
    """start(): the directory (owner only) and a daemon thread that polls; an error in one poll is logged, not fatal."""
    backend = FakeBackend()
    reserver = Reserver(backend, lambda: CAT, Journal(tmp_path), PluginConfig(), path_exists=lambda p: False)
    first = reserver.reserve([card_uuid(0)]).container_res.envs["LINGJUN_GRANT_ID"]
    second = reserver.reserve([card_uuid(1)]).container_res.envs["LINGJUN_GRANT_ID"]
    calls = []

    def live_holder(entry):
        calls.append(entry.grant_id)
        if len(calls) == 1:
            raise RuntimeError("Nomad view broke")
        return None

    data_dir = tmp_path / "not" / "yet"
    watcher = RequestWatcher(reserver, data_dir, live_holder, period=0.05)
    assert not running_threads("grant-requests")
    watcher.start()
    try:
        assert watcher.dir == data_dir / "requests" and watcher.dir.stat().st_mode & 0o777 == 0o700
        (thread,) = running_threads("grant-requests")
        assert thread.daemon, "the request thread must not keep a stopping plugin alive"
        submit_release(data_dir, first, force=False)
        wait_until(
            lambda: [r for r in caplog.records if r.getMessage() == "operator request handling failed"],
            "the failed poll's log line",
        )
        answer = wait_result(data_dir, first, timeout=30)  # the request stayed; a later poll answers it
        assert answer is not None and answer.ok, answer
        assert "Nomad view broke" in caplog.text  # the traceback is logged with the line
        submit_release(data_dir, second, force=False)
        answer = wait_result(data_dir, second, timeout=30)
        assert answer is not None and answer.ok, answer
        assert first not in backend.grants and second not in backend.grants
    finally:
        watcher.stop(timeout=30)
    assert not thread.is_alive(), "stop() returned while the thread still ran"


def test_stop_before_start_is_harmless(tmp_path):
    watcher = RequestWatcher(None, tmp_path, lambda e: None)
    watcher.stop()
    assert not watcher.dir.exists()


def test_withdraw_takes_back_an_unanswered_request(tmp_path):
    submit_release(tmp_path, "g-1", force=True)
    request = tmp_path / "requests" / "g-1.release.json"
    doc = json.loads(request.read_text())
    assert doc["grant_id"] == "g-1" and doc["force"] is True
    withdraw(tmp_path, "g-1")
    assert not request.exists()
    withdraw(tmp_path, "g-1")  # nothing left to take back: no error


def test_a_restarted_plugin_answers_a_request_left_from_before(tmp_path):
    """The requests directory outlives the plugin: start() takes it as it is, with what is waiting in it."""
    backend = FakeBackend()
    reserver = Reserver(backend, lambda: CAT, Journal(tmp_path), PluginConfig(), path_exists=lambda p: False)
    grant = reserver.reserve([card_uuid(0)]).container_res.envs["LINGJUN_GRANT_ID"]
    submit_release(tmp_path, grant, force=False)  # the plugin was down: nobody answered
    watcher = RequestWatcher(reserver, tmp_path, lambda e: None, period=0.05)
    watcher.start()
    try:
        answer = wait_result(tmp_path, grant, timeout=30)
    finally:
        watcher.stop(timeout=30)
    assert answer is not None and answer.ok, answer
    assert grant not in backend.grants


def test_operator_side_files_and_messages(tmp_path):
    """The request is owner-only, in an owner-only directory, and says what was asked and when."""
    before = time.time()
    submit_release(tmp_path, "g-1", force=False)
    directory = tmp_path / "requests"
    request = directory / "g-1.release.json"
    assert directory.stat().st_mode & 0o777 == 0o700
    assert request.stat().st_mode & 0o777 == 0o600
    doc = json.loads(request.read_text())
    assert sorted(doc) == ["force", "grant_id", "requested_at"]
    assert doc["grant_id"] == "g-1" and doc["force"] is False and before <= doc["requested_at"] <= time.time()
    with pytest.raises(ValueError) as info:
        check_grant_id("../journal")
    assert str(info.value) == "grant id '../journal' is not a grant id (letters, digits, '-', '.', '_')"


def test_wait_result_waits_for_an_answer_that_comes_later(tmp_path):
    submit_release(tmp_path, "g-1", force=False)
    result = tmp_path / "requests" / "g-1.result.json"
    writer = threading.Timer(0.3, lambda: result.write_text(json.dumps({"ok": True})))
    writer.start()
    try:
        answer = wait_result(tmp_path, "g-1", timeout=30)
    finally:
        writer.join()
    assert answer is not None and answer.ok and answer.message == "", answer  # no message: empty, not "None"
    assert not result.exists(), "the answer is consumed"


def test_every_answer_of_the_watcher_in_full(tmp_path, caplog):
    backend = FakeBackend()
    reserver = Reserver(backend, lambda: CAT, Journal(tmp_path), PluginConfig(), path_exists=lambda p: False)
    held = reserver.reserve([card_uuid(0)]).container_res.envs["LINGJUN_GRANT_ID"]
    stuck = reserver.reserve([card_uuid(1)]).container_res.envs["LINGJUN_GRANT_ID"]
    holder = AllocView("alloc-1", "pending", frozenset({card_uuid(0)}), "team-a", "train")
    watcher = RequestWatcher(reserver, tmp_path, lambda e: holder if card_uuid(0) in e.device_ids else None)

    refused = watcher.release(held, force=False)
    assert refused == Result(
        False,
        "refused: allocation alloc-1 of job team-a/train is pending and holds its devices "
        "(use --force to release anyway)",
    )
    with caplog.at_level("INFO"):
        assert watcher.release(held, force=True) == Result(True, f"grant {held} released (released by hand (--force))")
    assert f"grant {held} released: released by hand (--force)" in [r.getMessage() for r in caplog.records]
    assert watcher.release(held, force=False) == Result(True, f"grant {held} is not in the journal (already released)")

    backend.fail_release = UNAVAILABLE
    assert watcher.release(stuck, force=False) == Result(
        False,
        f"XDM did not confirm the release of grant {stuck}; it stays journalled as releasing and the plugin "
        "retries every reconciler round",
    )
    assert reserver.counters.grants_released_by_hand == 1, "only a confirmed release counts"
    backend.fail_release = None
    assert watcher.release(stuck, force=False) == Result(True, f"grant {stuck} released (released by hand)")
    assert reserver.counters.grants_released_by_hand == 2
    assert stuck not in backend.grants and held not in backend.grants and reserver.entries() == []


def test_polling_before_the_requests_folder_exists_handles_nothing(tmp_path):
    watcher = RequestWatcher(None, tmp_path, lambda e: None)
    assert watcher.poll() == 0
    assert not watcher.dir.exists()


def test_a_plugin_that_finds_the_lock_held_serves_fingerprints_refuses_reserve_and_touches_nothing(
    tmp_path, monkeypatch
):
    """A second plugin on the same data_dir: no recovery, release or reconciliation until the lock is its own."""
    from nomad_plugin import app as app_module
    from nomad_plugin.app import JournalUnavailable, PluginApp
    from nomad_plugin.journal import EntryState, JournalEntry

    monkeypatch.setattr(app_module, "OWNER_LOCK_WAIT", 0.3)
    holder = OwnerLock(tmp_path)
    assert holder.acquire()
    left = JournalEntry("left-1", (card_uuid(0),), "g", "whole", ("c0",), (), time.time(), EntryState.INTENT)
    Journal(tmp_path).put(left)  # the other process's Reserve in flight
    backend = FakeBackend()
    app = PluginApp(backend_factory=lambda config: backend)
    app.set_config(PluginConfig(data_dir=str(tmp_path), reconcile=False))
    cancel = threading.Event()
    try:
        started = time.monotonic()
        next(app.fingerprints(cancel))
        assert time.monotonic() - started < 5, "the first fingerprint waited on the lock"
        with pytest.raises(JournalUnavailable, match="is held by another process") as err:
            app.reserve([card_uuid(1)])
        assert f"pid {os.getpid()}" in str(err.value) and err.value.kind == "journal"
        assert backend.released == [] and backend.allocate_calls == 0
        assert [e.grant_id for e in Journal.snapshot(tmp_path)] == ["left-1"], "the journal was touched"
        holder.release()  # the other process exits
        wait_until(lambda: app.reserver is not None, "the plugin to take the lock")
        wait_until(lambda: backend.released == ["left-1"], "the recovery of what the other process left")
    finally:
        cancel.set()
        app.close()
    assert OwnerLock(tmp_path).acquire(), "close() gave the lock back"
