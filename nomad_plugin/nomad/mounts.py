"""``container_mounts``: whether a Reserve hands XDM's host mounts to the task.

Nomad's task runner lets a device plugin's non-empty mount list *replace*
the task's host and CSI volume mounts (docs/reserve.md, "Mounts"). So:

- ``never``: XDM's mounts are validated and dropped (driver libraries come
  from the image or the lj-runtime shim);
- ``always``: they are passed; a task with a ``volume_mount`` loses its volumes;
- ``auto``: they are passed unless the starting task has a ``volume_mount``,
  found through the Nomad API from the device IDs; when that cannot be told,
  they are withheld and the reason is logged.

Only Reserves whose grant carries mounts use a decision, so "auto" asks the
API only when there is something to decide. Once XDM's grants carry mounts,
the Reserver starts the question (``begin``) before Allocate, on a worker
thread: the API's answer and XDM's then arrive in the same wait, instead of
one after the other (issue 14: the question was a quarter of a Reserve). A
question started for a grant that came back without mounts is dropped.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from dataclasses import dataclass

from nomad_plugin.goplugin.logging import get_logger
from nomad_plugin.reconcile.alloc_volumes import VolumeVerdict

log = get_logger(__name__)

MODES = ("auto", "always", "never")
#: Questions to the Nomad API in flight at once (one per concurrent Reserve; more wait their turn).
LOOKUP_WORKERS = 4


@dataclass(frozen=True)
class MountDecision:
    """``outcome`` is a bounded metric label: passed, volumes, unknown or never."""

    passed: bool
    outcome: str
    reason: str


class PendingDecision:
    """A decision being made on a worker thread (``auto``), or one made already; ``result`` waits for it."""

    def __init__(self, policy: MountPolicy, made: MountDecision | Future[MountDecision]) -> None:
        self._policy = policy
        self._made = made

    def result(self) -> MountDecision:
        made = self._made
        if isinstance(made, Future):
            try:
                made = made.result()
            except CancelledError:  # close() came first
                made = MountDecision(False, "unknown", "the plugin is shutting down")
        self._policy.observe(made)
        return made


class MountPolicy:
    def __init__(
        self,
        mode: str,
        lookup: Callable[[Sequence[str]], VolumeVerdict] | None = None,
        observe: Callable[[MountDecision], None] | None = None,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"container_mounts: {mode!r} is not one of {', '.join(MODES)}")
        self.mode = mode
        self._lookup = lookup
        self._observe = observe
        self._pool_lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._closed = False

    def decide(self, device_ids: Sequence[str]) -> MountDecision:
        """The decision for these device IDs; waits for it.

        In ``auto`` the question runs on a lookup worker, as an early one does. A
        Reserve decides this way when nothing told it to start early: the first
        one whose grant carries mounts. Its question then starts the worker
        thread, which the next Reserve's early question would otherwise start,
        about 1 ms on that Reserve (issue 14).
        """
        return self.begin(device_ids).result()

    def begin(self, device_ids: Sequence[str]) -> PendingDecision:
        """Start deciding; a question to the Nomad API runs on a worker thread while the caller goes on."""
        if self.mode != "auto" or self._lookup is None:
            return PendingDecision(self, self._decide(device_ids))
        ids = tuple(device_ids)
        with self._pool_lock:
            if self._closed:
                return PendingDecision(self, MountDecision(False, "unknown", "the plugin is shutting down"))
            if self._pool is None:
                self._pool = ThreadPoolExecutor(LOOKUP_WORKERS, thread_name_prefix="mount-lookup")
            return PendingDecision(self, self._pool.submit(self._decide, ids))

    def close(self) -> None:
        """Drop questions not started yet; one under way ends with its HTTP client (closed next)."""
        with self._pool_lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def observe(self, decision: MountDecision) -> None:
        """Count a decision that was used (one per Reserve whose grant carries mounts)."""
        if self._observe is not None:
            try:
                self._observe(decision)
            except Exception:
                log.exception("mount decision observer failed")

    def _decide(self, device_ids: Sequence[str]) -> MountDecision:
        if self.mode == "always":
            return MountDecision(True, "passed", 'container_mounts = "always"')
        if self.mode == "never":
            return MountDecision(False, "never", 'container_mounts = "never"')
        if self._lookup is None:
            return MountDecision(False, "unknown", "no Nomad API client to find the starting task")
        try:
            verdict = self._lookup(device_ids)
        except Exception as exc:  # the lookup must never fail a Reserve
            log.exception("finding the task of device IDs %s failed", ", ".join(device_ids))
            return MountDecision(False, "unknown", f"the task lookup failed: {type(exc).__name__}")
        if not verdict.known:
            return MountDecision(False, "unknown", verdict.reason)
        if verdict.has_volume_mounts:
            return MountDecision(False, "volumes", verdict.reason)
        return MountDecision(True, "passed", verdict.reason)
