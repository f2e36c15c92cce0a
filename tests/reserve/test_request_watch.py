"""Operator requests wake the plugin through inotify; polling only where inotify is unavailable (issue 14).

The watcher used to look into ``<data_dir>/requests`` twice a second for the
plugin's whole life. These tests pin down that a request is answered with no
poll at all (a poll period of an hour), that files which are not requests
(the plugin's own answers, temp files) do not wake it, that ``stop`` wakes it
at once, and that a missing inotify or a removed directory falls back to
polling with a warning instead of losing requests.
"""

from __future__ import annotations

import fcntl
import os
import struct
import termios
import threading
from pathlib import Path

import inotify_simple

from nomad_plugin.config.model import PluginConfig
from nomad_plugin.journal import Journal
from nomad_plugin.nomad.reserve import Reserver
from nomad_plugin.reconcile.requests import REQUEST_SUFFIX, RequestWatcher, submit_release, wait_result
from nomad_plugin.util.dirwatch import DirWatch
from tests.doubles.reserve_fakes import FakeBackend, card_uuid, catalog, whole_group
from tests.waiting import wait_until

CAT = catalog(whole_group(4))
HOUR = 3600.0


def _reserver(tmp_path: Path) -> tuple[FakeBackend, Reserver]:
    backend = FakeBackend()
    return backend, Reserver(
        backend, lambda: CAT, Journal(tmp_path / "journal"), PluginConfig(), path_exists=lambda p: False
    )


def _queued_bytes(watch: DirWatch) -> int:
    """Bytes of inotify events not yet read by the watch."""
    buf = bytearray(4)
    fcntl.ioctl(watch._inotify.fileno(), termios.FIONREAD, buf)
    return int(struct.unpack("i", buf)[0])


class _Waiter:
    """``watch.wait()`` on a thread of its own; ``result`` once it returned."""

    def __init__(self, watch: DirWatch) -> None:
        self.result: bool | None = None
        self.thread = threading.Thread(target=self._run, args=(watch,), daemon=True)
        self.thread.start()

    def _run(self, watch: DirWatch) -> None:
        self.result = watch.wait()


def _release_by_request(tmp_path: Path, period: float, mode: str) -> RequestWatcher:
    """A grant, a running watcher (``mode`` expected), a release request answered: the stopped watcher."""
    backend, reserver = _reserver(tmp_path)
    grant = reserver.reserve([card_uuid(0)]).container_res.envs["LINGJUN_GRANT_ID"]
    watcher = RequestWatcher(reserver, tmp_path, lambda e: None, period=period)
    watcher.start()
    try:
        assert watcher._watch is not None and watcher._watch.mode == mode
        submit_release(tmp_path, grant, force=False)
        answer = wait_result(tmp_path, grant, timeout=30)
    finally:
        watcher.stop(timeout=30)
    assert answer is not None and answer.ok, answer
    assert grant not in backend.grants
    return watcher


def test_a_request_is_answered_without_any_poll(tmp_path):
    """Poll period one hour: only inotify can bring this request to the watcher in time."""
    watcher = _release_by_request(tmp_path, HOUR, "inotify")
    assert watcher._thread is not None
    assert not watcher._thread.is_alive(), "stop() must wake a watcher that sleeps on inotify"


def test_stop_gives_up_after_its_timeout_on_a_busy_watcher(tmp_path):
    """The plugin's shutdown must not hang on a request still being handled: ``stop`` waits ``timeout``, no more."""
    backend, reserver = _reserver(tmp_path)
    grant = reserver.reserve([card_uuid(0)]).container_res.envs["LINGJUN_GRANT_ID"]
    busy, leave = threading.Event(), threading.Event()

    def slow_holder(entry: object) -> None:
        busy.set()
        leave.wait(60)

    watcher = RequestWatcher(reserver, tmp_path, slow_holder, period=HOUR)
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


def test_stop_wakes_a_waiting_watch_at_once(tmp_path):
    stop = threading.Event()
    watch = DirWatch(tmp_path, REQUEST_SUFFIX, stop, poll_period=HOUR, safety_period=HOUR)
    assert watch.mode == "inotify"
    waiter = _Waiter(watch)
    stop.set()
    watch.wake()
    waiter.thread.join(30)
    assert not waiter.thread.is_alive(), "wait() kept sleeping after stop and wake"
    assert waiter.result is False
    watch.close()
    watch.wake()  # after close: no write to a closed (or reused) descriptor, no error
    assert watch.wait() is False


def test_files_that_are_not_requests_do_not_wake_it(tmp_path):
    """The watcher's own answers and temp files land in the same directory: they must not count."""
    stop = threading.Event()
    watch = DirWatch(tmp_path, REQUEST_SUFFIX, stop, poll_period=HOUR, safety_period=HOUR)
    (tmp_path / "g-1.result.json.tmp").write_text("{}")
    os.replace(tmp_path / "g-1.result.json.tmp", tmp_path / "g-1.result.json")
    assert _queued_bytes(watch) > 0
    waiter = _Waiter(watch)
    wait_until(lambda: _queued_bytes(watch) == 0, "the watch to read the events of the answer file")
    stop.set()
    watch.wake()
    waiter.thread.join(30)
    assert waiter.result is False, "an answer file woke the watch as if it were a request"
    watch.close()


def test_a_request_file_wakes_it(tmp_path):
    stop = threading.Event()
    watch = DirWatch(tmp_path, REQUEST_SUFFIX, stop, poll_period=HOUR, safety_period=HOUR)
    waiter = _Waiter(watch)
    (tmp_path / ".g-2.tmp").write_text("{}")
    os.replace(tmp_path / ".g-2.tmp", tmp_path / f"g-2{REQUEST_SUFFIX}")
    waiter.thread.join(30)
    assert not waiter.thread.is_alive() and waiter.result is True
    watch.close()


def test_without_inotify_it_polls_and_says_so(tmp_path, monkeypatch, caplog):
    def no_inotify(*args: object, **kwargs: object) -> None:
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(inotify_simple, "INotify", no_inotify)
    _release_by_request(tmp_path, 0.05, "polling")
    assert (
        f"cannot watch {tmp_path / 'requests'} with inotify ([Errno 24] Too many open files); "
        "looking for files every 0.05 s instead"
    ) in [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]


def test_a_removed_directory_ends_the_watch_and_polling_takes_over(tmp_path, caplog):
    directory = tmp_path / "requests"
    directory.mkdir()
    stop = threading.Event()
    watch = DirWatch(directory, REQUEST_SUFFIX, stop, poll_period=0.05, safety_period=HOUR)
    directory.rmdir()
    assert watch.wait() is True, "the end of the watch must send the caller to look"
    assert watch.mode == "polling"
    assert f"stopped watching {directory} (removed or moved); looking every 0.05 s" in [
        r.getMessage() for r in caplog.records if r.levelname == "WARNING"
    ]
    assert watch.wait() is True  # now a poll: returns after the poll period
    stop.set()
    assert watch.wait() is False
    watch.close()


def test_a_request_written_in_place_also_wakes_it(tmp_path):
    """Not every writer renames: a file written and closed in place counts too."""
    stop = threading.Event()
    watch = DirWatch(tmp_path, REQUEST_SUFFIX, stop, poll_period=HOUR, safety_period=HOUR)
    waiter = _Waiter(watch)
    (tmp_path / f"g-3{REQUEST_SUFFIX}").write_text("{}")
    waiter.thread.join(30)
    assert not waiter.thread.is_alive() and waiter.result is True
    watch.close()
