"""Simulated exporter metrics: plausible, drifting, consistent with grants.

Values move by a seeded random walk at every collection, stay inside the
card's capacities (used <= total, power <= limit) and agree with the grants:
each share or MIG grant gets its own samples labelled with
``GRANT_LABEL`` (its allocation id), whose memory never exceeds what was
granted, and the card's memory is the sum of its grants' plus a little
driver overhead.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from nomad_plugin.model.metrics import GRANT_LABEL, METRIC_IDS, METRIC_NAMES, MetricSample
from nomad_plugin.sim.allocate import mig_profile_gib
from nomad_plugin.sim.grants import GrantRecord
from nomad_plugin.sim.profiles import CardSpec

# A hook that returns real readings for a card (NVML mirror): metric id -> value.
RealReader = Callable[[CardSpec], Mapping[int, float]]


@dataclass
class _CardState:
    util: float = 2.0
    overhead_mib: float = 512.0
    temp: float = 34.0
    xid: int = 0
    ecc_sbe: int = 0
    was_healthy: bool = True


@dataclass
class _GrantState:
    util: float = 0.0
    used_fraction: float = 0.3


@dataclass
class MetricsModel:
    cards: Mapping[int, CardSpec]
    seed: int = 0
    real_reader: RealReader | None = None
    _rng: random.Random = field(init=False)
    _cards: dict[int, _CardState] = field(init=False, default_factory=dict)
    _grants: dict[tuple[str, int], _GrantState] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)  # noqa: S311 - simulated readings, not secrets

    def _walk(self, value: float, step: float, low: float, high: float) -> float:
        return min(high, max(low, value + self._rng.uniform(-step, step)))

    def collect(
        self,
        now_ms: int,
        present: Iterable[int],
        health: Mapping[int, bool],
        grants: Iterable[GrantRecord],
    ) -> list[MetricSample]:
        """One full snapshot (every present card, every metric, every share/MIG grant)."""
        grants = list(grants)
        samples: list[MetricSample] = []
        live_keys: set[tuple[str, int]] = set()
        for minor in sorted(present):
            card = self.cards[minor]
            state = self._cards.setdefault(minor, _CardState(temp=30.0 + self._rng.uniform(0, 8)))
            healthy = health.get(minor, True)
            if state.was_healthy and not healthy:
                state.xid += 1
            state.was_healthy = healthy
            on_card = [g for g in grants if minor in g.minors]
            grant_util = 0.0
            grant_mem = 0.0
            for grant in on_card:
                if grant.kind not in ("tdm", "mig"):
                    continue
                key = (grant.id, minor)
                live_keys.add(key)
                gs = self._grants.setdefault(key, _GrantState(util=self._rng.uniform(20, 60)))
                cap_core = float(grant.core) if grant.core > 0 else 100.0
                gs.util = self._walk(gs.util, 8.0, 0.0, cap_core)
                gs.used_fraction = self._walk(gs.used_fraction, 0.05, 0.05, 0.95)
                cap_mib = self._grant_memory_mib(grant, card)
                if grant.memory == 0 and grant.slice == 0:  # unlimited memory: split the card among such shares
                    cap_mib //= max(1, sum(1 for g in on_card if g.kind == "tdm" and g.memory == 0))
                used = round(cap_mib * gs.used_fraction, 1)
                grant_util += gs.util * (grant.slice / 7.0 if grant.slice else 1.0)
                grant_mem += used
                labels = {GRANT_LABEL: grant.id, "uuid": card.uuid}
                samples.append(self._sample(minor, 1, round(gs.util, 1), now_ms, labels))
                samples.append(self._sample(minor, 2, used, now_ms, labels))
                samples.append(self._sample(minor, 3, float(cap_mib), now_ms, labels))
            whole = any(g.kind == "whole" for g in on_card)
            if whole:
                state.util = self._walk(max(state.util, 50.0), 10.0, 30.0, 100.0)
                state.overhead_mib = self._walk(state.overhead_mib, 512.0, 1024.0, card.memory_mib * 0.9)
            else:
                state.util = min(100.0, grant_util + self._rng.uniform(0.0, 3.0))
                state.overhead_mib = self._walk(state.overhead_mib, 32.0, 256.0, 768.0)
            values = self._card_values(card, state, healthy, grant_mem)
            if self.real_reader is not None:
                values.update(self.real_reader(card))
            for mid in sorted(values):
                samples.append(self._sample(minor, mid, values[mid], now_ms, {"uuid": card.uuid}))
        for key in list(self._grants):
            if key not in live_keys:
                del self._grants[key]
        return samples

    def _card_values(self, card: CardSpec, state: _CardState, healthy: bool, grant_mem: float) -> dict[int, float]:
        total = float(card.memory_mib)
        used = round(min(total, state.overhead_mib + grant_mem), 1)
        util = round(state.util, 1)
        state.temp = self._walk(0.8 * state.temp + 0.2 * (32.0 + util * 0.45), 1.0, 25.0, 89.0)
        idle_w = card.power_limit_w * 0.12
        power = min(float(card.power_limit_w), idle_w + util / 100.0 * (card.power_limit_w - idle_w) * 0.9)
        if self._rng.random() < 0.01:
            state.ecc_sbe += 1
        return {
            METRIC_IDS["core_util_percent"]: util,
            METRIC_IDS["memory_used_mib"]: used,
            METRIC_IDS["memory_total_mib"]: total,
            METRIC_IDS["temperature_c"]: round(state.temp, 1),
            METRIC_IDS["power_w"]: round(power, 1),
            METRIC_IDS["health"]: 1.0 if healthy else 0.0,
            METRIC_IDS["xid_errors"]: float(state.xid),
            METRIC_IDS["power_limit_w"]: float(card.power_limit_w),
            METRIC_IDS["memory_util_percent"]: round(used / total * 100.0, 2),
            METRIC_IDS["ecc_sbe_total"]: float(state.ecc_sbe),
            METRIC_IDS["ecc_dbe_total"]: 0.0,
            METRIC_IDS["sm_clock_mhz"]: float(int(210 + util * 17.7)),
            METRIC_IDS["memory_clock_mhz"]: 2619.0 if card.is_nvidia else 1600.0,
            METRIC_IDS["nvlink_errors_total"]: 0.0,
            METRIC_IDS["throttle_reasons"]: 0.0 if power < card.power_limit_w * 0.98 else 4.0,
            METRIC_IDS["remapped_rows_total"]: 0.0,
        }

    @staticmethod
    def _grant_memory_mib(grant: GrantRecord, card: CardSpec) -> int:
        if grant.memory > 0:
            return grant.memory * 1024
        if grant.slice > 0:
            return mig_profile_gib(card.memory_gib, grant.slice) * 1024
        return card.memory_mib

    @staticmethod
    def _sample(minor: int, mid: int, value: float, now_ms: int, labels: dict[str, str]) -> MetricSample:
        return MetricSample(str(minor), mid, METRIC_NAMES[mid], value, now_ms, labels)


def filter_samples(
    samples: Iterable[MetricSample], devices: Iterable[str], metric_ids: Iterable[int], uuids: Mapping[str, int]
) -> list[MetricSample]:
    """Samples matching a request filter; empty filter = all; a device is a minor string or a uuid."""
    wanted_devices = {str(uuids.get(d, d)) for d in devices}
    wanted_ids = set(metric_ids)
    return [
        s
        for s in samples
        if (not wanted_devices or s.device in wanted_devices) and (not wanted_ids or s.metric_id in wanted_ids)
    ]
