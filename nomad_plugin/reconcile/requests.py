"""Operator requests to the running plugin: ``grants release`` while the plugin runs.

Only the owner of ``plugin.lock`` writes the journal, so an operator command
drops ``<data_dir>/requests/<grant id>.release.json`` (written whole by a
rename) and waits for ``<grant id>.result.json``. The plugin's
``RequestWatcher`` lists the directory every ``period``, releases through
the Reserver (journalled, audit line included) and writes the result.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from nomad_plugin.journal import JournalEntry
from nomad_plugin.journal.datadir import write_state
from nomad_plugin.reconcile.nomad_api import AllocView
from nomad_plugin.reconcile.reconciler import GrantReleaser

log = logging.getLogger(__name__)

REQUEST_SUFFIX = ".release.json"
RESULT_SUFFIX = ".result.json"
#: A grant id is a UUID; this also keeps it a safe file name.
GRANT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")
MANUAL_REASON = "released by hand"


@dataclass(frozen=True)
class Result:
    ok: bool
    message: str


def requests_dir(data_dir: str | os.PathLike[str]) -> Path:
    return Path(data_dir) / "requests"


def check_grant_id(grant_id: str) -> str:
    if not GRANT_ID.match(grant_id):
        raise ValueError(f"grant id {grant_id!r} is not a grant id (letters, digits, '-', '.', '_')")
    return grant_id


def submit_release(data_dir: str | os.PathLike[str], grant_id: str, force: bool) -> None:
    """Operator side: ask the running plugin to release ``grant_id``."""
    directory = requests_dir(data_dir)
    directory.mkdir(mode=0o700, exist_ok=True)
    (directory / f"{grant_id}{RESULT_SUFFIX}").unlink(missing_ok=True)
    doc = {"grant_id": grant_id, "force": force, "requested_at": time.time()}
    write_state(directory / f"{check_grant_id(grant_id)}{REQUEST_SUFFIX}", doc)


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

    def start(self) -> None:
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._run, name="grant-requests", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 1.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll()
            except Exception:  # the request stays: tried again at the next look
                log.exception("operator request handling failed")
            self._stop.wait(self.period)

    def poll(self) -> int:
        """Handle every pending request once (those left from before a restart too); returns how many."""
        try:
            names = sorted(name for name in os.listdir(self.dir) if name.endswith(REQUEST_SUFFIX))
        except FileNotFoundError:
            return 0
        for name in names:
            grant_id = name[: -len(REQUEST_SUFFIX)]
            try:
                force = bool(json.loads((self.dir / name).read_text()).get("force"))
                check_grant_id(grant_id)
            except (OSError, ValueError, AttributeError) as exc:
                result = Result(False, f"unreadable request {name}: {exc}")
            else:
                result = self.release(grant_id, force)
            write_state(self.dir / f"{grant_id}{RESULT_SUFFIX}", {"ok": result.ok, "message": result.message})
            (self.dir / name).unlink(missing_ok=True)
        return len(names)

    def release(self, grant_id: str, force: bool) -> Result:
        entry = next((e for e in self.reserver.entries() if e.grant_id == grant_id), None)
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
