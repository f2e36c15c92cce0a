"""Stats path load: one StatsResponse for a big node, and CPU/RSS over time.

Node shape (16 cards, 112 instances): 8 cards in tdm mode with 7 shares
each (56 shares) and 8 MIG-capable cards with 7 MIG units each (56 units).
Every card reports all 16 metrics; half of the instances are granted and
report per-grant memory and utilisation samples.

Part 1 times ``build_stats`` (and the protobuf serialisation gRPC does)
over ``--iterations`` runs. Part 2 runs the real stats path for
``--duration`` seconds: a ``MetricsFeed`` consuming a fake exporter stream
that pushes a full snapshot every ``--interval`` seconds, a ``StatsEngine``
answering Nomad at the same interval (each response serialised), and a
Prometheus scrape of the device collector every 15 s. It reports the
process CPU time as a percentage of one core and the peak RSS (Python,
protobuf and prometheus-client included; the real plugin also loads grpc).

Usage: .venv/bin/python benchmarks/stats_load.py [--duration 60] [--interval 1.0]
Targets (issue 6): <= 2 % of one core, <= 100 MB RSS at a 1 s interval.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import statistics
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prometheus_client import CollectorRegistry, generate_latest

from nomad_plugin._proto.nomad import device_pb2
from nomad_plugin.metrics.prometheus import DeviceCollector
from nomad_plugin.model.card import Card, Inventory
from nomad_plugin.model.instances import (
    Catalog,
    GroupKey,
    Instance,
    InstanceGroup,
    Kind,
    mig_unit_id,
    share_id,
)
from nomad_plugin.model.metrics import GRANT_LABEL, METRIC_IDS, MetricSample
from nomad_plugin.stats.assemble import StatsAssembler
from nomad_plugin.stats.cache import MetricsCache
from nomad_plugin.stats.engine import StatsEngine
from nomad_plugin.stats.feed import MetricsFeed
from nomad_plugin.stats.layout import GrantInfo, build_stats

CARDS = 16
UNITS_PER_CARD = 7


def node(n_cards: int = CARDS) -> tuple[Catalog, Inventory, dict[str, GrantInfo]]:
    cards = tuple(
        Card(minor=i, uuid=f"GPU-{i:04d}", model="H100", vendor="nvidia", xpu_type="gpu", memory_mib=81920)
        for i in range(n_cards)
    )
    half = n_cards // 2
    shares: list[Instance] = []
    migs: list[Instance] = []
    grants: dict[str, GrantInfo] = {}
    for c in cards[:half]:
        for i in range(UNITS_PER_CARD):
            inst = Instance(share_id(c.uuid, i), Kind.SHARE, c.uuid, c.minor, index=i, core=14, memory_gib=11)
            shares.append(inst)
            if i % 2 == 0:
                grants[inst.id] = GrantInfo(f"grant-{inst.id}", 14, 11)
    for c in cards[half:]:
        for i in range(UNITS_PER_CARD):
            inst = Instance(mig_unit_id(c.uuid, i), Kind.MIG, c.uuid, c.minor, index=i, core=0, memory_gib=10, slices=1)
            migs.append(inst)
            if i % 2 == 0:
                grants[inst.id] = GrantInfo(f"grant-{inst.id}", 0, 10, 1)
    catalog = Catalog(
        groups=(
            InstanceGroup(GroupKey("nvidia", "gpu", "H100-share"), tuple(shares)),
            InstanceGroup(GroupKey("nvidia", "gpu", "H100-mig"), tuple(migs)),
        )
    )
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


def time_build(iterations: int, n_cards: int = CARDS) -> dict[str, float]:
    """One response, both ways, alternating in the same run: ``build_stats`` + serialise (the
    message path) and ``StatsAssembler`` (the bytes the plugin sends). The cache runs on the
    monotonic clock as in the plugin, and ``now`` comes from that clock, so every value is fresh
    (the first version passed wall-clock time here and timed an all-stale response); the timestamps
    are turned into wall time with the same offset the plugin's ``StatsEngine`` uses."""
    catalog, inventory, grants = node(n_cards)
    cache = MetricsCache()  # monotonic, as in the plugin
    cache.update(snapshot(inventory, grants, 1))
    assembler = StatsAssembler()
    message_ms: list[float] = []
    bytes_ms: list[float] = []
    bytes_cpu_ms: list[float] = []  # thread CPU time: what a busy box inflates least
    size = 0
    for tick in range(iterations):
        cache.update(snapshot(inventory, grants, tick))  # as the feed does every second; untimed
        now = time.monotonic()
        offset = time.time() - now  # as StatsEngine: ages on the monotonic clock, timestamps in wall time
        t0 = time.perf_counter()
        data = build_stats(catalog, inventory, cache, grants.get, now, 1.0, wall_offset=offset).SerializeToString()
        t1 = time.perf_counter()
        c1 = time.thread_time()
        assembled = assembler.build(catalog, inventory, cache, grants.get, now, 1.0, wall_offset=offset)
        c2 = time.thread_time()
        t2 = time.perf_counter()
        bytes_cpu_ms.append((c2 - c1) * 1000)
        message_ms.append((t1 - t0) * 1000)
        bytes_ms.append((t2 - t1) * 1000)
        size = len(assembled)
    check = device_pb2.StatsResponse.FromString(assembled)
    if check != device_pb2.StatsResponse.FromString(data):
        raise SystemExit("the assembled response differs from build_stats")
    if b"stale:" in assembled:
        raise SystemExit("stale values in the timed response: the clocks disagree")
    instances = sum(len(g.instances) for g in catalog.groups)
    return {
        "cards": len(inventory.cards),
        "instances": instances,
        "granted": len(grants),
        "iterations": iterations,
        "assembled_bytes_ms_median": round(statistics.median(bytes_ms), 2),
        "assembled_bytes_ms_p99": round(pct(bytes_ms, 99), 2),
        "assembled_bytes_cpu_ms_median": round(statistics.median(bytes_cpu_ms), 2),
        "build_stats_plus_serialize_ms_median": round(statistics.median(message_ms), 2),
        "ratio_assembled_to_message_path": round(statistics.median(bytes_ms) / statistics.median(message_ms), 2),
        "response_bytes": size,
    }


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def growth(iterations: int, sizes: Sequence[int]) -> dict[str, object]:
    """Median assembled-response CPU time per node size and the log-log slope (1.0 = linear)."""
    points = [(n, time_build(iterations, n)["assembled_bytes_cpu_ms_median"]) for n in sizes]
    xs = [math.log(n) for n, _ in points]
    ys = [math.log(ms) for _, ms in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return {"ms_by_cards": dict(points), "exponent": round(slope, 2)}


def run_load(duration: float, interval: float, n_cards: int = CARDS) -> dict[str, float]:
    catalog, inventory, grants = node(n_cards)
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
        for _data in engine.serialized_responses(interval, cancel):  # what the plugin sends
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
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "duration_s": round(wall1 - wall0, 1),
        "interval_s": interval,
        "responses": responses,
        "scrapes": scrapes,
        "cache_updates": feed.cache.update_count,
        "cpu_percent_of_one_core": round(100 * (cpu1 - cpu0) / (wall1 - wall0), 2),
        "max_rss_mib": round(rss_mib, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of load (issue asks for 600)")
    parser.add_argument("--interval", type=float, default=1.0, help="collection and push interval, seconds")
    parser.add_argument("--iterations", type=int, default=200, help="build_stats runs to time")
    parser.add_argument("--skip-load", action="store_true", help="only time one build")
    parser.add_argument("--cards", type=int, default=CARDS, help="cards (half tdm x7, half MIG x7; half granted)")
    parser.add_argument("--growth", action="store_true", help="also time 16, 64 and 256 cards: growth exponent")
    args = parser.parse_args(argv)
    result: dict[str, object] = {"build": time_build(args.iterations, args.cards)}
    if args.growth:
        result["growth"] = growth(max(10, args.iterations // 10), (16, 64, 256))
    if not args.skip_load:
        result["load"] = run_load(args.duration, args.interval, args.cards)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
