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

Everything XDM returns passes the Reserve content policy (``ReservePolicy``,
docs/reserve.md "What XDM may hand a task") before it reaches a task: a mount
becomes a host bind mount, a device spec opens a host device, an env value goes
through Nomad's ``${...}`` interpolation. A grant that fails raises
``GrantRejected`` (its ``rule`` a bounded metric label) and is released.
"""

from __future__ import annotations

import logging
import os
import posixpath
import re
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
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
from nomad_plugin.model.grant import DeviceAsk, DeviceNode, Grant, GrantRequest, MountSpec
from nomad_plugin.model.instances import Catalog, GroupKey, Instance, InstanceGroup, Kind
from nomad_plugin.nomad.catalog import MIG_SLICE_SIZES, MIG_UNITS
from nomad_plugin.reconcile.alloc_volumes import VolumeVerdict
from nomad_plugin.reconcile.reconciler import LifecycleCounters
from nomad_plugin.util.text import SYSTEM_DIRS

log = logging.getLogger(__name__)

#: Runs a function once the reply has gone out (gRPC's ``context.add_callback``); False if it cannot.
AfterReply = Callable[[Callable[[], None]], bool]

#: Crash-test hook points, in order (see tests/reserve/crash_driver.py).
STEPS = ("before-allocate", "after-allocate", "after-journal")


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
        include_mounts: bool = False,
        mount_policy: MountPolicy | None = None,
        step_hook: Callable[[str], None] | None = None,
        path_exists: Callable[[str], bool] = os.path.exists,
    ) -> None:
        self.backend = backend
        self.catalog_source = catalog_source
        self.journal = journal
        self.config = config
        self.counters = counters or LifecycleCounters()
        self._on_changed = on_grants_changed
        # Without a policy: include_mounts=True passes XDM's mounts always, else never.
        self._mounts = mount_policy or MountPolicy("always" if include_mounts else "never")
        self._policy = ReservePolicy(frozenset(config.xdm_env_allow), config.xdm_mount_allow, config.data_dir)
        self._step = step_hook or (lambda _step: None)
        self._path_exists = path_exists
        self._locks_guard = threading.Lock()
        self._card_locks: dict[str, threading.Lock] = {}
        self.counters.journal_size = len(journal)
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
        self._step("before-allocate")
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
        self._step("after-allocate")
        entry = replace(entry, settle_until=0.0)  # XDM answered: from here a release is final
        try:
            spec = build_container(
                grant,
                plan.instances,
                plan.group,
                include_mounts=True,  # filtered by the mount policy after the grant is journalled
                path_exists=self._path_exists,
                policy=self._policy,
            )
            granted = replace(entry.with_state(EntryState.GRANTED, grant.devices), settle_until=0.0)
            self._put(granted)
        except BaseException as exc:
            self._abandon(entry, f"verification failed: {exc}")
            raise
        self._step("after-journal")
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
        """Route (c), at startup before serving: release entries left mid-Reserve or mid-release."""
        released = 0
        for entry in self.journal.entries():
            if entry.state is EntryState.GRANTED:
                continue
            reason = (
                "left by a plugin that stopped mid-Reserve"
                if entry.state is EntryState.INTENT
                else "retry of an earlier failed release"
            )
            if self.release_grant(entry.grant_id, reason):
                released += 1
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


# --- the ContainerReservation ------------------------------------------------------------

ENV_GRANT_ID = "LINGJUN_GRANT_ID"
ENV_DEVICE_IDS = "LINGJUN_DEVICE_IDS"
ENV_MINORS = "LINGJUN_DEVICE_MINORS"
ENV_CARD_UUIDS = "LINGJUN_CARD_UUIDS"
ENV_MODE = "LINGJUN_MODE"
# LINGJUN_MODE uses the config's names for the modes: a share of a card is "tdm", as in default_mode.
MODE_NAMES = {Kind.SHARE: "tdm"}
ENV_CORE = "LINGJUN_CORE_LIMIT_PERCENT"
ENV_MEMORY = "LINGJUN_MEMORY_LIMIT_GIB"
ENV_SLICES = "LINGJUN_MIG_SLICES"
ENV_NVIDIA_VISIBLE = "NVIDIA_VISIBLE_DEVICES"
ENV_PPU_VISIBLE = "PPU_VISIBLE_DEVICES"
#: Prefix the plugin reserves for itself: XDM may not override these.
OWN_PREFIX = "LINGJUN_"

_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
#: Annotation keys carried over as env: DNS-ish names with an optional prefix.
_ANNOTATION_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,252}\Z")
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # control chars except TAB
_PERMISSIONS = re.compile(r"(?!.*(.).*\1)[rwm]{1,3}\Z")

#: Host device nodes derived when XDM returns none (only those that exist are used).
NVIDIA_CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
PPU_NODES = ("/dev/alixpu", "/dev/alixpu_ctl")


#: ``GrantRejected.rule`` values (the label of ``lingjun_plugin_reserve_policy_violations_total``).
RULES = ("path", "size", "device", "env", "visibility", "mount")


class GrantRejected(PluginError):
    """The backend's grant cannot be handed to a task safely (and is released); ``rule`` says which rule."""

    def __init__(self, message: str, rule: str = "path") -> None:
        super().__init__(message)
        self.rule = rule if rule in RULES else "path"


