"""CPU and RSS of one process, read from ``/proc/<pid>``: what the plugin costs the node while it runs.

``benchmarks/guards.py`` samples the real plugin process with these under
Nomad-like load (Fingerprint and Stats streams open, Stats at a 1 s
interval, 160 live grants); ``--steady-seconds`` makes its window longer.
CPU is utime + stime over a window, as a share of one core; RSS is VmRSS,
sampled in a background thread so the peak of the whole run is seen, not
only its last value.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` (fields 14 and 15 of /proc/<pid>/stat, after the command name)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def cpu_percent(pid: int, seconds: float) -> float:
    """Share of one core ``pid`` used over the next ``seconds`` of wall time."""
    t0, c0 = time.monotonic(), cpu_seconds(pid)
    time.sleep(seconds)
    t1, c1 = time.monotonic(), cpu_seconds(pid)
    return 100 * (c1 - c0) / (t1 - t0)


class PeakRss:
    """The largest VmRSS of ``pid`` seen every ``every`` seconds until ``stop``."""

    def __init__(self, pid: int, every: float = 0.5) -> None:
        self.pid = pid
        self.peak = rss_mib(pid)
        self._every = every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="peak-rss", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            try:
                self.peak = max(self.peak, rss_mib(self.pid))
            except (FileNotFoundError, ProcessLookupError):
                return

    def stop(self) -> float:
        self._stop.set()
        self._thread.join(5)
        return self.peak
