"""The seam between the go-plugin transport and the plugin's engines.

``nomad_plugin/nomad/services.py`` (the gRPC servicer) calls only these
methods. SetConfig only validates and stores the config: Nomad's first two
launches (fingerprint, validate) call PluginInfo/ConfigSchema/SetConfig and
are killed, so nothing may start there. The engines start on the first
Fingerprint, Reserve or Stats call, which only the long-lived third launch
makes: backend -> fingerprint engine -> metrics feed -> stats engine, and in
the background the owner lock -> journal -> reserver -> recovery and
reconciliation, so the first fingerprint leaves at once.

One process owns ``data_dir``: the one holding ``plugin.lock``. A plugin
that finds it held (the previous plugin of an agent that was killed, a
second agent pointed at the same ``data_dir``, or for a moment an operator's
``grants release``) serves fingerprints and stats, waits for the lock, and
until it holds it opens no journal, recovers, releases and reconciles
nothing, and answers Reserve (after waiting up to ``OWNER_LOCK_WAIT``) with
UNAVAILABLE naming the holder. The recovery's view of entries left by the
previous process is taken once the lock is held, before any Reserve runs.

Imports of the engines are deferred for the same reason: Nomad launches the
plugin three times at every agent start, and two of them never need them.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

from nomad_plugin._proto.nomad import device_pb2
from nomad_plugin.config.model import PluginConfig
from nomad_plugin.goplugin.logging import get_logger
from nomad_plugin.model.errors import BackendUnavailable, PluginError, ReservationRejected
from nomad_plugin.model.instances import Catalog
from nomad_plugin.model.metrics import MetricSample

if TYPE_CHECKING:
    from nomad_plugin.journal import JournalEntry
    from nomad_plugin.journal.owner import OwnerLock
    from nomad_plugin.journal.store import Journal
    from nomad_plugin.metrics.plugin import PluginMetrics
    from nomad_plugin.metrics.prometheus import MetricsEndpoint
    from nomad_plugin.model.backend_port import Backend
    from nomad_plugin.model.instances import Kind
    from nomad_plugin.nomad.fingerprint import FingerprintEngine
    from nomad_plugin.nomad.reserve import AfterReply, MountPolicy, Reserver
    from nomad_plugin.reconcile.node_meta import NodeMetaPublisher
    from nomad_plugin.reconcile.nomad_api import AllocPage, AllocView
    from nomad_plugin.reconcile.reconciler import Reconciler
    from nomad_plugin.reconcile.requests import RequestWatcher
    from nomad_plugin.stats.engine import StatsEngine
    from nomad_plugin.stats.feed import MetricsFeed
    from nomad_plugin.stats.layout import GrantInfo
    from nomad_plugin.stats.nvml_extras import NvmlExtrasFeed

log = get_logger(__name__)

HOUSEKEEPING_PERIOD = 5.0
#: Said at start with ``enabled = false``: where this plugin differs from nomad-device-nvidia then.
DISABLED_NOTE = (
    "enabled = false: no device is fingerprinted and Reserve refuses; the Fingerprint stream stays open with no "
    "devices (nomad-device-nvidia ends it, after which Nomad stops the plugin until the agent restarts)"
)
#: How long a Reserve waits for the owner lock (held by an operator command for a moment, or by the
#: previous plugin of a killed agent until it notices and exits) before it is refused.
OWNER_LOCK_WAIT = 10.0
#: The longest pause between two tries of a held owner lock.
OWNER_LOCK_POLL_MAX = 1.0


class JournalUnavailable(BackendUnavailable):
    """No grant can be made durable: the journal cannot be opened, or another process owns ``data_dir``."""

    def __init__(self, message: str) -> None:
        super().__init__(message, kind="journal")


class PluginApp:
    def __init__(self, backend_factory: Callable[[PluginConfig], Backend] | None = None) -> None:
        self.config: PluginConfig | None = None
        self._backend_factory = backend_factory
        self._lock = threading.Lock()
        self._started = False
        self._closed = threading.Event()
        self.backend: Backend | None = None
        self.fingerprint: FingerprintEngine | None = None
        self.reserver: Reserver | None = None
        self.reconciler: Reconciler | None = None
        self.requests: RequestWatcher | None = None
        self.node_meta: NodeMetaPublisher | None = None
        self.owner_lock: OwnerLock | None = None
        self.feed: MetricsFeed | None = None
        self.nvml_extras: NvmlExtrasFeed | None = None
        self.stats_engine: StatsEngine | None = None
        self.metrics: PluginMetrics | None = None
        self.endpoint: MetricsEndpoint | None = None
        self._close_volume_lookup: Callable[[], None] | None = None
        self._xdm_was_down = False
        self._xdm_ever_up = False
        self.journal_error = ""
        self._owner_wait = ""  # why the owner lock is not held yet ("" once held or given up)
        self._owner_settled = threading.Event()  # the reserver exists, or it never will (journal_error)
        self._stale_entries: list[str] = []
        self._sent_catalog: Catalog = Catalog()
        self._threads: list[threading.Thread] = []
        self._heap_settled = False

    # -- configuration -------------------------------------------------------------
    def accept_config(self, msgpack_config: bytes) -> PluginConfig:
        """SetConfig's verdict, the one ``doctor`` gives (``backend_select.accept_config``)."""
        from nomad_plugin.backend_select import accept_config

        return accept_config(msgpack_config)

    def set_config(self, config: PluginConfig) -> None:
        """Store a validated config; idempotent. Never touches XDM (see module docstring)."""
        with self._lock:
            if config == self.config:
                return
            if self._started and self.fingerprint is not None:
                # Nomad sends one config per process; a change after start is
                # applied to what can change live (modes, filters, health policy).
                log.warning("configuration changed after start: sockets, backend and data_dir need a restart")
                self.fingerprint.update_config(config)
            self.config = config

    # -- startup ---------------------------------------------------------------------
    def _ensure_started(self) -> None:
        with self._lock:
            if self._started or self._closed.is_set():
                return
            self._started = True
            config = self.config or PluginConfig()
            self.config = config
            self._start(config)

    def _start(self, config: PluginConfig) -> None:
        from nomad_plugin.backend_select import select_backend
        from nomad_plugin.metrics.plugin import PluginMetrics
        from nomad_plugin.nomad.fingerprint import FingerprintEngine
        from nomad_plugin.stats.engine import StatsEngine
        from nomad_plugin.stats.feed import MetricsFeed
        from nomad_plugin.stats.grants import GrantTable
        from nomad_plugin.stats.layout import GrantLookup

        if not config.enabled:
            log.warning(DISABLED_NOTE)
        backend = (self._backend_factory or select_backend)(config)
        self.backend = backend
        self.metrics = PluginMetrics.for_config(config)

        def grants_view() -> Mapping[str, frozenset[Kind]]:
            reserver = self.reserver
            return reserver.active_kinds() if reserver is not None else {}

        fingerprint = FingerprintEngine(backend, config, grants_view=grants_view)
        self.fingerprint = fingerprint
        backend.subscribe(self._on_inventory)
        self._start_node_meta(config, backend)
        backend.start()
        fingerprint.start()

        feed = MetricsFeed(backend, interval=1.0, nvml_source=self._nvml_source(config, backend.name))
        self.feed = feed
        feed.start()
        self._start_nvml_extras(config, backend.name, feed)
        grant_of: GrantLookup = GrantTable(self._grants_generation, self._grant_of)
        self.stats_engine = StatsEngine(feed.cache, self._stats_catalog, backend.inventory, grant_of)
        self._start_endpoint(config)
        self._spawn("lifecycle", self._lifecycle_startup)
        self._spawn("housekeeping", self._housekeeping)

    def _start_node_meta(self, config: PluginConfig, backend: Backend) -> None:
        """``node_meta``: the topology as Nomad dynamic node metadata (reconcile/node_meta.py)."""
        if not config.node_meta:
            return
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
        self.node_meta = publisher
        publisher.start()

    def _start_nvml_extras(self, config: PluginConfig, backend_name: str, feed: MetricsFeed) -> None:
        """On XDM nodes with NVML: the official stats XDM lacks (encoder, decoder, BAR1, ECC by location)."""
        from nomad_plugin.backend_select import _nvml_usable

        if backend_name != "xdm" or not config.nvml_enrich or not config.enabled or not _nvml_usable():
            return
        from nomad_plugin.stats.nvml_extras import NvmlExtrasFeed

        self.nvml_extras = NvmlExtrasFeed(feed.cache)
        self.nvml_extras.start()

    def _mount_policy(self, config: PluginConfig) -> MountPolicy:
        """``container_mounts``; "auto" asks the Nomad API which task is starting (docs/reserve.md)."""
        from nomad_plugin.nomad.reserve import MountPolicy
        from nomad_plugin.reconcile.alloc_volumes import AllocVolumeLookup
        from nomad_plugin.reconcile.nomad_api import NomadApiSettings, NomadClient

        mode = "always" if config.xdm_mounts else config.container_mounts
        metrics = self.metrics
        observe = (lambda d: metrics.mount_decision(d.outcome)) if metrics is not None else None
        if mode != "auto":
            return MountPolicy(mode, observe=observe)
        lookup = AllocVolumeLookup(
            NomadClient(NomadApiSettings.from_config(config)), config.nomad_node_id, view=self._allocs_view
        )
        policy = MountPolicy(mode, lookup.lookup, observe)

        def close() -> None:
            policy.close()  # questions not started yet are dropped
            lookup.close()  # and one under way ends with its HTTP client

        self._close_volume_lookup = close
        return policy

    def _allocs_view(self) -> AllocPage | None:
        """The node's allocations as the reconciler last saw them (None before its first answer)."""
        reconciler = self.reconciler
        return reconciler.last_page if reconciler is not None else None

    def _grants_generation(self) -> int:
        reserver = self.reserver
        return reserver.journal.generation if reserver is not None else -2

    def _take_ownership(self, config: PluginConfig) -> Journal | None:
        """Wait for ``plugin.lock`` (as long as it takes, or until close), then open the journal."""
        from nomad_plugin.journal.owner import OwnerLock
        from nomad_plugin.journal.store import Journal

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
            self.owner_lock = lock
            if self._owner_wait:
                log.info(
                    "took %s after %.1fs; the grant journal is this plugin's now",
                    lock.path,
                    time.monotonic() - waited_since,
                )
            self._owner_wait = ""
            return Journal(config.data_dir, background_compaction=True)  # no compaction inside a Reserve
        except (OSError, PluginError, ValueError) as exc:
            self._owner_wait = ""
            self.journal_error = f"grant journal in data_dir {config.data_dir!r} cannot be used: {exc}"
            log.error("%s; Reserve will refuse until this is fixed", self.journal_error)
            return None

    def _open_reserver(self, config: PluginConfig) -> Reserver | None:
        """Own ``data_dir``, open the journal and build the Reserver (None: closed, or the journal is unusable)."""
        from nomad_plugin.nomad.reserve import Reserver

        journal = self._take_ownership(config)
        fingerprint = self.fingerprint
        if journal is None or fingerprint is None:
            return None
        # Entries a previous process left mid-Reserve or mid-release, taken
        # before any new Reserve can add its own in-flight entry.
        self._stale_entries = [e.grant_id for e in journal.entries() if e.state.value != "granted"]
        reserver = Reserver(
            self.backend,  # type: ignore[arg-type]  # set by _start before this thread runs
            fingerprint.catalog,
            journal,
            config,
            fingerprint.notify_grants_changed,
            mount_policy=self._mount_policy(config),
        )
        with self._lock:
            if self._closed.is_set():
                journal.close()
                return None
            self.reserver = reserver
        fingerprint.notify_grants_changed()  # the journal's grants mark their cards from now on
        return reserver

    @staticmethod
    def _nvml_source(config: PluginConfig, backend_name: str) -> Callable[[], Sequence[MetricSample]] | None:
        """NVML readings as the stats fallback when XDM has no exporter (XDM backend only)."""
        if backend_name != "xdm":
            return None
        from nomad_plugin.backend_select import _nvml_usable

        if not _nvml_usable():
            return None
        from nomad_plugin.nvml.backend import NvmlBackend

        nvml = NvmlBackend(config)
        return nvml.metrics_snapshot

    def _start_endpoint(self, config: PluginConfig) -> None:
        if config.metrics_port == 0 or self.metrics is None or self.feed is None or self.backend is None:
            return
        from nomad_plugin.metrics.prometheus import start_endpoint

        try:
            feed = self.feed
            self.endpoint = start_endpoint(
                config, self.metrics, feed.cache, self.backend.inventory, source=lambda: feed.source
            )
        except OSError as exc:
            log.error("Prometheus endpoint on %s:%d could not start: %s", config.metrics_bind, config.metrics_port, exc)

    def _lifecycle_startup(self) -> None:
        """Own data_dir, then route (c): settle the journal left by the previous process, then reconcile with Nomad."""
        config = self.config
        if config is None or self._closed.is_set():
            self._owner_settled.set()
            return
        try:
            reserver = self._open_reserver(config)
        finally:
            self._owner_settled.set()
        if reserver is None or self._closed.is_set():
            return
        try:
            reserver.release_lost_grants()
            released = sum(
                1 for gid in self._stale_entries if reserver.release_grant(gid, "left by the previous plugin process")
            )
            reserver.counters.inc("grants_released_at_startup", released)
            if released:
                log.info("startup: released %d grant(s) left by the previous plugin process", released)
        except Exception:
            log.exception("startup journal recovery failed; the reconciler will retry")
        from nomad_plugin.reconcile.nomad_api import NomadApiSettings, NomadClient
        from nomad_plugin.reconcile.reconciler import Reconciler

        client = NomadClient(NomadApiSettings.from_config(config)) if config.reconcile else None
        fingerprint = self.fingerprint
        assert fingerprint is not None
        from nomad_plugin.reconcile.state import state_path

        reconciler = Reconciler(
            reserver,
            client,
            fingerprint.catalog,
            grace=config.release_grace_period,
            node_id=config.nomad_node_id,
            state_path=state_path(config.data_dir),
        )
        with self._lock:
            if self._closed.is_set():
                if client is not None:
                    client.close()
                return
            self.reconciler = reconciler
        reconciler.start()
        self._start_requests(reserver, config, reconciler)

    def _start_requests(self, reserver: Reserver, config: PluginConfig, reconciler: Reconciler) -> None:
        """Operator `grants release` requests while the plugin runs (reconcile/requests.py)."""
        from nomad_plugin.reconcile.requests import RequestWatcher

        def live_holder(entry: JournalEntry) -> AllocView | None:
            page = reconciler.last_page
            if page is None:
                return None
            ids = set(entry.device_ids)
            return next((a for a in page.allocs if a.live and a.device_ids & ids), None)

        watcher = RequestWatcher(reserver, config.data_dir, live_holder)
        with self._lock:
            if self._closed.is_set():
                return
            self.requests = watcher
        try:
            watcher.start()
        except OSError as exc:
            log.error("operator requests directory cannot be used: %s", exc)

    def _housekeeping(self) -> None:
        """Mirror lifecycle counters into the Prometheus metrics every few seconds."""
        seen: dict[str, int] = {}
        while not self._closed.wait(HOUSEKEEPING_PERIOD):
            metrics, reserver = self.metrics, self.reserver
            if metrics is None or reserver is None or not metrics.enabled:
                continue
            snap = reserver.counters.snapshot()
            metrics.journal_size(snap["journal_size"])
            metrics.nomad_view(bool(snap["view_incomplete"]), snap["unverifiable_grants"])
            for _ in range(snap["grants_released_by_reconcile"] - seen.get("released", 0)):
                metrics.grant_released_by_reconcile()
            for _ in range(snap["leaked_grants_found"] - seen.get("leaked", 0)):
                metrics.leaked_grant_found()
            metrics.reconcile_errors(snap["nomad_api_errors"] - seen.get("api_errors", 0))
            seen["released"] = snap["grants_released_by_reconcile"]
            seen["leaked"] = snap["leaked_grants_found"]
            seen["api_errors"] = snap["nomad_api_errors"]

    def _on_inventory(self, inventory: object) -> None:
        metrics = self.metrics
        if metrics is None:
            return
        reachable = bool(getattr(inventory, "reachable", False))
        reason = str(getattr(inventory, "unreachable_reason", ""))
        if reachable and self._xdm_was_down and self._xdm_ever_up:
            metrics.xdm_reconnect()
        self._xdm_was_down = not reachable
        self._xdm_ever_up = self._xdm_ever_up or reachable
        metrics.xdm_state(reachable)
        # The XDM backend classifies UNIMPLEMENTED and undecodable answers as "unimplemented".
        metrics.xdm_schema_mismatch(not reachable and reason.startswith("unimplemented"))

    def _spawn(self, name: str, target: Callable[[], None]) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _stats_catalog(self) -> Catalog:
        """The catalog of the last fingerprint sent to Nomad (see ``fingerprints``)."""
        return self._sent_catalog

    def _grant_of(self, instance_id: str) -> GrantInfo | None:
        """Which grant holds an instance, for the share and MIG stats layout."""
        from nomad_plugin.stats.layout import GrantInfo

        reserver = self.reserver
        if reserver is None:
            return None
        entry = reserver.holder(instance_id)
        if entry is None:
            return None
        return GrantInfo(
            grant_id=entry.grant_id,
            core_limit_percent=sum(a.core for a in entry.asks),
            memory_limit_gib=sum(a.memory_gib for a in entry.asks),
            slices=sum(a.slices for a in entry.asks),
        )

    # -- the three Nomad calls ------------------------------------------------------------
    def fingerprints(self, cancel: threading.Event) -> Iterator[device_pb2.FingerprintResponse]:
        """Yield the first response at once, then one per change, until cancelled."""
        self._ensure_started()
        engine = self.fingerprint
        if engine is None:  # closed before start
            yield device_pb2.FingerprintResponse()
            cancel.wait()
            return
        for response in engine.responses(cancel):
            catalog = engine.catalog_of(response)
            if self.metrics is not None:
                self.metrics.fingerprint_sent()
            yield response
            if not self._heap_settled and response.device_group:
                self._settle_heap()
            # gRPC resumes the generator once the message went out: from now
            # on Stats may speak of the groups it introduced.
            if catalog is not None:
                self._sent_catalog = catalog

    def _settle_heap(self) -> None:
        """Once the first devices are out: move everything built so far out of the cyclic GC's sight.

        Modules, the gRPC server and the first catalog are tens of thousands of
        long-lived objects; each full collection walked them all, and on a big
        node such a pause landed in the middle of a Reserve (tens of ms; issue 14).
        ``gc.freeze`` leaves them to reference counting, which frees them anyway.
        """
        self._heap_settled = True
        gc.collect()
        gc.freeze()

    def reserve(self, device_ids: Sequence[str], after_reply: AfterReply | None = None) -> device_pb2.ReserveResponse:
        if not device_ids:
            return device_pb2.ReserveResponse(container_res=device_pb2.ContainerReservation())
        self._ensure_started()
        if self.config is not None and not self.config.enabled:
            raise ReservationRejected(
                "device is not enabled: the plugin is disabled (enabled = false in its config block) "
                "and reserves nothing"
            )
        started = time.perf_counter()
        reserver = self.reserver
        if reserver is None:
            self._owner_settled.wait(OWNER_LOCK_WAIT)
            reserver = self.reserver
        if reserver is None:
            why = self.journal_error or self._owner_wait or "the plugin is shutting down"
            if self._owner_wait and not self.journal_error:
                why += f"; waited {OWNER_LOCK_WAIT:g}s for it, so this Reserve is refused (nothing was granted)"
            error = JournalUnavailable(why)
            if self.metrics is not None:
                self.metrics.reserve_error(type(error).__name__)
            raise error
        try:
            response = reserver.reserve(device_ids, after_reply)
        except PluginError as exc:
            if self.metrics is not None:
                self.metrics.reserve_error(type(exc).__name__)
                rule = getattr(exc, "rule", None)  # a GrantRejected: the content policy refused XDM's grant
                if isinstance(rule, str):
                    self.metrics.reserve_policy_violation(rule)
            raise
        finally:
            if self.metrics is not None:
                self.metrics.observe_reserve(time.perf_counter() - started)
        return response

    def stats(self, interval: float, cancel: threading.Event) -> Iterator[device_pb2.StatsResponse]:
        """Yield one response per interval from cached data, until cancelled."""
        self._ensure_started()
        engine = self.stats_engine
        if engine is None:
            while not cancel.is_set():
                yield device_pb2.StatsResponse()
                cancel.wait(max(interval, 1.0))
            return
        yield from engine.responses(interval, cancel)

    def stats_bytes(self, interval: float, cancel: threading.Event) -> Iterator[bytes]:
        """``stats`` already serialised: what the gRPC servicer sends (encoded once per tick)."""
        self._ensure_started()
        engine = self.stats_engine
        if engine is None:
            while not cancel.is_set():
                yield b""
                cancel.wait(max(interval, 1.0))
            return
        yield from engine.serialized_responses(interval, cancel)

    def close(self) -> None:
        """Stop engines and backend threads quickly (Nomad SIGKILLs after 2 s)."""
        with self._lock:
            self._closed.set()
        steps: list[tuple[str, Callable[[], None]]] = []
        reconciler, feed, requests = self.reconciler, self.feed, self.requests
        if requests is not None:
            steps.append(("operator requests", lambda: requests.stop(timeout=0.2)))
        if reconciler is not None:
            steps.append(("reconciler", lambda: reconciler.stop(timeout=0.2)))
        publisher = self.node_meta
        if publisher is not None:
            steps.append(("node metadata publisher", lambda: publisher.stop(timeout=0.2)))
        if feed is not None:
            steps.append(("metrics feed", lambda: feed.stop(timeout=0.2)))
        extras = self.nvml_extras
        if extras is not None:
            steps.append(("NVML extras feed", lambda: extras.stop(timeout=0.2)))
        if self.endpoint is not None:
            steps.append(("metrics endpoint", self.endpoint.stop))
        if self.fingerprint is not None:
            steps.append(("fingerprint engine", self.fingerprint.stop))
        if self.backend is not None:
            steps.append(("backend", self.backend.stop))
        if self._close_volume_lookup is not None:
            steps.append(("Nomad API client (mounts)", self._close_volume_lookup))
        reserver = self.reserver
        if reserver is not None:
            steps.append(("journal compactor", lambda: reserver.journal.stop_background(timeout=0.2)))
        owner = self.owner_lock
        if owner is not None:
            steps.append(("owner lock", owner.release))
        for name, stop in steps:
            try:
                stop()
            except Exception:
                log.exception("error while stopping the %s", name)