# --- the Reserve content policy -------------------------------------------------------------
#: Bounds on one grant, above what a 16-card MIG grant needs: execve fails with E2BIG past 128 KiB
#: for one string and past the stack limit / 4 for all of them.
MAX_ENV = 256
MAX_ENV_VALUE = 32 * 1024
MAX_ENV_TOTAL = 128 * 1024
MAX_DEVICE_NODES = 512
MAX_MOUNTS = 256
MAX_PATH = 4096
#: Env names a grant may never set, unless ``xdm_env_allow`` names them.
PROTECTED_ENV = re.compile(r"(?:NOMAD_.*|PATH|LD_.*)\Z")
#: Env variables that decide which cards a container runtime exposes: exactly the granted cards.
VISIBILITY_ENV = frozenset(
    {"NVIDIA_VISIBLE_DEVICES", "NVIDIA_MIG_CONFIG_DEVICES", "NVIDIA_MIG_MONITOR_DEVICES", "PPU_VISIBLE_DEVICES"}
)
#: Host trees (secrets, sockets, others' state, devices) a mount may not show nor hold, unless ``xdm_mount_allow``.
PROTECTED_HOST_TREES = ("/etc", "/root", "/home", "/boot", "/proc", "/sys", "/dev", "/run", "/var/run", "/var/lib")
#: Task trees a mount may not land in (the runtime writes hosts and resolv.conf to /etc).
PROTECTED_TASK_TREES = ("/proc", "/sys", "/dev", "/etc", "/alloc", "/local", "/secrets")
#: Per accelerator family: (node pattern, whether its number must be a granted minor, offset from the minor).
_NODE_FAMILIES: dict[str, tuple[tuple[re.Pattern[str], bool, int], ...]] = {
    "nvidia": (
        (re.compile(r"/dev/nvidia(\d+)\Z"), True, 0),
        (re.compile(r"/dev/nvidia(?:ctl|-uvm|-uvm-tools|-modeset)\Z"), False, 0),
        (re.compile(r"/dev/nvidia-caps/nvidia-cap(\d+)\Z"), False, 0),  # MIG capabilities
    ),
    "amd": (
        (re.compile(r"/dev/kfd\Z"), False, 0),
        (re.compile(r"/dev/dri/card(\d+)\Z"), True, 0),
        (re.compile(r"/dev/dri/renderD(\d+)\Z"), True, 128),
    ),
    "ppu": (
        (re.compile(r"/dev/alixpu(?:_ctl)?\Z"), False, 0),
        (re.compile(r"/dev/alixpu(\d+)\Z"), True, 0),
    ),
}


