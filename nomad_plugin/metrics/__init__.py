"""The plugin's own health metrics (here) and the ``/metrics`` endpoint (``metrics.prometheus``).

The layers that see an event call one ``PluginMetrics`` method. With the endpoint off
(``metrics_port = 0``, the default) every method returns at once and prometheus_client is never
loaded. Names: the ``PREFIX``, base units, ``_total`` on counters (the client library adds it);
docs/stats.md describes each.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nomad_plugin.config.model import PluginConfig

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

PREFIX = "lingjun_plugin_"
# Reserve spans a lock, XDM Allocate and verification: milliseconds to XDM's call timeout.
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
#: name -> (help, label); the counters, then the gauges.
COUNTERS = {
    "xdm_reconnects": ("Times the plugin re-established its XDM connection.", ""),
    "fingerprints_sent": ("Fingerprint responses sent to Nomad.", ""),
    "reserve_errors": ("Reserve calls answered with an error, by kind.", "kind"),
    "reserve_policy_violations": (
        "Grants XDM made that broke the Reserve content policy (refused and released), by rule.",
        "rule",
    ),
    "container_mounts_decisions": ("Reserves whose grant carried XDM mounts, by what became of the mounts.", "outcome"),
    "reconcile_errors": ("Reconciler rounds that failed to read the Nomad API.", ""),
    "reconcile_released_grants": ("Grants released because reconciliation found their allocation gone.", ""),
    "leaked_grants_found": ("Grants held in XDM that no journal entry explains.", ""),
}
GAUGES = {
    "xdm_up": "1 while XDM answers, 0 while it cannot be reached.",
    "xdm_schema_mismatch": "1 while XDM answers UNIMPLEMENTED or undecodable data.",
    "journal_entries": "Grants recorded in the plugin's journal.",
    "nomad_view_incomplete": "1 while the Nomad token cannot read every namespace (grants are then released only on "
    "evidence).",
    "unverifiable_grants": "Grants kept because no allocation visible to the token claimed them while the view is "
    "incomplete.",
}


def _label(kind: str) -> str:
    """Error kinds and outcomes become label values: short, printable, never empty."""
    clean = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in kind.strip())[:40]
    return clean or "unknown"


class PluginMetrics:
    """Counters and gauges on a private ``CollectorRegistry`` (never the global one)."""

    def __init__(self, enabled: bool = True, registry: CollectorRegistry | None = None) -> None:
        self.enabled = enabled
        self._registry = registry
        self._metrics: dict[str, Any] = {}
        if not enabled:
            return
        from prometheus_client import Counter, Gauge, Histogram
        from prometheus_client.process_collector import ProcessCollector

        reg = self.registry
        ProcessCollector(registry=reg)
        for name, (doc, label) in COUNTERS.items():
            self._metrics[name] = Counter(f"{PREFIX}{name}", doc, [label] if label else [], registry=reg)
        for name, doc in GAUGES.items():
            self._metrics[name] = Gauge(f"{PREFIX}{name}", doc, registry=reg)
        doc = "Time to answer one Reserve call, successful or not."
        self._metrics["reserve"] = Histogram(f"{PREFIX}reserve_duration_seconds", doc, registry=reg, buckets=BUCKETS)

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

    def _count(self, name: str, n: float = 1, label: str | None = None) -> None:
        if self.enabled and n > 0:
            counter = self._metrics[name]
            (counter if label is None else counter.labels(_label(label))).inc(n)

    def _set(self, name: str, value: float) -> None:
        if self.enabled:
            self._metrics[name].set(value)

    def observe_reserve(self, seconds: float) -> None:
        if self.enabled:
            self._metrics["reserve"].observe(max(0.0, seconds))

    def reserve_error(self, kind: str) -> None:
        self._count("reserve_errors", label=kind)

    def reserve_policy_violation(self, rule: str) -> None:
        self._count("reserve_policy_violations", label=rule)

    def mount_decision(self, outcome: str) -> None:
        self._count("container_mounts_decisions", label=outcome)

    def fingerprint_sent(self) -> None:
        self._count("fingerprints_sent")

    def xdm_reconnect(self) -> None:
        self._count("xdm_reconnects")

    def reconcile_errors(self, n: int = 1) -> None:
        self._count("reconcile_errors", n)

    def grant_released_by_reconcile(self) -> None:
        self._count("reconcile_released_grants")

    def leaked_grant_found(self) -> None:
        self._count("leaked_grants_found")

    def xdm_state(self, up: bool) -> None:
        self._set("xdm_up", 1 if up else 0)

    def xdm_schema_mismatch(self, mismatch: bool) -> None:
        self._set("xdm_schema_mismatch", 1 if mismatch else 0)

    def journal_size(self, n: int) -> None:
        self._set("journal_entries", max(0, n))

    def nomad_view(self, incomplete: bool, unverifiable: int) -> None:
        self._set("nomad_view_incomplete", 1 if incomplete else 0)
        self._set("unverifiable_grants", max(0, unverifiable))
