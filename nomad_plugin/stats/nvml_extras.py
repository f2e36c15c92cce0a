"""NVML's share of nomad-device-nvidia's stats on XDM nodes: encoder, decoder, BAR1, ECC by location.

XDM's exporter (as reconstructed) has no such readings. When the XDM backend
runs with NVML enrichment on and NVML usable, this thread reads only those
(``readings.official_values``) once per interval into the same cache, keyed
by card UUID like XDM's samples, so the layout finds them beside XDM's. Any
NVML failure backs off and is logged once per distinct message; stats then
show "N/A" for these, as without NVML.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from nomad_plugin.goplugin.logging import get_logger
from nomad_plugin.nvml import lib
from nomad_plugin.nvml.devices import DeviceRef, list_devices
from nomad_plugin.nvml.lib import Nvml
from nomad_plugin.nvml.readings import official_values, sample
from nomad_plugin.stats.cache import MetricsCache
from nomad_plugin.util.threads import Backoff

log = get_logger(__name__)

SOURCE = "nvml-extras"
RESCAN_EVERY = 60  # intervals between re-enumerating cards (hot-plug is rare)


class NvmlExtrasFeed:
    """One daemon thread; ``stop()`` ends it within one interval."""

    def __init__(
        self,
        cache: MetricsCache,
        interval: float = 1.0,
        loader: Callable[[], Nvml] = lib.load,
        backoff: Backoff | None = None,
    ) -> None:
        self._cache = cache
        self._interval = interval
        self._loader = loader
        self._backoff = backoff or Backoff(initial=interval, cap=300.0)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_error = ""
        self.polls = 0

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="lingjun-nvml-extras", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 1.0) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _run(self) -> None:
        nvml: Nvml | None = None
        refs: list[DeviceRef] = []
        polls_since_scan = 0
        while not self._stop.is_set():
            try:
                if nvml is None:
                    nvml = self._loader()
                    nvml.nvmlInit()
                    refs, polls_since_scan = [], RESCAN_EVERY
                if polls_since_scan >= RESCAN_EVERY:
                    refs, _ = list_devices(nvml)
                    polls_since_scan = 0
                self._poll(nvml, refs)
                polls_since_scan += 1
                self._backoff.reset()
                self._last_error = ""
                self._stop.wait(self._interval)
            except Exception as exc:  # NVML gone, a card lost: retry later, never die
                message = lib.describe(nvml, exc) if nvml is not None else str(exc)
                if message != self._last_error:
                    log.warning("NVML extras for stats (encoder, decoder, BAR1, ECC) unavailable: %s", message)
                    self._last_error = message
                nvml = self._shutdown(nvml)
                self._stop.wait(self._backoff.next_delay())
        self._shutdown(nvml)

    def _poll(self, nvml: Nvml, refs: list[DeviceRef]) -> None:
        ts_ms = int(time.time() * 1000)
        samples = []
        for ref in refs:
            for name, value in official_values(nvml, ref.handle).items():
                samples.append(sample(ref.uuid, name, value, ts_ms))
        self._cache.update(samples, SOURCE)
        self.polls += 1

    @staticmethod
    def _shutdown(nvml: Nvml | None) -> None:
        if nvml is not None:
            try:
                nvml.nvmlShutdown()
            except Exception as exc:  # shutting down a broken NVML may fail too; nothing to do
                log.debug("nvmlShutdown: %s", exc)
        return None
