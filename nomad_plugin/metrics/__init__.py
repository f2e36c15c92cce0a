"""Prometheus metrics: the plugin's own health counters and an optional scrape endpoint.

The names are loaded on first use: ``metrics.plugin`` (always used) must not
pull in ``metrics.prometheus`` and prometheus_client while the endpoint is
off, the default (issue 14: 4 MiB of the steady-state RSS).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nomad_plugin.metrics.plugin import PluginMetrics
    from nomad_plugin.metrics.prometheus import DeviceCollector, MetricsEndpoint, start_endpoint

__all__ = ["DeviceCollector", "MetricsEndpoint", "PluginMetrics", "start_endpoint"]

_HOME = {
    "PluginMetrics": "nomad_plugin.metrics.plugin",
    "DeviceCollector": "nomad_plugin.metrics.prometheus",
    "MetricsEndpoint": "nomad_plugin.metrics.prometheus",
    "start_endpoint": "nomad_plugin.metrics.prometheus",
}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
