"""The latest metric readings (``MetricsCache``) and the thread that keeps them filled (``MetricsFeed``).

Nomad asks for stats at its own interval; XDM pushes (or is polled) at the exporter's. The feed
writes the cache, the Stats stream and the Prometheus collector read it, and neither ever calls XDM.
Each reading keeps the time *we* received it, on a monotonic clock, so one that stopped arriving
shows as stale. Cards are keyed by the device string the sample names (a minor or a UUID; the stats
layout resolves both), grants by the ``allocation_id`` label; the least recently updated readings
go first past ``max_entries``.

The feed prefers, re-evaluated on every resubscription: XDM's ``ExporterDataStream``
(``backend.metrics_stream``), resubscribed after ``Backoff`` (XDM's rule: 1 s, x2, cap 30 s); while
it is down, ``backend.metrics_snapshot`` polled each interval; when both answer "unimplemented" (no
exporter on this node), the NVML source; else nothing, and the stats mark values stale. It never
spins: it blocks in the stream or waits on the stop event, which is also the stream's cancel.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

from nomad_plugin.model.card import Backend
from nomad_plugin.model.errors import BackendUnavailable
from nomad_plugin.model.metrics import ALL_METRIC_NAMES, GRANT_LABEL, MetricSample
from nomad_plugin.util.threads import Backoff, CancelEvent

Clock = Callable[[], float]
DEFAULT_MAX_ENTRIES = 16384
_KNOWN_NAMES = frozenset(ALL_METRIC_NAMES.values())


class Reading(NamedTuple):
    """One cached value; ``received`` is on the cache's clock (the layout makes wall time of it)."""

    value: float
    received: float
    timestamp_ms: int = 0


