"""The composition root: what ``nomad/`` calls, the engines behind it, and the plugin that
``cli/main.py``'s ``serve`` hands to the go-plugin transport (``NomadDevicePlugin``).

Nomad's first two launches only call PluginInfo, ConfigSchema and SetConfig
and are killed, so nothing starts until the first Fingerprint, Reserve or
Stats call builds the ``Engines``. In the background the plugin then takes
``plugin.lock``, builds the ``Owner`` (journal, reserver, reconciler,
operator requests) and releases what the previous process left mid-call.
A plugin that finds the lock held serves fingerprints and stats and answers
Reserve, after ``OWNER_LOCK_WAIT``, with UNAVAILABLE naming the holder.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nomad_plugin._proto.nomad import device_pb2
from nomad_plugin.config.model import PluginConfig
from nomad_plugin.model.errors import BackendUnavailable, PluginError, ReservationRejected
from nomad_plugin.model.instances import Catalog

if TYPE_CHECKING:
    import grpc

    from nomad_plugin.goplugin.serve import Lifecycle
    from nomad_plugin.journal import JournalEntry
    from nomad_plugin.journal.datadir import OwnerLock
    from nomad_plugin.journal.store import Journal
    from nomad_plugin.metrics import PluginMetrics
    from nomad_plugin.metrics.prometheus import MetricsEndpoint
    from nomad_plugin.model.card import Backend, Inventory
    from nomad_plugin.model.instances import Kind
    from nomad_plugin.nomad.fingerprint import FingerprintEngine
    from nomad_plugin.nomad.reserve import AfterReply, MountPolicy, Reserver
    from nomad_plugin.nvml.companion import NvmlCompanion
    from nomad_plugin.reconcile.node_meta import NodeMetaPublisher
    from nomad_plugin.reconcile.nomad_api import AllocPage, AllocView
    from nomad_plugin.reconcile.reconciler import Reconciler
    from nomad_plugin.reconcile.requests import RequestWatcher
    from nomad_plugin.stats.engine import GrantInfo, StatsEngine
    from nomad_plugin.stats.feed import MetricsFeed

log = logging.getLogger(__name__)

HOUSEKEEPING_PERIOD = 5.0
DISABLED_NOTE = (
    "enabled = false: no device is fingerprinted and Reserve refuses; the Fingerprint stream stays open with no "
    "devices (nomad-device-nvidia ends it, after which Nomad stops the plugin until the agent restarts)"
)
#: How long a Reserve waits for the owner lock (an operator command, or the previous plugin of a
#: killed agent until it notices and exits) before it is refused.
OWNER_LOCK_WAIT = 10.0
OWNER_LOCK_POLL_MAX = 1.0


class JournalUnavailable(BackendUnavailable):
    """No grant can be made durable: the journal cannot be opened, or another process owns ``data_dir``."""

    def __init__(self, message: str) -> None:
        super().__init__(message, kind="journal")


@dataclass(frozen=True)
class Engines:
    backend: Backend
    nvml: NvmlCompanion | None  # stopped with the backend
    metrics: PluginMetrics
    fingerprint: FingerprintEngine
    feed: MetricsFeed
    stats: StatsEngine
    node_meta: NodeMetaPublisher | None
    endpoint: MetricsEndpoint | None


@dataclass(frozen=True)
class Owner:
    lock: OwnerLock
    reserver: Reserver
    reconciler: Reconciler
    requests: RequestWatcher
    close_mounts: Callable[[], None] | None  # the Nomad API client of container_mounts = "auto"


class XdmWatch:
    """The backend's reachability as metrics: up, schema mismatch, reconnects."""

    def __init__(self, metrics: PluginMetrics) -> None:
        self._metrics = metrics
        self._was_down = False
        self._ever_up = False

    def __call__(self, inventory: Inventory) -> None:
        reachable = inventory.reachable
        if reachable and self._was_down and self._ever_up:
            self._metrics.xdm_reconnect()
        self._was_down = not reachable
        self._ever_up = self._ever_up or reachable
        self._metrics.xdm_state(reachable)
        # The XDM backend classifies UNIMPLEMENTED and undecodable answers as "unimplemented".
        self._metrics.xdm_schema_mismatch(not reachable and inventory.unreachable_reason.startswith("unimplemented"))


