"""Prometheus metrics: the plugin's own health counters and an optional scrape endpoint."""

from __future__ import annotations

from nomad_plugin.metrics.plugin import PluginMetrics
from nomad_plugin.metrics.prometheus import DeviceCollector, MetricsEndpoint, start_endpoint

__all__ = ["DeviceCollector", "MetricsEndpoint", "PluginMetrics", "start_endpoint"]