class MetricsCache:
    """Thread-safe map (scope, key, metric name) -> latest ``Reading``; scope is "card" or "grant"."""

    def __init__(self, clock: Clock = time.monotonic, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        self._clock = clock
        self._max = max_entries
        self._lock = threading.Lock()
        # In update order (an update re-inserts its key last), so the least recently updated come first.
        self._data: dict[tuple[str, str, str], Reading] = {}
        # The known metrics again, by (scope, key): what the layout asks for.
        self._by_key: dict[tuple[str, str], dict[str, Reading]] = {}
        self._source = ""

    def update(self, samples: Iterable[MetricSample], source: str = "") -> int:
        """Store one batch; returns how many samples were kept."""
        now = self._clock()
        kept = 0
        with self._lock:
            for device, metric_id, name, value, timestamp_ms, labels in samples:
                name = name or ALL_METRIC_NAMES.get(metric_id, "")
                if not name:
                    continue
                grant = labels.get(GRANT_LABEL, "") if labels else ""
                owner = ("grant", grant) if grant else ("card", device)
                key = (*owner, name)
                reading = Reading(float(value), now, timestamp_ms)
                self._data.pop(key, None)
                self._data[key] = reading
                if name in _KNOWN_NAMES:
                    self._by_key.setdefault(owner, {})[name] = reading
                kept += 1
            while len(self._data) > self._max:
                scope, who, name = oldest = next(iter(self._data))
                del self._data[oldest]
                group = self._by_key.get((scope, who))
                if group is not None:
                    group.pop(name, None)
                    if not group:
                        del self._by_key[(scope, who)]
            if source:
                self._source = source
        return kept

    def card(self, device: str, name: str) -> Reading | None:
        with self._lock:
            return self._data.get(("card", device, name))

    def card_readings(self, devices: Iterable[str]) -> dict[str, Reading]:
        """Every known metric of one card (named by minor and/or UUID), the freshest per name."""
        out: dict[str, Reading] = {}
        with self._lock:
            for device in devices:
                for name, found in self._by_key.get(("card", device), {}).items() if device else ():
                    seen = out.get(name)
                    if seen is None or found.received > seen.received:
                        out[name] = found
        return out

    def grant_readings(self, grant_id: str) -> dict[str, Reading]:
        with self._lock:
            return dict(self._by_key.get(("grant", grant_id), {}))

    def devices(self) -> list[str]:
        """Every card key with a reading, in first-seen order."""
        return self._keys("card")

    def grants(self) -> list[str]:
        return self._keys("grant")

    def _keys(self, scope: str) -> list[str]:
        with self._lock:
            return list(dict.fromkeys(key for kind, key, _ in self._data if kind == scope))

    def __len__(self) -> int:
        with self._lock:
            return len(self._data)

    @property
    def source(self) -> str:
        """Where the last batch came from: "stream", "poll", "nvml", "nvml-extras" or ""."""
        with self._lock:
            return self._source


log = logging.getLogger(__name__)

NvmlSource = Callable[[], Sequence[MetricSample]]

SOURCE_STREAM = "stream"
SOURCE_POLL = "poll"
SOURCE_NVML = "nvml"
SOURCE_NONE = "none"
UNIMPLEMENTED = "unimplemented"


class MetricsFeed:
    def __init__(
        self,
        backend: Backend,
        interval: float = 1.0,
        clock: Clock = time.monotonic,
        *,
        cache: MetricsCache | None = None,
        nvml_source: NvmlSource | None = None,
        backoff: Backoff | None = None,
    ) -> None:
        if interval <= 0:
            raise ValueError(f"interval must be > 0 seconds, got {interval}")
        self._backend = backend
        self._interval = interval
        self.cache = cache if cache is not None else MetricsCache(clock=clock)
        self._nvml = nvml_source
        self._backoff = backoff if backoff is not None else Backoff()
        self._stop = CancelEvent()  # a backend stream registers its cancel here instead of polling it
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._source = SOURCE_NONE
        self.stream_subscriptions = 0  # how many times the stream was (re)opened

    def start(self) -> None:
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._run, name="lingjun-metrics-feed", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
            if thread.is_alive():
                log.warning("metrics feed did not stop within %.1f s (backend stream ignores cancel)", timeout)

    @property
    def running(self) -> bool:
        thread = self._thread
        return thread is not None and thread.is_alive()

    @property
    def source(self) -> str:
        """What fed the cache last: "stream", "poll", "nvml" or "none"."""
        with self._lock:
            return self._source

    def _set_source(self, source: str) -> None:
        with self._lock:
            changed = source != self._source
            self._source = source
        if changed:
            log.info("metrics source is now %s", source)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                stream_kind = self._follow_stream()
                if self._stop.is_set():
                    break
                delay = self._backoff.next_delay()
                self._fallback(time.monotonic() + delay, stream_unimplemented=stream_kind == UNIMPLEMENTED)
        except Exception:  # the thread must not die silently; stats then go stale and say so
            log.exception("metrics feed stopped by an unexpected error")
        finally:
            self._set_source(SOURCE_NONE)

    def _follow_stream(self) -> str:
        """Consume one subscription; returns why it ended (a BackendUnavailable kind)."""
        self.stream_subscriptions += 1
        try:
            for batch in self._backend.metrics_stream(self._stop):
                if self._stop.is_set():
                    return "stopped"
                self.cache.update(batch, SOURCE_STREAM)
                self._set_source(SOURCE_STREAM)
                self._backoff.reset()
            return "ended"
        except BackendUnavailable as exc:
            log.debug("metrics stream unavailable (%s): %s", exc.kind, exc)
            return exc.kind
        except Exception as exc:  # a broken backend must not kill the feed
            log.warning("metrics stream failed: %s", exc)
            return "error"

    def _fallback(self, deadline: float, *, stream_unimplemented: bool) -> None:
        """Poll (or read NVML) every interval until ``deadline``, then return to the stream."""
        snapshot_unimplemented = False
        while not self._stop.is_set():
            if not snapshot_unimplemented:
                snapshot_unimplemented = self._poll_once()
            if snapshot_unimplemented:
                if stream_unimplemented and self._nvml is not None:
                    self._read_nvml(self._nvml)
                else:
                    self._set_source(SOURCE_NONE)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self._stop.wait(min(self._interval, remaining))

    def _poll_once(self) -> bool:
        """One snapshot into the cache; returns True when XDM says "unimplemented"."""
        try:
            samples = self._backend.metrics_snapshot()
        except BackendUnavailable as exc:
            self._set_source(SOURCE_NONE)
            return exc.kind == UNIMPLEMENTED
        except Exception as exc:
            log.warning("metrics snapshot failed: %s", exc)
            self._set_source(SOURCE_NONE)
            return False
        self.cache.update(samples, SOURCE_POLL)
        self._set_source(SOURCE_POLL)
        return False

    def _read_nvml(self, read: NvmlSource) -> None:
        try:
            samples = read()
        except Exception as exc:
            log.warning("NVML metrics read failed: %s", exc)
            self._set_source(SOURCE_NONE)
            return
        self.cache.update(samples, SOURCE_NVML)
        self._set_source(SOURCE_NVML)
