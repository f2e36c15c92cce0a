"""Live per-instance stats for Nomad: feed (XDM/NVML -> cache), layout (cache -> StatsResponse), engine."""

from __future__ import annotations

from nomad_plugin.stats.cache import MetricsCache, Reading
from nomad_plugin.stats.engine import GrantInfo, GrantLookup, StatsEngine, build_stats
from nomad_plugin.stats.feed import MetricsFeed

__all__ = ["GrantInfo", "GrantLookup", "MetricsCache", "MetricsFeed", "Reading", "StatsEngine", "build_stats"]
