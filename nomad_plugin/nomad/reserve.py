"""Reserve: Nomad device IDs -> one XDM grant -> a ``ContainerReservation``.

Nomad calls Reserve once per task ``device`` block and never says when the task
ends, so every grant is journalled (the intent durable before Allocate, the
grant before Reserve returns) and released by a later Reserve of the same IDs,
the Nomad-API reconciler or startup recovery (``docs/reserve.md``).

A device plugin's non-empty mount list *replaces* the task's host and CSI
volume mounts in Nomad's task runner (docs/reserve.md, "Mounts"), so
``container_mounts`` (``MountPolicy``) decides after XDM's answer whether its
validated mounts reach the task: ``never``, ``always``, or ``auto`` (unless the
task has a ``volume_mount``, asked of the Nomad API; withheld when unknown).

Everything XDM returns passes the content policy of ``nomad/container.py``
(what a task may receive) before it reaches a task; a grant that fails it is
released here.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import partial

from nomad_plugin._proto.nomad import device_pb2
from nomad_plugin.config.model import PluginConfig
from nomad_plugin.journal import EntryState, Journal, JournalEntry
from nomad_plugin.model.card import Backend
from nomad_plugin.model.errors import (
    BackendRefused,
    BackendUnavailable,
    GrantMismatch,
    PluginError,
    ReservationRejected,
    SchemaMismatch,
)
from nomad_plugin.model.grant import DeviceAsk, GrantRequest
from nomad_plugin.model.instances import Catalog, GroupKey, Instance, InstanceGroup, Kind
from nomad_plugin.nomad.catalog import MIG_SLICE_SIZES
from nomad_plugin.nomad.container import ContainerSpec, ReservePolicy, build_container
from nomad_plugin.reconcile.alloc_volumes import VolumeVerdict
from nomad_plugin.reconcile.reconciler import LifecycleCounters

log = logging.getLogger(__name__)

#: Runs a function once the reply has gone out (gRPC's ``context.add_callback``); False if it cannot.
AfterReply = Callable[[Callable[[], None]], bool]


@dataclass(frozen=True)
class RequestPlan:
    """The IDs resolved against the catalog, and the asks they make."""

    group: GroupKey
    kind: Kind
    instances: tuple[Instance, ...]
    asks: tuple[DeviceAsk, ...]

    @property
    def card_uuids(self) -> tuple[str, ...]:
        return tuple(sorted({i.card_uuid for i in self.instances}))


def plan_request(device_ids: Sequence[str], catalog: Catalog) -> RequestPlan:
    """Resolve ``device_ids`` and build one request, or raise ``ReservationRejected``."""
    seen: set[str] = set()
    found: list[tuple[InstanceGroup, Instance]] = []
    unknown: list[str] = []
    for device_id in device_ids:
        if device_id in seen:
            raise ReservationRejected(f"device ID {device_id[:100]!r} appears more than once in one request")
        seen.add(device_id)
        hit = catalog.find(device_id)
        if hit is None:
            unknown.append(device_id)
        else:
            found.append(hit)
    if unknown:
        raise ReservationRejected(
            f"device ID(s) {_some(unknown)} are not in this node's last fingerprint "
            "(the devices changed since the job was placed; Nomad will reschedule it)"
        )
    groups = sorted({str(g.key) for g, _ in found})
    if len(groups) > 1:
        raise ReservationRejected(
            f"device IDs come from several device groups ({_some(groups)}); "
            "one device block is always filled from one group"
        )
    group = found[0][0].key
    instances = tuple(inst for _, inst in found)
    kinds = sorted({i.kind.value for i in instances})
    if len(kinds) > 1:
        raise ReservationRejected(
            f"device group {group} mixes instance kinds ({', '.join(kinds)}); a request must be one kind"
        )
    kind = instances[0].kind
    asks = _asks(kind, instances)
    if len({(a.core, a.memory_gib, a.slices) for a in asks}) > 1:
        amounts = [f"{a.slices} slices" if kind is Kind.MIG else f"{a.core}% compute, {a.memory_gib} GiB" for a in asks]
        per_card = _some([f"card {a.minor}: {amount}" for a, amount in zip(asks, amounts, strict=True)])
        raise ReservationRejected(
            f"heterogeneous request in {group}: {per_card}. XDM grants only equal amounts on every card; "
            "ask for a count that fits on one card, or whole cards"
        )
    return RequestPlan(group=group, kind=kind, instances=instances, asks=asks)


#: How many items an error names before it only counts the rest.
_SHOWN = 5


def _some(items: Sequence[str]) -> str:
    """The first few ``items``, and how many more: an error stays short whatever Nomad sent."""
    shown = ", ".join(item[:100] for item in items[:_SHOWN])
    return shown if len(items) <= _SHOWN else f"{shown} and {len(items) - _SHOWN} more"


def _asks(kind: Kind, instances: tuple[Instance, ...]) -> tuple[DeviceAsk, ...]:
    if kind is Kind.MIG_INSTANCE:  # one ask per existing MIG instance, naming it: its sizes are facts, not asks
        return tuple(
            DeviceAsk(minor=i.minor, slices=i.slices, memory_gib=i.memory_gib, mig_uuid=i.mig_uuid or i.id)
            for i in instances
        )
    by_card: dict[int, list[Instance]] = defaultdict(list)
    for inst in instances:
        by_card[inst.minor].append(inst)
    asks = []
    for minor, insts in sorted(by_card.items()):
        memory = sum(i.memory_gib for i in insts)
        if kind is Kind.WHOLE:
            asks.append(DeviceAsk(minor=minor))
        elif kind is Kind.SHARE:
            asks.append(DeviceAsk(minor=minor, core=min(100, sum(i.core for i in insts)), memory_gib=memory))
        else:
            slices = sum(max(1, i.slices) for i in insts)
            if slices not in MIG_SLICE_SIZES:
                raise ReservationRejected(
                    f"{slices} MIG units on card {insts[0].card_uuid} (minor {minor}): XDM accepts 1, 2, 3, 4 or 7 "
                    "slices per card; use a device count of 1, 2, 3, 4 or 7"
                )
            asks.append(DeviceAsk(minor=minor, slices=slices, memory_gib=memory))
    return tuple(asks)


def describe_limits(kind: str, asks: Sequence[DeviceAsk]) -> str:
    """The limits a grant enforces, per card, in words (audit lines, ``grants``)."""
    if not asks:
        return "none"
    first = asks[0]
    if kind == Kind.WHOLE.value:
        return "whole cards (no limit)"
    if kind == Kind.SHARE.value:
        return f"{first.core}% compute and {first.memory_gib} GiB memory per card"
    if kind == Kind.MIG.value:
        return f"{first.slices} MIG slices and {first.memory_gib} GiB memory per card"
    return ", ".join(f"instance {a.mig_uuid or a.minor}: {a.slices} slices" for a in asks)


def _audit_grant(entry: JournalEntry, plan: RequestPlan, mounts: tuple[int, MountDecision] | None = None) -> None:
    """The one info line per grant made (docs/reserve.md "Audit trail"), with the fate of its
    ``mounts`` (how many, the decision) if it had any."""
    limits = describe_limits(entry.kind, entry.asks)
    fields = {
        "grant_id": entry.grant_id,
        "device_ids": list(entry.device_ids),
        "cards": list(entry.cards),
        "mode": entry.kind,
        "group": str(plan.group),
        "limits": limits,
    }
    message = "grant %s made: devices %s; cards %s; mode %s; limits %s"
    args: list[object] = [entry.grant_id, ", ".join(entry.device_ids), ", ".join(entry.cards), entry.kind, limits]
    if mounts is not None:
        count, decision = mounts
        passed, reason = decision.passed, decision.reason
        if decision.outcome == "unknown":  # withheld because it could not be told
            log.warning(
                "grant %s: XDM's %d mount(s) withheld from the task (%s); its devices and env are passed",
                entry.grant_id,
                count,
                reason,
            )
        message += "; XDM's %d mount(s) " + (
            "passed (%s)" if passed else "withheld (%s); its devices and env are passed"
        )
        args += [count, reason]
        fields["mounts"] = "passed" if passed else "withheld"
        fields["mounts_reason"] = reason
    log.info(message, *args, extra={"fields": fields})


class JournalWriteFailed(PluginError):
    """The durable journal could not be written (e.g. the disk is full)."""


#: Transport failures that show XDM never ran the call, or died with it: no live XDM can commit it later.
XDM_GONE_KINDS = frozenset({"socket-missing", "connection-refused", "permission-denied"})


def outcome_known(exc: BaseException) -> bool:
    """Did XDM answer the Allocate (or never get it), so that it cannot commit the grant later?

    Only XDM's own answer (a refusal, a mismatching grant, an undecodable
    answer) or a daemon that is gone ends the call for sure. Any other error
    (deadline, UNAVAILABLE, a reset stream, a bug) leaves it unknown: XDM may
    commit it later, so the intent stays unresolved (``Reserver._grant``).
    """
    if isinstance(exc, (BackendRefused, GrantMismatch, ReservationRejected, SchemaMismatch)):
        return True
    return isinstance(exc, BackendUnavailable) and exc.kind in XDM_GONE_KINDS


class Reserver:
    """Makes, journals and releases grants; safe for concurrent Reserves."""

    def __init__(
        self,
        backend: Backend,
        catalog_source: Callable[[], Catalog],
        journal: Journal,
        config: PluginConfig,
        on_grants_changed: Callable[[], None] | None = None,
        *,
        counters: LifecycleCounters | None = None,
        mount_policy: MountPolicy | None = None,
        path_exists: Callable[[str], bool] = os.path.exists,
    ) -> None:
        self.backend = backend
        self.catalog_source = catalog_source
        self.journal = journal
        self.config = config
        self.counters = counters or LifecycleCounters()
        self._on_changed = on_grants_changed
        self._mounts = mount_policy or MountPolicy("never")
        self._policy = ReservePolicy(frozenset(config.xdm_env_allow), config.xdm_mount_allow, config.data_dir)
        self._path_exists = path_exists
        self._locks_guard = threading.Lock()
        self._card_locks: dict[str, threading.Lock] = {}
        self.counters.journal_size = len(journal)
        # What a previous process left mid-Reserve or mid-release, read before any Reserve of this one can
        # add its own in-flight entry (``recover``).
        self._left_behind = tuple(e.grant_id for e in journal.entries() if e.state is not EntryState.GRANTED)
        # The card -> granted kinds the fingerprint engine was last told of.
        self._notified_kinds: Mapping[str, frozenset[Kind]] | None = None

    # -- Reserve ------------------------------------------------------------------
    def reserve(self, device_ids: Sequence[str], after_reply: AfterReply | None = None) -> device_pb2.ReserveResponse:
        """Make, journal and describe one grant; its audit line goes out after the reply (``after_reply``)."""
        if not device_ids:
            return device_pb2.ReserveResponse(container_res=device_pb2.ContainerReservation())
        plan = plan_request(list(device_ids), self.catalog_source())
        try:
            with self._cards_locked(plan.card_uuids):
                released = self._release_previous_holders(plan)
                entry, spec = self._grant(str(uuid.uuid4()), plan, released)
        finally:
            self._changed()
        mounts: tuple[int, MountDecision] | None = None
        if spec.mounts:  # a decision only when XDM's grant carries mounts; outside the card locks
            decision = self._mounts.decide([i.id for i in plan.instances])
            mounts = (len(spec.mounts), decision)
            if not decision.passed:
                spec = replace(spec, mounts=())
        audit = partial(_audit_grant, entry, plan, mounts)
        if after_reply is None or not after_reply(audit):
            audit()
        return device_pb2.ReserveResponse(container_res=spec.to_proto())

    def _grant(
        self, grant_id: str, plan: RequestPlan, released: tuple[str, ...] = ()
    ) -> tuple[JournalEntry, ContainerSpec]:
        """Journal the intent (dropping the ``released`` grants in the same write), Allocate, journal the grant.

        XDM may come to hold the intent's grant id until ``settle_until`` (the
        Allocate deadline, and one more for an XDM that goes on with a call its
        client gave up); the entry leaves the journal only after a Release at or
        after that time, so a late commit never leaks. XDM's answer settles it at once.
        """
        now = time.time()
        entry = JournalEntry(
            grant_id=grant_id,
            device_ids=tuple(i.id for i in plan.instances),
            group=str(plan.group),
            kind=plan.kind.value,
            cards=plan.card_uuids,
            asks=plan.asks,
            created_at=now,
            state=EntryState.INTENT,
            settle_until=now + 2 * self.config.xdm_allocate_timeout,
        )
        # Durable before Allocate: after any crash the next plugin releases it (startup recovery).
        self._put(entry, released)
        try:
            grant = self.backend.allocate(GrantRequest(grant_id=grant_id, asks=plan.asks))
        except BaseException as exc:
            if outcome_known(exc):
                entry = replace(entry, settle_until=0.0)  # XDM answered: one release settles it
            else:  # XDM may still commit it: kept releasing (retry_pending) until it cannot
                settle = max(entry.settle_until, time.time() + self.config.xdm_allocate_timeout)
                entry = replace(entry, state=EntryState.RELEASING, settle_until=settle)
                self._put(entry)
            self._abandon(entry, f"Allocate failed: {exc}")
            raise
        entry = replace(entry, settle_until=0.0)  # XDM answered: from here a release is final
        try:
            spec = build_container(
                grant,
                plan.instances,
                plan.group,
                path_exists=self._path_exists,
                policy=self._policy,
            )
            granted = replace(entry.with_state(EntryState.GRANTED, grant.devices), settle_until=0.0)
            self._put(granted)
        except BaseException as exc:
            self._abandon(entry, f"verification failed: {exc}")
            raise
        return entry, spec

    def _release_previous_holders(self, plan: RequestPlan) -> tuple[str, ...]:
        """Route (a): Nomad hands out only free IDs, so an older holder of them has ended.

        Returns the grants XDM no longer holds: they leave the journal with the new intent's write.
        """
        ids = {i.id for i in plan.instances}
        released = []
        for old in [e for e in self.journal.entries() if ids.intersection(e.device_ids)]:
            if self._release_locked(old, "re-reserved: its device IDs were handed to a new allocation", forget=False):
                released.append(old.grant_id)
            self.counters.inc("grants_released_by_reserve")
        return tuple(released)

    def _abandon(self, entry: JournalEntry, why: str) -> None:
        log.warning("grant %s abandoned (%s); releasing it", entry.grant_id, why)
        self._release_locked(entry, why)

    # -- Release --------------------------------------------------------------------
    def release_grant(self, grant_id: str, reason: str) -> bool:
        """Release one journalled grant (idempotent). True when it is gone from the journal."""
        entry = self.journal.get(grant_id)
        if entry is None:
            return True
        try:
            with self._cards_locked(entry.cards):
                current = self.journal.get(grant_id)
                return current is None or self._release_locked(current, reason)
        finally:
            self._changed()

    def _release_locked(self, entry: JournalEntry, reason: str, *, forget: bool = True) -> bool:
        """Release in XDM; True when that is final. ``forget``: also drop the entry from the journal now."""
        try:
            self.backend.release(entry.grant_id)
        except PluginError as exc:
            log.warning("release of grant %s failed (%s); will retry: %s", entry.grant_id, reason, exc)
            if entry.state is not EntryState.RELEASING:
                self._put(entry.with_state(EntryState.RELEASING))
            return False
        if entry.settle_until > time.time():
            # Not yet proof: XDM may still commit it. Retried (retry_pending) until the window closes.
            log.debug("grant %s released for now; kept until XDM can no longer commit it late", entry.grant_id)
            if entry.state is not EntryState.RELEASING:
                self._put(entry.with_state(EntryState.RELEASING))
            return False
        if forget:
            self.journal.remove(entry.grant_id)
            self.counters.journal_size = len(self.journal)
        log.info(
            "grant %s released: %s",
            entry.grant_id,
            reason,
            extra={"fields": {"grant_id": entry.grant_id, "reason": reason, "device_ids": list(entry.device_ids)}},
        )
        return True

    def recover(self) -> int:
        """Route (c), once the journal is owned: release what a previous process left mid-Reserve or
        mid-release, as the journal stood when this reserver was made."""
        released = 0
        for grant_id in self._left_behind:
            entry = self.journal.get(grant_id)
            if entry is None or entry.state is EntryState.GRANTED:
                continue
            reason = (
                "left by a plugin that stopped mid-Reserve"
                if entry.state is EntryState.INTENT
                else "retry of an earlier failed release"
            )
            released += self.release_grant(grant_id, reason)
        self.counters.inc("grants_released_at_startup", released)
        return released

    def retry_pending(self) -> int:
        """Retry releases that failed earlier (XDM was down)."""
        pending = [e for e in self.journal.entries() if e.state is EntryState.RELEASING]
        return sum(1 for e in pending if self.release_grant(e.grant_id, "retry of an earlier failed release"))

    # -- views ------------------------------------------------------------------------
    def entries(self) -> list[JournalEntry]:
        return self.journal.entries()

    def active_kinds(self) -> Mapping[str, frozenset[Kind]]:
        """Card UUID -> kinds of grants held on it (for the fingerprint's conflict marking)."""
        kinds: dict[str, set[Kind]] = {}
        for entry in self.journal.entries():
            for card in entry.cards:
                kinds.setdefault(card, set()).add(Kind(entry.kind))
        return {card: frozenset(found) for card, found in kinds.items()}

    # -- internals --------------------------------------------------------------------

    def _put(self, entry: JournalEntry, remove: tuple[str, ...] = ()) -> None:
        try:
            self.journal.put(entry, remove)
        except OSError as exc:
            state = "no grant was made" if entry.state is EntryState.INTENT else "the grant is being released"
            raise JournalWriteFailed(f"grant journal write failed in {self.journal.dir}: {exc}; {state}") from exc
        self.counters.journal_size = len(self.journal)

    def _changed(self) -> None:
        """Tell the fingerprint engine, unless no card's set of granted kinds changed (all it reads of grants)."""
        if self._on_changed is None:
            return
        kinds = self.active_kinds()
        if kinds == self._notified_kinds:
            return
        self._notified_kinds = kinds
        try:
            self._on_changed()
        except Exception:
            log.exception("on_grants_changed callback failed")

    @contextmanager
    def _cards_locked(self, cards: Sequence[str]) -> Iterator[None]:
        """Hold the locks of ``cards`` in sorted order (no deadlock between Reserves)."""
        with self._locks_guard:
            locks = [self._card_locks.setdefault(c, threading.Lock()) for c in sorted(set(cards))]
        for lock in locks:
            lock.acquire()
        try:
            yield
        finally:
            for lock in reversed(locks):
                lock.release()


MOUNT_MODES = ("auto", "always", "never")


@dataclass(frozen=True)
class MountDecision:
    """``outcome`` is a bounded metric label: passed, volumes, unknown or never."""

    passed: bool
    outcome: str
    reason: str


SHUTTING_DOWN = MountDecision(False, "unknown", "the plugin is shutting down")


class MountPolicy:
    """``container_mounts``: whether XDM's host mounts reach the task (see the module docstring)."""

    def __init__(
        self,
        mode: str,
        lookup: Callable[[Sequence[str]], VolumeVerdict] | None = None,
        observe: Callable[[MountDecision], None] | None = None,
    ) -> None:
        if mode not in MOUNT_MODES:
            raise ValueError(f"container_mounts: {mode!r} is not one of {', '.join(MOUNT_MODES)}")
        self.mode = mode
        self._lookup = lookup
        self._observe = observe
        self._closed = False

    def close(self) -> None:
        """Ask the Nomad API nothing more; a question under way ends with its HTTP client (closed next)."""
        self._closed = True

    def decide(self, device_ids: Sequence[str]) -> MountDecision:
        """The decision for these device IDs (asks the Nomad API in ``auto``), counted by ``observe``."""
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
        if self._closed:
            return SHUTTING_DOWN
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
