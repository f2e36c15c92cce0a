"""Metric samples from XDM's exporter (or NVML), as plain data."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class MetricSample:
    """One reading. ``device`` is the card minor or UUID as XDM reports it;
    ``labels`` may carry an allocation id for per-grant samples."""

    device: str
    metric_id: int
    name: str
    value: float
    timestamp_ms: int
    labels: Mapping[str, str] = field(default_factory=dict)
