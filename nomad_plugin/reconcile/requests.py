"""Operator requests to the running plugin: ``grants release`` while the plugin runs.

Only the process holding the journal's owner lock writes the journal
(``journal/datadir.py``). So an operator command does not touch the journal of
a running plugin: it drops ``<data_dir>/requests/<grant id>.release.json``
(written to a temp name, then renamed: never read half-written) and waits
for ``<grant id>.result.json``. The plugin's ``RequestWatcher`` thread sleeps
until a request lands (inotify; where that is unavailable it looks twice a
second), performs the release through the ``Reserver`` (journalled like any
release, audit line included) and writes the result.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nomad_plugin.goplugin.logging import get_logger
from nomad_plugin.journal import JournalEntry
from nomad_plugin.reconcile.nomad_api import AllocView
from nomad_plugin.reconcile.reconciler import GrantReleaser
from nomad_plugin.util.dirwatch import DirWatch

log = get_logger(__name__)

DIR_NAME = "requests"
REQUEST_SUFFIX = ".release.json"
RESULT_SUFFIX = ".result.json"
#: A grant id is a UUID; this also keeps it a safe file name.
GRANT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")
MANUAL_REASON = "released by hand"


@dataclass(frozen=True)
class Result:
    ok: bool
    message: str

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "message": self.message}


def requests_dir(data_dir: str | os.PathLike[str]) -> Path:
    return Path(data_dir) / DIR_NAME


def check_grant_id(grant_id: str) -> str:
    if not GRANT_ID.match(grant_id):
        raise ValueError(f"grant id {grant_id!r} is not a grant id (letters, digits, '-', '.', '_')")
    return grant_id


def _write_atomic(path: Path, doc: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, json.dumps(doc).encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)


def submit_release(data_dir: str | os.PathLike[str], grant_id: str, force: bool) -> None:
    """Operator side: ask the running plugin to release ``grant_id``."""
    directory = requests_dir(data_dir)
    directory.mkdir(mode=0o700, exist_ok=True)
    (directory / f"{grant_id}{RESULT_SUFFIX}").unlink(missing_ok=True)
    _write_atomic(
        directory / f"{check_grant_id(grant_id)}{REQUEST_SUFFIX}",
        {"grant_id": grant_id, "force": force, "requested_at": time.time()},
    )


def wait_result(data_dir: str | os.PathLike[str], grant_id: str, timeout: float) -> Result | None:
    """Operator side: the plugin's answer, or None if none came within ``timeout``."""
    path = requests_dir(data_dir) / f"{grant_id}{RESULT_SUFFIX}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            doc = json.loads(path.read_text())
        except (FileNotFoundError, ValueError):
            time.sleep(0.1)
            continue
        path.unlink(missing_ok=True)
        return Result(bool(doc.get("ok")), str(doc.get("message", "")))
    return None


def withdraw(data_dir: str | os.PathLike[str], grant_id: str) -> None:
    """Operator side: take back a request nobody answered (the plugin stopped meanwhile)."""
    (requests_dir(data_dir) / f"{grant_id}{REQUEST_SUFFIX}").unlink(missing_ok=True)


class RequestWatcher:
    """Plugin side: one thread that performs operator release requests."""

    def __init__(
        self,
        reserver: GrantReleaser,
        data_dir: str | os.PathLike[str],
        live_holder: Callable[[JournalEntry], AllocView | None],
        period: float = 0.5,
    ) -> None:
        self.reserver = reserver
        self.dir = requests_dir(data_dir)
        self.live_holder = live_holder
        self.period = period
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._watch: DirWatch | None = None

    def start(self) -> None:
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._watch = DirWatch(self.dir, REQUEST_SUFFIX, self._stop, poll_period=self.period)
        self._thread = threading.Thread(target=self._run, args=(self._watch,), name="grant-requests", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 1.0) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.wake()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self, watch: DirWatch) -> None:
        """Answer what is there (requests left from before a restart), then each request as it lands."""
        try:
            while not self._stop.is_set():
                try:
                    self.poll()
                except Exception:
                    log.exception("operator request handling failed")
                    if self._stop.wait(self.period):  # the request stays: try it again soon
                        return
                    continue
                if not watch.wait():
                    return
        finally:
            watch.close()

    def poll(self) -> int:
        """Handle every pending request once; returns how many were handled."""
        handled = 0
        # os.scandir, not Path.glob: where inotify is unavailable this runs twice a second for the
        # plugin's whole life, and pathlib's glob machinery cost more than the rest of it (issue 14).
        try:
            with os.scandir(self.dir) as found:
                names = sorted(e.name for e in found if e.name.endswith(REQUEST_SUFFIX))
        except FileNotFoundError:  # as glob: no folder, no requests
            return 0
        for path in (self.dir / name for name in names):
            grant_id = path.name[: -len(REQUEST_SUFFIX)]
            try:
                doc = json.loads(path.read_text())
                force = bool(doc.get("force"))
                check_grant_id(grant_id)
            except (OSError, ValueError) as exc:
                result = Result(False, f"unreadable request {path.name}: {exc}")
            else:
                result = self.release(grant_id, force)
            _write_atomic(self.dir / f"{grant_id}{RESULT_SUFFIX}", result.to_json())
            path.unlink(missing_ok=True)
            handled += 1
        return handled

    def release(self, grant_id: str, force: bool) -> Result:
        entry = self.reserver.journal.get(grant_id)
        if entry is None:
            return Result(True, f"grant {grant_id} is not in the journal (already released)")
        holder = self.live_holder(entry)
        if holder is not None and not force:
            return Result(
                False,
                f"refused: allocation {holder.id} of job {holder.namespace}/{holder.job} is {holder.client_status} "
                "and holds its devices (use --force to release anyway)",
            )
        reason = MANUAL_REASON + (" (--force)" if force else "")
        if self.reserver.release_grant(grant_id, reason):
            self.reserver.counters.inc("grants_released_by_hand")
            return Result(True, f"grant {grant_id} released ({reason})")
        return Result(
            False,
            f"XDM did not confirm the release of grant {grant_id}; it stays journalled as releasing and the plugin "
            "retries every reconciler round",
        )
