"""The request watcher lists the requests directory: an answer within a second, and no process or inotify instance.

``grants release`` against a running plugin waits for the plugin's answer
file (docs/operator.md: "answers within a second"). These tests pin down
that a request landing at any moment is answered within the default
period, that files which are not requests (the plugin's own answers, temp
files) are left alone, that ``stop`` ends the thread at once, and that
the watcher spawns nothing (the plugin runtime never starts a process).
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

from nomad_plugin.config.model import PluginConfig
from nomad_plugin.journal import Journal
from nomad_plugin.nomad.reserve import Reserver
from nomad_plugin.reconcile.requests import REQUEST_SUFFIX, RequestWatcher, submit_release, wait_result
from tests.doubles.reserve_fakes import FakeBackend, card_uuid, catalog, whole_group

CAT = catalog(whole_group(4))
HOUR = 3600.0


def _reserver(tmp_path: Path) -> tuple[FakeBackend, Reserver]:
    backend = FakeBackend()
    return backend, Reserver(
        backend, lambda: CAT, Journal(tmp_path / "journal"), PluginConfig(), path_exists=lambda p: False
    )


def test_a_request_is_answered_within_a_second_by_the_default_watcher(tmp_path, monkeypatch):
    spawned: list[object] = []
    real_popen = subprocess.Popen.__init__
    monkeypatch.setattr(
        subprocess.Popen, "__init__", lambda self, *a, **k: spawned.append(a) or real_popen(self, *a, **k)
    )
    backend, reserver = _reserver(tmp_path)
    grants = [reserver.reserve([card_uuid(i)]).container_res.envs["LINGJUN_GRANT_ID"] for i in range(3)]
    watcher = RequestWatcher(reserver, tmp_path, lambda e: None)
    assert watcher.period <= 0.5, "the default look must answer an operator within a second"
    watcher.start()
    try:
        for grant in grants:
            time.sleep(0.13)  # a request lands at another moment of the watcher's period each time
            submit_release(tmp_path, grant, force=False)
            answer = wait_result(tmp_path, grant, timeout=30)
            assert answer is not None and answer.ok, answer
    finally:
        watcher.stop(timeout=30)
    assert not any(g in backend.grants for g in grants)
    assert spawned == [], "the watcher must not start a process"


def test_stop_ends_a_watcher_that_waits_for_its_next_look_at_once(tmp_path):
    _, reserver = _reserver(tmp_path)
    watcher = RequestWatcher(reserver, tmp_path, lambda e: None, period=HOUR)
    watcher.start()
    assert watcher._thread is not None
    time.sleep(0.05)  # its first look done, it sleeps for an hour
    stopper = threading.Thread(target=watcher.stop, kwargs={"timeout": 30}, daemon=True)
    stopper.start()
    stopper.join(30)
    assert not stopper.is_alive() and not watcher._thread.is_alive(), "stop() did not wake the sleeping watcher"


def test_stop_gives_up_after_its_timeout_on_a_busy_watcher(tmp_path):
    """The plugin's shutdown must not hang on a request still being handled: ``stop`` waits ``timeout``, no more."""
    backend, reserver = _reserver(tmp_path)
    grant = reserver.reserve([card_uuid(0)]).container_res.envs["LINGJUN_GRANT_ID"]
    busy, leave = threading.Event(), threading.Event()

    def slow_holder(entry: object) -> None:
        busy.set()
        leave.wait(60)

    watcher = RequestWatcher(reserver, tmp_path, slow_holder, period=0.05)
    watcher.start()
    submit_release(tmp_path, grant, force=False)
    assert busy.wait(30), "the watcher never started handling the request"
    stopper = threading.Thread(target=watcher.stop, kwargs={"timeout": 0.2}, daemon=True)
    stopper.start()
    stopper.join(30)
    try:
        assert not stopper.is_alive(), "stop(timeout=0.2) still waits for a watcher busy with a request"
        assert watcher._thread is not None and watcher._thread.is_alive()
    finally:
        leave.set()
    watcher._thread.join(30)
    assert not watcher._thread.is_alive(), "the watcher did not end after its request"
    answer = wait_result(tmp_path, grant, timeout=30)
    assert answer is not None and answer.ok, answer
    assert grant not in backend.grants


def test_files_that_are_not_requests_are_left_alone(tmp_path):
    """The watcher's own answers and temp files land in the same directory: they are not requests."""
    _, reserver = _reserver(tmp_path)
    watcher = RequestWatcher(reserver, tmp_path, lambda e: None)
    watcher.dir.mkdir(mode=0o700)
    others = ["g-1.result.json", f".g-2{REQUEST_SUFFIX}.tmp-1-2", "notes.txt"]
    for name in others:
        (watcher.dir / name).write_text("{}")
    assert watcher.poll() == 0
    assert sorted(os.listdir(watcher.dir)) == sorted(others)


def test_a_request_written_in_place_is_answered_too(tmp_path):
    """Not every writer renames: a file written in place is a request as well."""
    backend, reserver = _reserver(tmp_path)
    grant = reserver.reserve([card_uuid(0)]).container_res.envs["LINGJUN_GRANT_ID"]
    watcher = RequestWatcher(reserver, tmp_path, lambda e: None)
    watcher.dir.mkdir(mode=0o700)
    (watcher.dir / f"{grant}{REQUEST_SUFFIX}").write_text('{"force": false}')
    assert watcher.poll() == 1
    answer = wait_result(tmp_path, grant, timeout=1)
    assert answer is not None and answer.ok and grant not in backend.grants


def test_a_removed_requests_directory_is_no_error(tmp_path, caplog):
    _, reserver = _reserver(tmp_path)
    watcher = RequestWatcher(reserver, tmp_path, lambda e: None, period=0.05)
    watcher.start()
    try:
        watcher.dir.rmdir()
        time.sleep(0.2)  # a few looks at a missing directory
        assert watcher._thread is not None and watcher._thread.is_alive()
    finally:
        watcher.stop(timeout=30)
    assert "operator request handling failed" not in caplog.text
