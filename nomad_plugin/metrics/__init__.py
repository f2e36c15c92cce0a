"""The plugin's own health metrics, counted by the layers that know the events.

Other layers hold one ``PluginMetrics`` and call its methods (a Reserve
took N seconds, XDM went down, a leaked grant was found). With the
Prometheus endpoint off (``metrics_port = 0``, the default) the object is
disabled and every method returns at once, so callers never need to check.

Names follow Prometheus conventions: a ``lingjun_plugin_`` prefix, base
units in the name (``_seconds``), ``_total`` on counters (added by the
client library), and bounded label values.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nomad_plugin.config.model import PluginConfig

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

# Reserve spans a lock, XDM Allocate and verification: milliseconds to XDM's call timeout.
RESERVE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
MAX_KIND_LEN = 40


def _kind_label(kind: str) -> str:
    """Error kinds become label values: short, printable, never empty."""
    clean = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in kind.strip())[:MAX_KIND_LEN]
    return clean or "unknown"


class PluginMetrics:
    """Counters and gauges on a private ``CollectorRegistry`` (never the global one)."""

    def __init__(self, enabled: bool = True, registry: CollectorRegistry | None = None) -> None:
        self.enabled = enabled
        self._registry = registry
        if not enabled:
            return  # prometheus_client (4 MiB) is imported only when the endpoint is on or asked for
        from prometheus_client import Counter, Gauge, Histogram
        from prometheus_client.process_collector import ProcessCollector

        reg = self.registry
        ProcessCollector(registry=reg)
        self._xdm_up = Gauge(
            "lingjun_plugin_xdm_up", "1 while XDM answers, 0 while it cannot be reached.", registry=reg
        )
        self._xdm_reconnects = Counter(
            "lingjun_plugin_xdm_reconnects", "Times the plugin re-established its XDM connection.", registry=reg
        )
        self._fingerprints = Counter(
            "lingjun_plugin_fingerprints_sent", "Fingerprint responses sent to Nomad.", registry=reg
        )
        self._reserve_seconds = Histogram(
            "lingjun_plugin_reserve_duration_seconds",
            "Time to answer one Reserve call, successful or not.",
            buckets=RESERVE_BUCKETS,
            registry=reg,
        )
        self._reserve_errors = Counter(
            "lingjun_plugin_reserve_errors", "Reserve calls answered with an error, by kind.", ["kind"], registry=reg
        )
        self._policy_violations = Counter(
            "lingjun_plugin_reserve_policy_violations",
            "Grants XDM made that broke the Reserve content policy (refused and released), by rule: path, size, "
            "device, env, visibility, mount (docs/reserve.md).",
            ["rule"],
            registry=reg,
        )
        self._journal_entries = Gauge(
            "lingjun_plugin_journal_entries", "Grants recorded in the plugin's journal.", registry=reg
        )
        self._schema_mismatch = Gauge(
            "lingjun_plugin_xdm_schema_mismatch",
            "1 while XDM answers UNIMPLEMENTED or undecodable data: the reconstructed proto does not match XDM.",
            registry=reg,
        )
        self._reconcile_errors = Counter(
            "lingjun_plugin_reconcile_errors",
            "Reconciler rounds that failed to read the Nomad API (no grant is released meanwhile).",
            registry=reg,
        )
        self._mounts = Counter(
            "lingjun_plugin_container_mounts_decisions",
            "Reserves whose grant carried XDM mounts, by outcome: passed, volumes (withheld: the task mounts "
            "volumes), unknown (withheld: the task could not be found), never.",
            ["outcome"],
            registry=reg,
        )
        self._released = Counter(
            "lingjun_plugin_reconcile_released_grants",
            "Grants released because reconciliation found their allocation gone.",
            registry=reg,
        )
        self._leaked = Counter(
            "lingjun_plugin_leaked_grants_found", "Grants held in XDM that no journal entry explains.", registry=reg
        )
        self._view_incomplete = Gauge(
            "lingjun_plugin_nomad_view_incomplete",
            "1 while the Nomad token cannot read every namespace (grants are then released only on evidence).",
            registry=reg,
        )
        self._unverifiable = Gauge(
            "lingjun_plugin_unverifiable_grants",
            "Grants kept because no allocation visible to the token claimed them while the view is incomplete.",
            registry=reg,
        )

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
            self._reserve_errors.labels(kind=_kind_label(kind)).inc()

    def reserve_policy_violation(self, rule: str) -> None:
        if self.enabled:
            self._policy_violations.labels(rule=_kind_label(rule)).inc()

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
            self._mounts.labels(outcome=_kind_label(outcome)).inc()