class PluginApp:
    def __init__(self, backend_factory: Callable[[PluginConfig], Backend] | None = None) -> None:
        self.config: PluginConfig | None = None
        self._backend_factory = backend_factory  # tests: a backend without NVML companion
        self._lock = threading.Lock()
        self._started = False
        self._closed = threading.Event()
        self._engines: Engines | None = None
        self._owner: Owner | None = None
        self.journal_error = ""
        self._owner_wait = ""  # why the owner lock is not held yet ("" once held or given up)
        self._owner_settled = threading.Event()  # the owner record exists, or it never will
        self._sent_catalog = Catalog()  # of the last fingerprint sent: what Stats may speak of
        self._heap_settled = False

    @property
    def reserver(self) -> Reserver | None:
        owner = self._owner
        return owner.reserver if owner is not None else None

    # -- configuration -------------------------------------------------------------
    def accept_config(self, msgpack_config: bytes) -> PluginConfig:
        from nomad_plugin.backend_select import accept_config

        return accept_config(msgpack_config)

    def set_config(self, config: PluginConfig) -> None:
        """Store a validated config; never touches XDM. After start only what can change live applies."""
        with self._lock:
            if config == self.config:
                return
            if self._engines is not None:
                log.warning("configuration changed after start: sockets, backend and data_dir need a restart")
                self._engines.fingerprint.update_config(config)
            self.config = config

    # -- startup ---------------------------------------------------------------------
    def _ensure_started(self) -> Engines | None:
        with self._lock:
            if not self._started and not self._closed.is_set():
                self._started = True
                self.config = self.config or PluginConfig()
                self._engines = self._start(self.config)
                for name, target in (
                    ("lifecycle", self._lifecycle),
                    ("housekeeping", self._housekeeping),
                    ("token check", self._check_token),
                ):
                    threading.Thread(target=target, name=name, daemon=True).start()
            return self._engines

    def _start(self, config: PluginConfig) -> Engines:
        from nomad_plugin.backend_select import Hardware, select_hardware
        from nomad_plugin.metrics import PluginMetrics
        from nomad_plugin.nomad.fingerprint import FingerprintEngine
        from nomad_plugin.stats.engine import StatsEngine
        from nomad_plugin.stats.feed import MetricsFeed

        if not config.enabled:
            log.warning(DISABLED_NOTE)
        hardware = select_hardware(config) if self._backend_factory is None else Hardware(self._backend_factory(config))
        backend, nvml = hardware.backend, hardware.nvml
        metrics = PluginMetrics.for_config(config)
        fingerprint = FingerprintEngine(backend, config, grants_view=self._grants_view)
        backend.subscribe(XdmWatch(metrics))
        node_meta = self._node_meta(config, backend)
        backend.start()
        fingerprint.start()
        feed = MetricsFeed(backend, interval=1.0, nvml_source=nvml.metrics_snapshot if nvml is not None else None)
        feed.start()
        if nvml is not None and config.enabled:
            from nomad_plugin.nvml.companion import EXTRAS_SOURCE

            nvml.start_extras(lambda samples: feed.cache.update(samples, EXTRAS_SOURCE))
        stats = StatsEngine(feed.cache, lambda: self._sent_catalog, backend.inventory, self._grants)
        endpoint = self._endpoint(config, metrics, feed, backend)
        return Engines(backend, nvml, metrics, fingerprint, feed, stats, node_meta, endpoint)

    @staticmethod
    def _node_meta(config: PluginConfig, backend: Backend) -> NodeMetaPublisher | None:
        if not config.node_meta:
            return None
        from nomad_plugin.reconcile.node_meta import MIN_INTERVAL_S, NodeMetaPublisher, state_path
        from nomad_plugin.reconcile.nomad_api import NomadApiSettings, NomadClient

        period = config.inventory_resync_period
        publisher = NodeMetaPublisher(
            NomadClient(NomadApiSettings.from_config(config)),
            backend.inventory,
            config,
            refresh_period=period,
            min_interval=min(MIN_INTERVAL_S, period),  # a short period asks for quick updates
            state_file=state_path(config.data_dir),  # written once the journal has made data_dir
        )
        backend.subscribe(publisher.notify)
        publisher.start()
        return publisher

    @staticmethod
    def _endpoint(
        config: PluginConfig, metrics: PluginMetrics, feed: MetricsFeed, backend: Backend
    ) -> MetricsEndpoint | None:
        if config.metrics_port == 0:
            return None
        from nomad_plugin.metrics.prometheus import start_endpoint

        try:
            return start_endpoint(config, metrics, feed.cache, backend.inventory, source=lambda: feed.source)
        except OSError as exc:
            log.error("Prometheus endpoint on %s:%d could not start: %s", config.metrics_bind, config.metrics_port, exc)
            return None

    def _check_token(self) -> None:
        """One warning when the local agent shows the Nomad ACL token to every token with agent:read."""
        from nomad_plugin.reconcile.nomad_api import NomadApiSettings, warn_if_token_shown

        if self.config is not None:
            warn_if_token_shown(NomadApiSettings.from_config(self.config), self._closed.wait)

    # -- owning data_dir (the lifecycle thread) ------------------------------------------
    def _lifecycle(self) -> None:
        engines, config = self._engines, self.config
        owned = None
        try:
            if engines is not None and config is not None and not self._closed.is_set():
                owned = self._own(config, engines)
        finally:
            self._owner_settled.set()
        if owned is None:
            return
        owner = owned
        try:
            released = owner.reserver.recover()
            if released:
                log.info("startup: released %d grant(s) left by the previous plugin process", released)
        except Exception:
            log.exception("startup journal recovery failed; the reconciler will retry")
        if self._closed.is_set():
            return
        owner.reconciler.start()
        try:
            owner.requests.start()
        except OSError as exc:
            log.error("operator requests directory cannot be used: %s", exc)

    def _own(self, config: PluginConfig, engines: Engines) -> Owner | None:
        """The owner (its reserver knows what a previous process left mid-call); None when closed first or
        the journal is unusable (``journal_error``)."""
        from nomad_plugin.nomad.reserve import Reserver
        from nomad_plugin.reconcile.nomad_api import NomadApiSettings, NomadClient
        from nomad_plugin.reconcile.reconciler import MIN_ROUND_INTERVAL, Reconciler, reconciler_state_path
        from nomad_plugin.reconcile.requests import RequestWatcher

        taken = self._take_ownership(config)
        if taken is None:
            return None
        lock, journal = taken
        fp = engines.fingerprint
        mounts, close_mounts = self._mount_policy(config, engines.metrics)
        reserver = Reserver(engines.backend, fp.catalog, journal, config, fp.notify_grants_changed, mount_policy=mounts)
        client = NomadClient(NomadApiSettings.from_config(config)) if config.reconcile else None
        reconciler = Reconciler(
            reserver,
            client,
            fp.catalog,
            grace=config.release_grace_period,
            node_id=config.nomad_node_id,
            state_path=reconciler_state_path(config.data_dir),
            min_round_interval=MIN_ROUND_INTERVAL,
        )
        requests = RequestWatcher(reserver, config.data_dir, self._live_holder)
        owner = Owner(lock, reserver, reconciler, requests, close_mounts)
        with self._lock:
            closed = self._closed.is_set()
            if not closed:
                self._owner = owner
        if closed:
            _quietly("reconciler", reconciler.stop, 0.2)  # its Nomad API client
            self._release(owner)
            _quietly("journal", journal.close)
            return None
        fp.notify_grants_changed()  # the journal's grants mark their cards from now on
        return owner

    def _take_ownership(self, config: PluginConfig) -> tuple[OwnerLock, Journal] | None:
        """Wait for ``plugin.lock`` (as long as it takes, or until close), then open the journal."""
        from nomad_plugin.journal.datadir import OwnerLock
        from nomad_plugin.journal.store import Journal

        lock: OwnerLock | None = None
        try:
            lock = OwnerLock(config.data_dir)
            delay, waited_since = 0.05, time.monotonic()
            while not lock.acquire(timeout=0.0):
                if not self._owner_wait:
                    holder = lock.holder()
                    self._owner_wait = (
                        f"{lock.path} is held by another process{f' (pid {holder})' if holder else ''}: "
                        "another plugin on this data_dir (the previous plugin of an agent that was killed, or a "
                        "second agent configured with the same data_dir) or an operator's `grants release`"
                    )
                    log.warning(
                        "%s; this plugin serves fingerprints and stats, refuses Reserve, and recovers, releases "
                        "and reconciles nothing until it holds the lock",
                        self._owner_wait,
                    )
                if self._closed.wait(delay):
                    return None
                delay = min(OWNER_LOCK_POLL_MAX, delay * 2)
            if self._owner_wait:
                log.info(
                    "took %s after %.1fs; the grant journal is this plugin's now",
                    lock.path,
                    time.monotonic() - waited_since,
                )
            self._owner_wait = ""
            return lock, Journal(config.data_dir)
        except (OSError, PluginError, ValueError) as exc:
            self._owner_wait = ""
            self.journal_error = f"grant journal in data_dir {config.data_dir!r} cannot be used: {exc}"
            log.error("%s; Reserve will refuse until this is fixed", self.journal_error)
            if lock is not None:
                lock.release()
            return None

    def _mount_policy(
        self, config: PluginConfig, metrics: PluginMetrics
    ) -> tuple[MountPolicy, Callable[[], None] | None]:
        """``container_mounts``; "auto" asks the Nomad API which task is starting (docs/reserve.md)."""
        from nomad_plugin.nomad.reserve import MountPolicy
        from nomad_plugin.reconcile.alloc_volumes import AllocVolumeLookup
        from nomad_plugin.reconcile.nomad_api import NomadApiSettings, NomadClient

        observe = lambda decision: metrics.mount_decision(decision.outcome)  # noqa: E731
        if config.container_mounts != "auto":
            return MountPolicy(config.container_mounts, observe=observe), None
        client = NomadClient(NomadApiSettings.from_config(config))
        lookup = AllocVolumeLookup(client, config.nomad_node_id, recent=self._last_page)
        policy = MountPolicy("auto", lookup.lookup, observe)

        def close() -> None:
            policy.close()  # questions not started yet are dropped
            lookup.close()  # and one under way ends with its HTTP client

        return policy, close

    def _last_page(self) -> AllocPage | None:
        """This node's allocations as the reconciler last saw them."""
        owner = self._owner
        return owner.reconciler.last_page if owner is not None else None

    def _live_holder(self, entry: JournalEntry) -> AllocView | None:
        """The live allocation holding one of ``entry``'s devices, as the reconciler last saw (``grants release``)."""
        page = self._last_page()
        ids = set(entry.device_ids)
        return next((a for a in page.allocs if a.live and a.device_ids & ids), None) if page is not None else None

    # -- what the engines ask of the owner -------------------------------------------------
    def _grants_view(self) -> Mapping[str, frozenset[Kind]]:
        reserver = self.reserver
        return reserver.active_kinds() if reserver is not None else {}

    def _grants(self) -> Mapping[str, GrantInfo]:
        """The journal's grants by instance id, for one stats response (the journal read once)."""
        from nomad_plugin.stats.engine import GrantInfo

        reserver = self.reserver
        held: dict[str, GrantInfo] = {}
        for entry in reserver.entries() if reserver is not None else ():
            info = GrantInfo(
                grant_id=entry.grant_id,
                core_limit_percent=sum(a.core for a in entry.asks),
                memory_limit_gib=sum(a.memory_gib for a in entry.asks),
                slices=sum(a.slices for a in entry.asks),
            )
            for device_id in entry.device_ids:
                held.setdefault(device_id, info)
        return held

    def _housekeeping(self) -> None:
        """Mirror the lifecycle counters into the Prometheus metrics every few seconds."""
        seen: dict[str, int] = {}
        while not self._closed.wait(HOUSEKEEPING_PERIOD):
            engines, reserver = self._engines, self.reserver
            if engines is None or reserver is None or not engines.metrics.enabled:
                continue
            metrics, snap = engines.metrics, reserver.counters.snapshot()
            metrics.journal_size(snap["journal_size"])
            metrics.nomad_view(bool(snap["view_incomplete"]), snap["unverifiable_grants"])
            for _ in range(snap["grants_released_by_reconcile"] - seen.get("grants_released_by_reconcile", 0)):
                metrics.grant_released_by_reconcile()
            for _ in range(snap["leaked_grants_found"] - seen.get("leaked_grants_found", 0)):
                metrics.leaked_grant_found()
            metrics.reconcile_errors(snap["nomad_api_errors"] - seen.get("nomad_api_errors", 0))
            seen = dict(snap)

    # -- the three Nomad calls ------------------------------------------------------------
    def fingerprints(self, cancel: threading.Event) -> Iterator[device_pb2.FingerprintResponse]:
        engines = self._ensure_started()
        if engines is None:  # closed before start
            yield device_pb2.FingerprintResponse()
            cancel.wait()
            return
        for response in engines.fingerprint.responses(cancel):
            catalog = engines.fingerprint.catalog_of(response)
            engines.metrics.fingerprint_sent()
            yield response
            if not self._heap_settled and response.device_group:
                # What is built by now lives as long as the process: keep full collections
                # (in the middle of a Reserve) from walking it again.
                self._heap_settled = True
                gc.collect()
                gc.freeze()
            # gRPC resumes the generator once the message went out: from now on Stats may speak of its groups.
            if catalog is not None:
                self._sent_catalog = catalog

    def reserve(self, device_ids: Sequence[str], after_reply: AfterReply | None = None) -> device_pb2.ReserveResponse:
        if not device_ids:
            return device_pb2.ReserveResponse(container_res=device_pb2.ContainerReservation())
        engines = self._ensure_started()
        if self.config is not None and not self.config.enabled:
            raise ReservationRejected(
                "device is not enabled: the plugin is disabled (enabled = false in its config block) "
                "and reserves nothing"
            )
        metrics = engines.metrics if engines is not None else None
        started = time.perf_counter()
        if self.reserver is None:
            self._owner_settled.wait(OWNER_LOCK_WAIT)
        reserver = self.reserver
        if reserver is None:
            why = self.journal_error or self._owner_wait or "the plugin is shutting down"
            if self._owner_wait and not self.journal_error:
                why += f"; waited {OWNER_LOCK_WAIT:g}s for it, so this Reserve is refused (nothing was granted)"
            error = JournalUnavailable(why)
            if metrics is not None:
                metrics.reserve_error(type(error).__name__)
            raise error
        try:
            return reserver.reserve(device_ids, after_reply)
        except PluginError as exc:
            if metrics is not None:
                metrics.reserve_error(type(exc).__name__)
                rule = getattr(exc, "rule", None)  # a GrantRejected: the content policy refused XDM's grant
                if isinstance(rule, str):
                    metrics.reserve_policy_violation(rule)
            raise
        finally:
            if metrics is not None:
                metrics.observe_reserve(time.perf_counter() - started)

    def stats(self, interval: float, cancel: threading.Event) -> Iterator[device_pb2.StatsResponse]:
        engines = self._ensure_started()
        if engines is None:
            while not cancel.is_set():
                yield device_pb2.StatsResponse()
                cancel.wait(max(interval, 1.0))
            return
        yield from engines.stats.responses(interval, cancel)

    # -- shutdown --------------------------------------------------------------------------
    def close(self) -> None:
        """Stop within go-plugin's 2 s: the owner's threads first (they use the engines), the owner lock last."""
        with self._lock:
            self._closed.set()
            engines, owner = self._engines, self._owner
        if owner is not None:
            _quietly("operator requests", owner.requests.stop, 0.2)
            _quietly("reconciler", owner.reconciler.stop, 0.2)
        if engines is not None:
            if engines.node_meta is not None:
                _quietly("node metadata publisher", engines.node_meta.stop, 0.2)
            _quietly("metrics feed", engines.feed.stop, 0.2)
            if engines.endpoint is not None:
                _quietly("metrics endpoint", engines.endpoint.stop)
            _quietly("fingerprint engine", engines.fingerprint.stop)
            _quietly("backend", engines.backend.stop)
        if owner is not None:
            self._release(owner)

    @staticmethod
    def _release(owner: Owner) -> None:
        if owner.close_mounts is not None:
            _quietly("Nomad API client (mounts)", owner.close_mounts)
        _quietly("owner lock", owner.lock.release)


