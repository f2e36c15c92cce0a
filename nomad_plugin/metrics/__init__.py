"""The plugin's own health metrics (here) and the ``/metrics`` endpoint (``metrics.prometheus``).

The layers that see an event call one ``PluginMetrics`` method (a Reserve took
N seconds, XDM went down). With the endpoint off (``metrics_port = 0``, the
default) every method returns at once and prometheus_client is never loaded.
Names: the ``PREFIX``, base units, ``_total`` on counters (the client library adds it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nomad_plugin.config.model import PluginConfig

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

PREFIX = "lingjun_plugin_"
# Reserve spans a lock, XDM Allocate and verification: milliseconds to XDM's call timeout.
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def _label(kind: str) -> str:
    """Error kinds and outcomes become label values: short, printable, never empty."""
    clean = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in kind.strip())[:40]
    return clean or "unknown"


class PluginMetrics:
    """Counters and gauges on a private ``CollectorRegistry`` (never the global one)."""

    def __init__(self, enabled: bool = True, registry: CollectorRegistry | None = None) -> None:
        self.enabled = enabled
        self._registry = registry
        if not enabled:
            return
        from prometheus_client import Counter, Gauge, Histogram
        from prometheus_client.process_collector import ProcessCollector

        reg = self.registry
        ProcessCollector(registry=reg)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(f"{PREFIX}{name}", doc, registry=reg)

        def counter(name: str, doc: str, *labels: str) -> Counter:
            return Counter(f"{PREFIX}{name}", doc, labels, registry=reg)

        # Each one is described at length in docs/stats.md.
        self._xdm_up = gauge("xdm_up", "1 while XDM answers, 0 while it cannot be reached.")
        self._xdm_reconnects = counter("xdm_reconnects", "Times the plugin re-established its XDM connection.")
        self._schema_mismatch = gauge("xdm_schema_mismatch", "1 while XDM answers UNIMPLEMENTED or undecodable data.")
        self._fingerprints = counter("fingerprints_sent", "Fingerprint responses sent to Nomad.")
        doc = "Time to answer one Reserve call, successful or not."
        self._reserve_seconds = Histogram(f"{PREFIX}reserve_duration_seconds", doc, registry=reg, buckets=BUCKETS)
        self._reserve_errors = counter("reserve_errors", "Reserve calls answered with an error, by kind.", "kind")
        doc = "Grants XDM made that broke the Reserve content policy (refused and released), by rule."
        self._policy_violations = counter("reserve_policy_violations", doc, "rule")
        doc = "Reserves whose grant carried XDM mounts, by what became of the mounts."
        self._mounts = counter("container_mounts_decisions", doc, "outcome")
        self._journal_entries = gauge("journal_entries", "Grants recorded in the plugin's journal.")
        self._reconcile_errors = counter("reconcile_errors", "Reconciler rounds that failed to read the Nomad API.")
        doc = "Grants released because reconciliation found their allocation gone."
        self._released = counter("reconcile_released_grants", doc)
        self._leaked = counter("leaked_grants_found", "Grants held in XDM that no journal entry explains.")
        doc = "1 while the Nomad token cannot read every namespace (grants are then released only on evidence)."
        self._view_incomplete = gauge("nomad_view_incomplete", doc)
        doc = "Grants kept because no allocation visible to the token claimed them while the view is incomplete."
        self._unverifiable = gauge("unverifiable_grants", doc)

    @property
    def registry(self) -> CollectorRegistry:
        """The private registry (made on first use: a disabled object may never need one)."""
        if self._registry is None:
            from prometheus_client import CollectorRegistry

            self._registry = CollectorRegistry(auto_describe=True)
        return self._registry

    @classmethod
    def for_config(cls, config: PluginConfig) -> PluginMetrics:
        """Enabled only when the endpoint is on (``metrics_port`` != 0)."""
        return cls(enabled=config.metrics_port != 0)

    def observe_reserve(self, seconds: float) -> None:
        if self.enabled:
            self._reserve_seconds.observe(max(0.0, seconds))

    def reserve_error(self, kind: str) -> None:
        if self.enabled:
            self._reserve_errors.labels(kind=_label(kind)).inc()

    def reserve_policy_violation(self, rule: str) -> None:
        if self.enabled:
            self._policy_violations.labels(rule=_label(rule)).inc()

    def fingerprint_sent(self) -> None:
        if self.enabled:
            self._fingerprints.inc()

    def xdm_state(self, up: bool) -> None:
        if self.enabled:
            self._xdm_up.set(1 if up else 0)

    def xdm_reconnect(self) -> None:
        if self.enabled:
            self._xdm_reconnects.inc()

    def xdm_schema_mismatch(self, mismatch: bool) -> None:
        if self.enabled:
            self._schema_mismatch.set(1 if mismatch else 0)

    def reconcile_errors(self, n: int = 1) -> None:
        if self.enabled and n > 0:
            self._reconcile_errors.inc(n)

    def journal_size(self, n: int) -> None:
        if self.enabled:
            self._journal_entries.set(max(0, n))

    def grant_released_by_reconcile(self) -> None:
        if self.enabled:
            self._released.inc()

    def nomad_view(self, incomplete: bool, unverifiable: int) -> None:
        if self.enabled:
            self._view_incomplete.set(1 if incomplete else 0)
            self._unverifiable.set(max(0, unverifiable))

    def leaked_grant_found(self) -> None:
        if self.enabled:
            self._leaked.inc()

    def mount_decision(self, outcome: str) -> None:
        if self.enabled:
            self._mounts.labels(outcome=_label(outcome)).inc()
