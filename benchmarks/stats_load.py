"""Stats path CPU at 1 s stats on the realistic node: 16 cards x 10 shares, half of them granted.

Runs the plugin's own stats path in this process for ``--duration`` seconds:
a ``MetricsFeed`` consuming a fake exporter stream that pushes every metric of
every card (and per-grant samples) each ``--interval``, a ``StatsEngine``
answering Nomad at the same interval with each response serialised as gRPC
sends it, and a Prometheus scrape of the device collector every 15 s. It
reports the process CPU time as a percentage of one core and the peak RSS.
The guard is the plugin's: <= 1 % of one core with 1 s stats (this path is
part of it; ``plugin_load.py`` measures the whole plugin process).

Usage: .venv/bin/python benchmarks/stats_load.py [--duration 60] [--interval 1.0]
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prometheus_client import CollectorRegistry, generate_latest

from nomad_plugin.metrics.prometheus import DeviceCollector
from nomad_plugin.model.card import Card, Inventory
from nomad_plugin.model.instances import Catalog, GroupKey, Instance, InstanceGroup, Kind, share_id
from nomad_plugin.model.metrics import GRANT_LABEL, METRIC_IDS, MetricSample
from nomad_plugin.stats.engine import GrantInfo, StatsEngine
from nomad_plugin.stats.feed import MetricsFeed

CARDS = 16
SHARES_PER_CARD = 10
GUARD_CPU_PERCENT = 1.0


def node() -> tuple[Catalog, Inventory, dict[str, GrantInfo]]:
    cards = tuple(
        Card(minor=i, uuid=f"GPU-{i:04d}", model="H100", vendor="nvidia", xpu_type="gpu", memory_mib=81920)
        for i in range(CARDS)
    )
    shares: list[Instance] = []
    grants: dict[str, GrantInfo] = {}
    for c in cards:
        for i in range(SHARES_PER_CARD):
            inst = Instance(share_id(c.uuid, i), Kind.SHARE, c.uuid, c.minor, index=i, core=10, memory_gib=8)
            shares.append(inst)
            if i % 2 == 0:
                grants[inst.id] = GrantInfo(f"grant-{inst.id}", 10, 8)
    catalog = Catalog(groups=(InstanceGroup(GroupKey("nvidia", "gpu", "H100-share"), tuple(shares)),))
    return catalog, Inventory(cards=cards), grants


def snapshot(inventory: Inventory, grants: dict[str, GrantInfo], tick: int) -> list[MetricSample]:
    out: list[MetricSample] = []
    ts = int(time.time() * 1000)
    for card in inventory.cards:
        for name, mid in METRIC_IDS.items():
            out.append(MetricSample(card.uuid, mid, name, float((tick + card.minor + mid) % 100), ts))
    for grant in grants.values():
        labels = {GRANT_LABEL: grant.grant_id}
        out.append(MetricSample("0", METRIC_IDS["memory_used_mib"], "memory_used_mib", 1000.0 + tick % 50, ts, labels))
        out.append(
            MetricSample("0", METRIC_IDS["core_util_percent"], "core_util_percent", float(tick % 100), ts, labels)
        )
    return out


class StreamingExporter:
    """A Backend's metrics side that pushes a full snapshot every ``interval``."""

    name = "bench"

    def __init__(self, inventory: Inventory, grants: dict[str, GrantInfo], interval: float) -> None:
        self._inventory = inventory
        self._grants = grants
        self._interval = interval

    def metrics_snapshot(self) -> Sequence[MetricSample]:
        return snapshot(self._inventory, self._grants, 0)

    def metrics_stream(self, cancel: threading.Event) -> Iterator[Sequence[MetricSample]]:
        tick = 0
        while not cancel.is_set():
            yield snapshot(self._inventory, self._grants, tick)
            tick += 1
            cancel.wait(self._interval)


def run_load(duration: float, interval: float) -> dict[str, float]:
    catalog, inventory, grants = node()
    exporter = StreamingExporter(inventory, grants, interval)
    feed = MetricsFeed(exporter, interval)  # type: ignore[arg-type]
    engine = StatsEngine(feed.cache, lambda: catalog, lambda: inventory, grants.get)
    registry = CollectorRegistry()
    registry.register(DeviceCollector(feed.cache, lambda: inventory, lambda: feed.source))
    cancel = threading.Event()
    responses = 0
    scrapes = 0

    def nomad_side() -> None:
        nonlocal responses
        for response in engine.responses(interval, cancel):
            response.SerializeToString()  # what gRPC does with each
            responses += 1

    def prometheus_side() -> None:
        nonlocal scrapes
        while not cancel.wait(15.0):
            generate_latest(registry)
            scrapes += 1

    feed.start()
    time.sleep(min(2.0, duration / 10))  # warm-up: imports and first fill are not steady state
    threads = [threading.Thread(target=nomad_side), threading.Thread(target=prometheus_side)]
    cpu0, wall0 = time.process_time(), time.monotonic()
    for t in threads:
        t.start()
    time.sleep(duration)
    cpu1, wall1 = time.process_time(), time.monotonic()
    cancel.set()
    for t in threads:
        t.join()
    feed.stop()
    return {
        "cards": CARDS,
        "instances": sum(len(g.instances) for g in catalog.groups),
        "granted": len(grants),
        "duration_s": round(wall1 - wall0, 1),
        "interval_s": interval,
        "responses": responses,
        "scrapes": scrapes,
        "cpu_percent_of_one_core": round(100 * (cpu1 - cpu0) / (wall1 - wall0), 2),
        "max_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of load")
    parser.add_argument("--interval", type=float, default=1.0, help="collection and push interval, seconds")
    args = parser.parse_args(argv)
    result = run_load(args.duration, args.interval)
    print(json.dumps(result, indent=2))
    ok = result["cpu_percent_of_one_core"] <= GUARD_CPU_PERCENT
    print("PASS" if ok else f"FAIL (guard: <= {GUARD_CPU_PERCENT} % of one core)")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
