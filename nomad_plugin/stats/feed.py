"""One background thread that keeps the metrics cache filled.

Order of preference, re-evaluated on every resubscription:

1. XDM's ``ExporterDataStream`` (``backend.metrics_stream``): every pushed
   batch goes into the cache. When it ends or breaks we resubscribe after
   ``Backoff`` (1 s, x2, cap 30 s: XDM's documented rule).
2. While the stream is down, ``backend.metrics_snapshot`` is polled at the
   collection interval, so numbers keep flowing during the backoff.
3. When both answer "unimplemented" (no XDM exporter on this node) and an
   NVML source was given, that is read at the interval instead.
4. Otherwise nothing: the cache ages and the stats mark values stale;
   metrics are optional, and nothing else waits for them.

The thread never spins: every path either blocks in the stream or waits on
the stop event for an interval. ``stop()`` sets that event (which is also
the stream's cancel) and joins the thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from nomad_plugin.model.card import Backend
from nomad_plugin.model.errors import BackendUnavailable
from nomad_plugin.model.metrics import MetricSample
from nomad_plugin.stats.cache import Clock, MetricsCache
from nomad_plugin.util.threads import Backoff, CancelEvent

log = logging.getLogger(__name__)

NvmlSource = Callable[[], Sequence[MetricSample]]

SOURCE_STREAM = "stream"
SOURCE_POLL = "poll"
SOURCE_NVML = "nvml"
SOURCE_NONE = "none"
UNIMPLEMENTED = "unimplemented"


class MetricsFeed:
    """Fills a ``MetricsCache`` from a backend; see the module docstring."""

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
        """Start the thread once; later calls do nothing."""
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._run, name="lingjun-metrics-feed", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Cancel the stream and wait for the thread; idempotent."""
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
                    self._read_nvml()
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

    def _read_nvml(self) -> None:
        assert self._nvml is not None
        try:
            samples = self._nvml()
        except Exception as exc:
            log.warning("NVML metrics read failed: %s", exc)
            self._set_source(SOURCE_NONE)
            return
        self.cache.update(samples, SOURCE_NVML)
        self._set_source(SOURCE_NVML)
