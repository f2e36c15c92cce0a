"""``container_mounts``: whether a Reserve hands XDM's host mounts to the task.

Nomad's task runner lets a device plugin's non-empty mount list *replace*
the task's host and CSI volume mounts (docs/reserve.md, "Mounts"). So:

- ``never``: XDM's mounts are validated and dropped (driver libraries come
  from the image or the lj-runtime shim);
- ``always``: they are passed; a task with a ``volume_mount`` loses its volumes;
- ``auto``: they are passed unless the starting task has a ``volume_mount``,
  found through the Nomad API from the device IDs; when that cannot be told,
  they are withheld and the reason is logged.

Only Reserves whose grant carries mounts get here, so "auto" costs an API
call only when there is something to decide.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from nomad_plugin.goplugin.logging import get_logger
from nomad_plugin.reconcile.alloc_volumes import VolumeVerdict

log = get_logger(__name__)

MODES = ("auto", "always", "never")


@dataclass(frozen=True)
class MountDecision:
    """``outcome`` is a bounded metric label: passed, volumes, unknown or never."""

    passed: bool
    outcome: str
    reason: str


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

    def decide(self, device_ids: Sequence[str]) -> MountDecision:
        decision = self._decide(device_ids)
        if self._observe is not None:
            try:
                self._observe(decision)
            except Exception:
                log.exception("mount decision observer failed")
        return decision

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