@dataclass(frozen=True)
class ReservePolicy:
    """The operator's exceptions to the content policy (``xdm_env_allow``, ``xdm_mount_allow``)."""

    env_allow: frozenset[str] = frozenset()
    mount_allow: tuple[str, ...] = ()
    #: The plugin's own directory: never shown to a task.
    data_dir: str = ""

    def mount_allowed(self, host_path: str) -> bool:
        return any(_under(host_path, allowed) for allowed in self.mount_allow)


def _under(path: str, tree: str) -> bool:
    return path == tree or tree == "/" or path.startswith(tree.rstrip("/") + "/")


def _shown(value: str, limit: int = 80) -> str:
    """A value as an error repeats it: repr (control characters escaped), bounded."""
    text = repr(value[: limit + 1])
    return text if len(value) <= limit else text[:-1] + f"...' ({len(value)} chars)"


def family_of(group: GroupKey) -> str:
    vendor = group.vendor.lower()
    return vendor if vendor in ("nvidia", "amd") else "ppu"


@dataclass(frozen=True)
class ContainerSpec:
    envs: Mapping[str, str]
    mounts: tuple[MountSpec, ...]
    devices: tuple[DeviceNode, ...]

    def to_proto(self) -> device_pb2.ContainerReservation:
        return device_pb2.ContainerReservation(
            envs=dict(self.envs),
            mounts=[
                device_pb2.Mount(task_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
                for m in self.mounts
            ],
            devices=[
                device_pb2.DeviceSpec(task_path=d.container_path, host_path=d.host_path, permissions=d.permissions)
                for d in self.devices
            ],
        )


# --- validation --------------------------------------------------------------
def check_path(path: str, what: str, *, under_dev: bool = False) -> str:
    """Return ``path`` if it is absolute, normalised and clean, else raise ``GrantRejected``."""
    if not isinstance(path, str) or not path:
        raise GrantRejected(f"XDM returned an empty {what}")
    if len(path) > MAX_PATH:
        raise GrantRejected(f"XDM returned a {what} of {len(path)} characters (at most {MAX_PATH})", "size")
    if "\x00" in path or _CONTROL.search(path) or "\t" in path:
        raise GrantRejected(f"XDM returned a {what} with a control character: {_shown(path)}")
    if not path.startswith("/") or path.startswith("//"):
        raise GrantRejected(f"XDM returned a {what} that is not a plain absolute path: {_shown(path)}")
    if ".." in path.split("/"):
        raise GrantRejected(f"XDM returned a {what} containing '..': {_shown(path)}")
    if posixpath.normpath(path) != path:
        raise GrantRejected(f"XDM returned a {what} that is not normalised: {_shown(path)}")
    if under_dev and not path.startswith("/dev/"):
        raise GrantRejected(f"XDM returned a {what} outside /dev/: {_shown(path)}")
    return path


def check_env(key: str, value: str, source: str) -> None:
    if not _ENV_KEY.match(key):
        raise GrantRejected(
            f"{source} env name {_shown(key)} is not a valid variable name ([A-Za-z_][A-Za-z0-9_]*)", "env"
        )
    if _CONTROL.search(value):
        raise GrantRejected(f"{source} env {key} has a control character (NUL or newline) in its value", "env")
    if "${" in value:
        raise GrantRejected(f"{source} env {key}={_shown(value)} contains '${{', which Nomad would interpolate", "env")


def annotation_env_name(key: str) -> str | None:
    """``xdm.amp.com/allocation-id`` -> ``XDM_AMP_COM_ALLOCATION_ID``; None if the key is not allowed."""
    if not _ANNOTATION_KEY.match(key):
        return None
    name = re.sub(r"[^A-Z0-9]", "_", key.upper())
    return name if _ENV_KEY.match(name) else None


def _check_sizes(grant: Grant) -> None:
    """Counts first, so that a grant of 10,000 specs is refused before it is walked."""
    counts = (
        ("device specs", len(grant.device_nodes), MAX_DEVICE_NODES),
        ("mounts", len(grant.mounts), MAX_MOUNTS),
        ("env variables", len(grant.envs), MAX_ENV),
        ("annotations", len(grant.annotations), MAX_ENV),
    )
    for what, count, limit in counts:
        if count > limit:
            raise GrantRejected(f"XDM's grant {grant.grant_id} carries {count} {what} (at most {limit})", "size")


def _checked_mounts(grant: Grant, policy: ReservePolicy) -> tuple[MountSpec, ...]:
    out = []
    for m in grant.mounts:
        host = check_path(m.host_path, "mount host path")
        task = check_path(m.container_path, "mount container path")
        if host == "/":
            raise GrantRejected("XDM returned a mount of the host root '/'", "mount")
        allowed = policy.mount_allowed(host)
        if not m.read_only and not allowed:
            raise GrantRejected(
                f"XDM returned a read-write mount of {_shown(host)}; mounts are read-only unless "
                "xdm_mount_allow names the host path",
                "mount",
            )
        if not allowed:
            for tree in (*PROTECTED_HOST_TREES, *((policy.data_dir,) if policy.data_dir else ())):
                if _under(host, tree) or _under(tree, host):
                    raise GrantRejected(
                        f"XDM returned a mount of host path {_shown(host)}, which "
                        f"{'lies in' if _under(host, tree) else 'holds'} {tree}; allowed only with xdm_mount_allow",
                        "mount",
                    )
        if task in SYSTEM_DIRS or any(_under(d, task) for d in SYSTEM_DIRS if d != "/"):
            raise GrantRejected(
                f"XDM returned a mount onto {_shown(task)} in the task, which would cover a system directory", "mount"
            )
        for tree in PROTECTED_TASK_TREES:
            if _under(task, tree):
                raise GrantRejected(f"XDM returned a mount onto {_shown(task)} in the task, inside {tree}", "mount")
        out.append(m)
    return tuple(out)


def _checked_nodes(grant: Grant, group: GroupKey) -> tuple[DeviceNode, ...]:
    family = _NODE_FAMILIES[family_of(group)]
    minors = {d.minor for d in grant.devices}
    for d in grant.device_nodes:
        check_path(d.host_path, "device host path", under_dev=True)
        check_path(d.container_path, "device container path", under_dev=True)
        if not _PERMISSIONS.match(d.permissions):
            raise GrantRejected(f"XDM returned device permissions {_shown(d.permissions)} (allowed: r, w, m)", "device")
        if not _node_of(d.host_path, family, minors):
            raise GrantRejected(
                f"XDM returned device node {_shown(d.host_path)}, which is not a {family_of(group)} device node "
                f"of the granted card(s) {sorted(minors)}",
                "device",
            )
        if not _node_of(d.container_path, family, None):
            raise GrantRejected(
                f"XDM returned device node {_shown(d.host_path)} as {_shown(d.container_path)} in the task, "
                f"which is not a {family_of(group)} device node name",
                "device",
            )
    return grant.device_nodes


def _node_of(path: str, family: tuple[tuple[re.Pattern[str], bool, int], ...], minors: set[int] | None) -> bool:
    """``path`` is a node of ``family``; for a per-card node, of one of ``minors`` (None: any card)."""
    for pattern, per_card, offset in family:
        match = pattern.match(path)
        if match is None:
            continue
        if not per_card or minors is None:
            return True
        return int(match.group(1)) - offset in minors
    return False


def _check_env_policy(key: str, value: str, source: str, policy: ReservePolicy) -> None:
    if len(value) > MAX_ENV_VALUE:
        raise GrantRejected(f"{source} env {key} is {len(value)} characters long (at most {MAX_ENV_VALUE})", "size")
    if PROTECTED_ENV.match(key) and key not in policy.env_allow:
        raise GrantRejected(
            f"{source} env {key} would override the task's own {key} (NOMAD_*, PATH and LD_* are protected; "
            "xdm_env_allow lists the names XDM may set)",
            "env",
        )


def _check_visibility(envs: Mapping[str, str], grant: Grant, instances: Sequence[Instance]) -> None:
    """Each visibility variable names exactly the granted cards (by card UUID, MIG UUID or minor)."""
    cards: dict[str, int] = {}  # name -> minor
    for d in grant.devices:
        for name in (d.uuid or _uuid_of(d.minor, instances), d.mig_uuid, str(d.minor)):
            if name:
                cards[name] = d.minor
    if not grant.devices:  # an env- or annotation-only grant: the cards asked for
        for inst in instances:
            for name in (inst.card_uuid, inst.mig_uuid, str(inst.minor)):
                if name:
                    cards[name] = inst.minor
    granted = set(cards.values())
    for key in sorted(VISIBILITY_ENV & envs.keys()):
        tokens = [t.strip() for t in envs[key].split(",")]
        unknown = [t for t in tokens if t not in cards]
        if unknown:
            raise GrantRejected(
                f"XDM's env {key}={_shown(envs[key])} names {_shown(', '.join(unknown[:3]))}, which "
                f"{'is' if len(unknown) == 1 else 'are'} not among the granted card(s) {sorted(granted)}",
                "visibility",
            )
        named = {cards[t] for t in tokens}
        if named != granted:
            raise GrantRejected(
                f"XDM's env {key}={_shown(envs[key])} names card(s) {sorted(named)}, not exactly the granted "
                f"card(s) {sorted(granted)}",
                "visibility",
            )


# --- mapping -----------------------------------------------------------------
def build_container(
    grant: Grant,
    instances: Sequence[Instance],
    group: GroupKey,
    *,
    include_mounts: bool = False,
    path_exists: Callable[[str], bool] = os.path.exists,
    policy: ReservePolicy = ReservePolicy(),
) -> ContainerSpec:
    """Validate ``grant`` (made for ``instances``, in request order) against the content policy and
    turn it into what Nomad gives the task; mounts are validated always, passed with ``include_mounts``."""
    _check_sizes(grant)
    mounts = _checked_mounts(grant, policy)
    nodes = _checked_nodes(grant, group) or _derived_nodes(grant, group, path_exists)
    envs = _derived_envs(grant, instances, group)
    from_xdm: dict[str, str] = {}
    for key in sorted(grant.annotations):
        name = annotation_env_name(key)
        value = grant.annotations[key]
        if name is None or name.startswith(OWN_PREFIX) or name in envs or name in grant.envs:
            log.warning(
                "grant %s: annotation %s not carried as env (name not allowed or taken)", grant.grant_id, _shown(key)
            )
            continue
        try:
            check_env(name, value, "XDM annotation")
        except GrantRejected as exc:
            log.warning("grant %s: annotation %s not carried as env: %s", grant.grant_id, _shown(key), exc)
            continue
        _check_env_policy(name, value, f"XDM annotation {_shown(key)} as", policy)
        from_xdm[name] = value
    for key, value in grant.envs.items():
        check_env(key, value, "XDM")
        if key.startswith(OWN_PREFIX):
            log.warning("grant %s: XDM env %s ignored (prefix %s is the plugin's)", grant.grant_id, key, OWN_PREFIX)
            continue
        _check_env_policy(key, value, "XDM", policy)
        from_xdm[key] = value
    _check_visibility(from_xdm, grant, instances)
    envs.update(from_xdm)
    envs.update(_own_envs(grant, instances))
    if ENV_NVIDIA_VISIBLE in envs:
        envs[ENV_NVIDIA_VISIBLE] = in_request_order(envs[ENV_NVIDIA_VISIBLE], instances)
    total = sum(len(k) + len(v) + 2 for k, v in envs.items())
    if total > MAX_ENV_TOTAL or len(envs) > MAX_ENV:
        raise GrantRejected(
            f"XDM's grant {grant.grant_id} makes {len(envs)} env variables of {total} bytes in all "
            f"(at most {MAX_ENV} and {MAX_ENV_TOTAL} bytes)",
            "size",
        )
    return ContainerSpec(envs=envs, mounts=mounts if include_mounts else (), devices=nodes)


def in_request_order(visible: str, instances: Sequence[Instance]) -> str:
    """``NVIDIA_VISIBLE_DEVICES`` in the order Nomad asked (CUDA numbers devices so), as
    nomad-device-nvidia joins the IDs, when it lists exactly the requested IDs."""
    ids = [i.id for i in instances]
    listed = [v for v in visible.split(",") if v]
    return ",".join(ids) if sorted(listed) == sorted(ids) else visible


def _is_nvidia(group: GroupKey) -> bool:
    return group.vendor.lower() == "nvidia"


def _derived_envs(grant: Grant, instances: Sequence[Instance], group: GroupKey) -> dict[str, str]:
    """Visible-devices env; XDM's own envs (applied after) override it."""
    if _is_nvidia(group):
        migs = [d.mig_uuid for d in grant.devices if d.mig_uuid]
        visible = migs or _unique(d.uuid or _uuid_of(d.minor, instances) for d in grant.devices)
        return {ENV_NVIDIA_VISIBLE: ",".join(visible)} if visible else {}
    minors = _unique(str(d.minor) for d in grant.devices)
    return {ENV_PPU_VISIBLE: ",".join(minors)} if minors else {}


def _own_envs(grant: Grant, instances: Sequence[Instance]) -> dict[str, str]:
    kinds = {i.kind for i in instances}
    kind = kinds.pop() if len(kinds) == 1 else Kind.WHOLE
    first = grant.devices[0] if grant.devices else None
    on_first = [i for i in instances if first and i.minor == first.minor]
    core = (first.core if first else 0) or min(100, sum(i.core for i in on_first)) or 100
    memory = (first.memory_gib if first else 0) or sum(i.memory_gib for i in on_first)
    slices = (first.slices if first else 0) or sum(max(1, i.slices) for i in on_first)
    if kind in (Kind.MIG, Kind.MIG_INSTANCE) and first and not first.core:
        core = mig_core_percent(slices)
    envs = {
        ENV_GRANT_ID: grant.grant_id,
        ENV_DEVICE_IDS: ",".join(i.id for i in instances),
        ENV_MINORS: ",".join(_unique(str(d.minor) for d in grant.devices)),
        ENV_CARD_UUIDS: ",".join(_unique(d.uuid or _uuid_of(d.minor, instances) for d in grant.devices)),
        ENV_MODE: MODE_NAMES.get(kind, kind.value),
        ENV_CORE: str(core),
        ENV_MEMORY: str(memory),
    }
    if kind in (Kind.MIG, Kind.MIG_INSTANCE) and first:
        envs[ENV_SLICES] = str(slices)
    for key, value in envs.items():
        check_env(key, value, "plugin")
    return envs


def mig_core_percent(slices: int) -> int:
    """A MIG slice's share of the card's compute: ``slices`` of the card's 7, rounded (3 -> 43)."""
    return max(1, min(100, round(slices * 100 / MIG_UNITS)))


def _derived_nodes(grant: Grant, group: GroupKey, path_exists: Callable[[str], bool]) -> tuple[DeviceNode, ...]:
    """Fallback when XDM names no device nodes: the vendor's usual nodes that exist on this host."""
    if _is_nvidia(group):
        paths = [f"/dev/nvidia{d.minor}" for d in grant.devices] + list(NVIDIA_CONTROL_NODES)
    else:
        paths = list(PPU_NODES)
    return tuple(DeviceNode(p, p, "rwm") for p in _unique(paths) if path_exists(p))


def _uuid_of(minor: int, instances: Sequence[Instance]) -> str:
    return next((inst.card_uuid for inst in instances if inst.minor == minor), "")


def _unique(values: Iterable[str]) -> list[str]:
    """The non-empty values, first occurrence first."""
    return list(dict.fromkeys(v for v in values if v))
