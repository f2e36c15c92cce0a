"""Live per-instance stats for Nomad: feed (XDM/NVML -> cache), layout (cache -> StatsResponse), engine."""

from __future__ import annotations

from nomad_plugin.stats.cache import MetricsCache, Reading
from nomad_plugin.stats.engine import StatsEngine
from nomad_plugin.stats.feed import MetricsFeed
from nomad_plugin.stats.layout import GrantInfo, GrantLookup, build_stats

__all__ = ["GrantInfo", "GrantLookup", "MetricsCache", "MetricsFeed", "Reading", "StatsEngine", "build_stats"]
