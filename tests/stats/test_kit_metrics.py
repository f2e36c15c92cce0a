"""The metrics added for the observability kit (docs/observability.md): their
setters, and how the app derives XDM reachability, schema mismatch and
reconnects from the backend's inventory."""

from __future__ import annotations

from nomad_plugin.app import XdmWatch
from nomad_plugin.metrics import PluginMetrics
from nomad_plugin.model.card import Inventory


def _value(metrics: PluginMetrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels or None)
    assert value is not None, f"{name}{labels} has no sample"
    return value


def test_setters() -> None:
    metrics = PluginMetrics()
    metrics.nomad_view(True, 3)
    metrics.reconcile_errors(2)
    metrics.reconcile_errors(0)
    metrics.xdm_schema_mismatch(True)
    metrics.mount_decision("volumes")
    assert _value(metrics, "lingjun_plugin_unverifiable_grants") == 3
    assert _value(metrics, "lingjun_plugin_nomad_view_incomplete") == 1
    assert _value(metrics, "lingjun_plugin_reconcile_errors_total") == 2
    assert _value(metrics, "lingjun_plugin_xdm_schema_mismatch") == 1
    assert _value(metrics, "lingjun_plugin_container_mounts_decisions_total", outcome="volumes") == 1
    metrics.nomad_view(False, -1)
    assert _value(metrics, "lingjun_plugin_unverifiable_grants") == 0
    assert _value(metrics, "lingjun_plugin_nomad_view_incomplete") == 0


def test_disabled_metrics_ignore_the_setters() -> None:
    metrics = PluginMetrics(enabled=False)
    metrics.nomad_view(True, 3)
    metrics.xdm_schema_mismatch(True)
    assert metrics.registry.get_sample_value("lingjun_plugin_unverifiable_grants") is None


def test_inventory_drives_up_mismatch_and_reconnects() -> None:
    metrics = PluginMetrics()
    watch = XdmWatch(metrics)
    down = Inventory(reachable=False, unreachable_reason="connection-refused: XDM socket refused")
    drift = Inventory(reachable=False, unreachable_reason="unimplemented: XDM ListAndWatch is not implemented")
    up = Inventory(reachable=True)

    watch(Inventory(reachable=False, unreachable_reason="not yet connected"))
    watch(up)  # the first connection is not a reconnect
    assert _value(metrics, "lingjun_plugin_xdm_up") == 1
    assert _value(metrics, "lingjun_plugin_xdm_reconnects_total") == 0

    watch(drift)
    assert _value(metrics, "lingjun_plugin_xdm_up") == 0
    assert _value(metrics, "lingjun_plugin_xdm_schema_mismatch") == 1
    watch(down)
    assert _value(metrics, "lingjun_plugin_xdm_schema_mismatch") == 0
    watch(up)
    assert _value(metrics, "lingjun_plugin_xdm_reconnects_total") == 1
    assert _value(metrics, "lingjun_plugin_xdm_schema_mismatch") == 0