def _quietly(name: str, stop: Callable[..., object], *args: float) -> None:
    try:
        stop(*args)
    except Exception:
        log.exception("error while stopping the %s", name)


# -- the plugin Nomad talks to: the services over one PluginApp ---------------------------------


class NomadDevicePlugin:
    """Nomad's BasePlugin and DevicePlugin services over one ``PluginApp``: the one place where the
    transport meets Nomad's services and the engines (docs/architecture.md)."""

    def __init__(self) -> None:
        self.app = PluginApp()

    def register(self, server: grpc.Server, lifecycle: Lifecycle) -> None:
        from nomad_plugin._proto.nomad import base_pb2_grpc, device_pb2_grpc
        from nomad_plugin.nomad.services import BaseService, DeviceService

        base_pb2_grpc.add_BasePluginServicer_to_server(BaseService(self.app, apply_logging), server)
        device_pb2_grpc.add_DevicePluginServicer_to_server(DeviceService(self.app, lifecycle), server)

    def close(self) -> None:
        self.app.close()


def apply_logging(config: PluginConfig) -> None:
    """SetConfig's log level and secrets (the token in ``nomad_token_file`` too), for the hclog handler on
    stderr (the agent's log)."""
    from nomad_plugin.config.decode import secret_values
    from nomad_plugin.goplugin import logging as hclog
    from nomad_plugin.util.secret_file import SecretFile

    in_file = SecretFile(config.nomad_token_file, "nomad_token_file").secret if config.nomad_token_file else ""
    hclog.set_secrets([*secret_values(config), in_file])
    hclog.set_level(config.log_level)
