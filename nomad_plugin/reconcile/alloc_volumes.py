"""Which task is starting, and does it mount volumes? Asked of the Nomad API at Reserve.

Under ``container_mounts = "auto"`` XDM's mounts are passed only to a task
without ``volume_mount``: a non-empty mount list from the device hook
*replaces* the volume hook's (docs/reserve.md, "Mounts"). Reserve carries
only device IDs, so the task is the one whose device block in this node's
allocation list holds exactly them, and its ``VolumeMounts`` come from the
allocation's job. When that cannot be told the verdict is "unknown" and the
mounts are withheld: losing a task's volumes is worse than lacking XDM's
driver mounts. An API that timed out is not asked again for
``TIMEOUT_BACKOFF`` seconds, so the Reserves in between do not each wait.

The reconciler's last page (``recent``) usually names the allocation already:
Nomad places it, and the node's blocking query answers, before its task
starts. Only those allocations are read then, afresh; the node's whole list
(every allocation with its job) is read when the page names none, or names
one that has ended or is no longer desired to run (a page from before the
replacement was placed).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from nomad_plugin.reconcile.nomad_api import TERMINAL, AllocPage, NomadApiError, NomadClient, parse_alloc

#: Tries when no allocation holds the IDs yet, and the pause between them.
LOOKUP_ATTEMPTS = 3
LOOKUP_RETRY_DELAY = 0.5
TIMEOUT_BACKOFF = 10.0


@dataclass(frozen=True)
class VolumeVerdict:
    """``has_volume_mounts`` is meaningful only when ``known``."""

    known: bool
    has_volume_mounts: bool
    reason: str


@dataclass(frozen=True)
class Candidate:
    """An allocation (as Nomad shapes it) whose task ``task`` holds exactly the requested IDs."""

    alloc: dict[str, Any]
    task: str

    @property
    def alloc_id(self) -> str:
        return str(self.alloc.get("ID", ""))[:64]


def find_candidates(allocs: Sequence[Any], device_ids: Sequence[str]) -> list[Candidate]:
    """Non-terminal allocations with a device block holding exactly ``device_ids``.

    When some are desired to run and others to stop (an old allocation still stopping while its
    replacement starts with the same IDs), only those desired to run are kept.
    """
    wanted = frozenset(device_ids)
    found: list[Candidate] = []
    for alloc in allocs:
        if not isinstance(alloc, dict) or alloc.get("ClientStatus") in TERMINAL:
            continue
        view = parse_alloc({**alloc, "ID": str(alloc.get("ID", "")), "ClientStatus": "pending"})  # its devices
        found += [Candidate(alloc, task) for task, ids in view.task_devices if ids == wanted]
    running = [c for c in found if c.alloc.get("DesiredStatus", "run") == "run"]
    return running or found


def task_volume_mounts(alloc: dict[str, Any], task: str) -> list[Any] | None:
    """The task's ``VolumeMounts`` from the allocation's job; None when the job is not in the answer."""
    job = alloc.get("Job")
    if not isinstance(job, dict):
        return None
    group_name = alloc.get("TaskGroup")
    for group in job.get("TaskGroups") or []:
        if not isinstance(group, dict) or group.get("Name") != group_name:
            continue
        for spec in group.get("Tasks") or []:
            if isinstance(spec, dict) and spec.get("Name") == task:
                mounts = spec.get("VolumeMounts") or []
                if not isinstance(mounts, list):
                    raise ValueError(f"task {task!r}: VolumeMounts is not a list")
                return mounts
    return None


class AllocVolumeLookup:
    """``lookup(device_ids)`` -> ``VolumeVerdict``; thread-safe."""

    def __init__(
        self,
        client: NomadClient,
        node_id: str = "",
        *,
        attempts: int = LOOKUP_ATTEMPTS,
        retry_delay: float = LOOKUP_RETRY_DELAY,
        sleep: Callable[[float], None] = time.sleep,
        backoff: float = TIMEOUT_BACKOFF,
        clock: Callable[[], float] = time.monotonic,
        recent: Callable[[], AllocPage | None] = lambda: None,
    ) -> None:
        self._client = client
        self._recent = recent
        self._node_id = node_id
        self._attempts = max(1, attempts)
        self._retry_delay = retry_delay
        self._sleep = sleep
        self._backoff = backoff
        self._clock = clock
        self._lock = threading.Lock()
        self._timed_out: tuple[float, str] | None = None

    def close(self) -> None:
        self._client.close()

    def lookup(self, device_ids: Sequence[str]) -> VolumeVerdict:
        down = self._timed_out
        if down is not None and (age := self._clock() - down[0]) < self._backoff:
            return VolumeVerdict(
                False,
                False,
                f"the Nomad API could not be asked ({down[1]}, {age:.1f} s ago; "
                f"asked again {self._backoff:g} s after a timeout)",
            )
        try:
            node_id = self._node()
            for attempt in range(self._attempts):
                verdict = self._once(node_id, device_ids)
                if verdict is not None:
                    return verdict
                if attempt + 1 < self._attempts:
                    self._sleep(self._retry_delay)
        except NomadApiError as exc:
            if exc.kind == "timeout":
                self._timed_out = (self._clock(), str(exc))
            return VolumeVerdict(False, False, f"the Nomad API could not be asked ({exc})")
        except ValueError as exc:
            return VolumeVerdict(False, False, f"the Nomad API answer has an unexpected shape ({exc})")
        return VolumeVerdict(
            False, False, f"no live allocation on node {node_id} holds device IDs {', '.join(device_ids)} yet"
        )

    def _node(self) -> str:
        with self._lock:
            if not self._node_id:
                self._node_id = self._client.node_id()
            return self._node_id

    def _once(self, node_id: str, device_ids: Sequence[str]) -> VolumeVerdict | None:
        allocs = self._recently_placed(device_ids)
        if allocs is None:
            body = self._client.get(f"/v1/node/{quote(node_id, safe='')}/allocations")
            if not isinstance(body, list):
                raise ValueError("node allocations answer is not a list")
            allocs = body
        candidates = find_candidates(allocs, device_ids)
        if not candidates:
            return None
        answers: dict[bool, list[str]] = {}
        for cand in candidates:
            mounts = task_volume_mounts(cand.alloc, cand.task)
            if mounts is None:  # the list form left the job out: read the allocation itself
                full = self._client.get(f"/v1/allocation/{quote(cand.alloc_id, safe='')}")
                mounts = task_volume_mounts(full, cand.task) if isinstance(full, dict) else None
            if mounts is None:
                return VolumeVerdict(
                    False, False, f"allocation {cand.alloc_id}: task {cand.task!r} is not in the allocation's job"
                )
            answers.setdefault(bool(mounts), []).append(f"{cand.alloc_id}/{cand.task}")
        if len(answers) > 1:
            return VolumeVerdict(
                False,
                False,
                f"allocations disagree: {', '.join(answers[True])} mount volumes, {', '.join(answers[False])} do not",
            )
        has = next(iter(answers))
        return VolumeVerdict(True, has, f"task {', '.join(answers[has])} {'has' if has else 'has no'} volume_mount")

    def _recently_placed(self, device_ids: Sequence[str]) -> list[Any] | None:
        """The live allocations of the last page holding exactly ``device_ids``, as Nomad answers now;
        None when there are none, or one has ended or is not desired to run."""
        page = self._recent()
        wanted = frozenset(device_ids)
        named = [a.id for a in page.allocs if a.live and wanted in (ids for _, ids in a.task_devices)] if page else []
        fresh = []
        for alloc_id in named:
            try:
                alloc = self._client.get(f"/v1/allocation/{quote(alloc_id, safe='')}")
            except NomadApiError as exc:
                if exc.status == 404:
                    return None
                raise
            live = isinstance(alloc, dict) and alloc.get("ClientStatus") not in TERMINAL
            if not live or alloc.get("DesiredStatus", "run") != "run":
                return None
            fresh.append(alloc)
        return fresh or None
