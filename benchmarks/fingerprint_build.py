"""Fingerprint cost and health-change propagation, in-process.

1. Build-and-serialise: a 16-card H800 node. A card has one mode, so the
   "16 x (1 whole + 10 shares + 7 MIG units)" load is measured two ways:
   (a) the full pipeline (build_catalog -> verdicts -> response -> sanitize ->
       serialise) for the whole, tdm-10 and mig catalogs of the same 16 cards,
       summed;
   (b) one response holding all three catalogs' groups at once (33 groups,
       288 instances: their IDs and group keys are disjoint), built, sanitised
       and serialised as one message.
   Target: <= 5 ms.
2. Health-change propagation: from a backend notification (listener call) to
   the engine's ``responses()`` generator yielding the changed response on
   another thread. Target: p99 <= 100 ms.

Run: .venv/bin/python benchmarks/fingerprint_build.py [--iterations N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nomad_plugin.config.model import CardRule, PluginConfig
from nomad_plugin.model.card import Card, Inventory, parse_topology
from nomad_plugin.model.instances import Catalog
from nomad_plugin.nomad.catalog import build_catalog
from nomad_plugin.nomad.fingerprint import (
    FingerprintEngine,
    HealthTracker,
    build_response,
    conflict_reasons,
    instance_verdicts,
    sanitize,
    serialize,
)


def node(cards: int = 16) -> Inventory:
    out = []
    for i in range(cards):
        topo = (
            '{"levels": ['
            f'{{"level": 1, "name": "pcieSwitches", "topo1": [{i // 2}], "peers": [{i - i % 2}, {i - i % 2 + 1}]}},'
            f'{{"level": 2, "name": "numaNodes", "topo2": [{i // 8}]}},'
            f'{{"level": 3, "name": "cpuSockets", "topo3": [{i // 8}]}},'
            '{"level": 11, "name": "hyperNode", "topo11": "hypernode-001"},'
            '{"level": 21, "name": "leafSwitch", "topo21": "asw-001"},'
            '{"level": 22, "name": "pointOfDelivery", "topo22": "pod-g13-p1"}]}'
        )
        out.append(
            Card(
                minor=i,
                uuid=f"GPU-{i:08x}-1111-2222-3333-444455556666",
                model="NVIDIA H800",
                vendor="nvidia",
                xpu_type="gpu",
                memory_mib=81559,
                pci_bus_id=f"00000000:{i + 0x10:02X}:00.0",
                driver_version="535.161.08",
                topology=parse_topology(topo),
            )
        )
    return Inventory(cards=tuple(out), node={"runtime_kit": "enabled"})


def pipeline(inv: Inventory, config: PluginConfig, tracker: HealthTracker) -> bytes:
    catalog = build_catalog(inv, config)
    verdicts = instance_verdicts(catalog, tracker.verdicts(), conflict_reasons(catalog, {}), None)
    response, problems = sanitize(build_response(catalog, verdicts))
    assert not problems, problems
    return serialize(response)


def timed(fn: Callable[[], object], iterations: int) -> list[float]:
    fn()  # warm-up
    samples = []
    for _ in range(iterations):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1000)
    return samples


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def show(label: str, samples: list[float], unit: str = "ms") -> None:
    print(
        f"{label:<52} median {statistics.median(samples):7.3f} {unit}  "
        f"p99 {pct(samples, 0.99):7.3f} {unit}  max {max(samples):7.3f} {unit}"
    )


def bench_build(iterations: int) -> None:
    inv = node()
    tracker = HealthTracker()
    tracker.observe({c.uuid: (True, "") for c in inv.cards})
    configs = {
        "whole": PluginConfig(),
        "tdm-10": PluginConfig(default_mode="tdm", tdm_shares=10),
        "mig": PluginConfig(default_mode="mig"),
    }
    totals = [0.0] * iterations
    for name, cfg in configs.items():
        samples = timed(lambda cfg=cfg: pipeline(inv, cfg, tracker), iterations)
        totals = [a + b for a, b in zip(totals, samples, strict=True)]
        show(f"full pipeline, 16 cards {name}", samples)
    show("(a) sum whole + tdm-10 + mig (16 x 18 instances)", totals)

    merged = Catalog(tuple(g for cfg in configs.values() for g in build_catalog(inv, cfg).groups))
    count = len(merged.all_ids())
    size = len(serialize(build_response(merged, {})))

    def one_message() -> bytes:
        verdicts = instance_verdicts(merged, tracker.verdicts(), conflict_reasons(merged, {}), None)
        response, _ = sanitize(build_response(merged, verdicts))
        return serialize(response)

    show(
        f"(b) one response, {len(merged.groups)} groups / {count} instances ({size} B)", timed(one_message, iterations)
    )

    def catalogs_only() -> None:
        for cfg in configs.values():
            build_catalog(inv, cfg)

    show("    of which build_catalog x3", timed(catalogs_only, iterations))


class _Backend:
    name = "xdm"

    def __init__(self, inventory: Inventory) -> None:
        self.current = inventory
        self.listeners: list[Callable[[Inventory], None]] = []

    def inventory(self) -> Inventory:
        return self.current

    def subscribe(self, listener: Callable[[Inventory], None]) -> Callable[[], None]:
        self.listeners.append(listener)
        return lambda: self.listeners.remove(listener)

    def push(self, inventory: Inventory) -> None:
        self.current = inventory
        for listener in list(self.listeners):
            listener(inventory)


def bench_propagation(label: str, config: PluginConfig, flips: int) -> None:
    inv = node()
    backend = _Backend(inv)
    engine = FingerprintEngine(backend, replace(config, health_recovery_checks=1))  # type: ignore[arg-type]
    engine.start()
    cancel = threading.Event()
    received: list[float] = []
    arrived = threading.Semaphore(0)

    def consume() -> None:
        for _ in engine.responses(cancel):
            received.append(time.perf_counter())
            arrived.release()

    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    arrived.acquire()  # the first response
    samples = []
    for n in range(flips):
        cards = tuple(
            replace(c, healthy=(n % 2 == 1), health_reason="XID 79") if c.minor == 5 else c for c in inv.cards
        )
        start = time.perf_counter()
        backend.push(replace(inv, cards=cards, generation=n + 2))
        if not arrived.acquire(timeout=5):
            raise SystemExit(f"flip {n}: no response within 5 s")
        samples.append((received[-1] - start) * 1000)
    cancel.set()
    consumer.join(timeout=2)
    engine.stop()
    show(f"notification -> yield, {label} ({flips} flips)", samples)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--flips", type=int, default=400)
    args = parser.parse_args()
    print(f"python {sys.version.split()[0]}, {args.iterations} iterations")
    bench_build(args.iterations)
    bench_propagation("16 x whole", PluginConfig(), args.flips)
    bench_propagation("16 x tdm-10", PluginConfig(default_mode="tdm"), args.flips)
    mixed = PluginConfig(cards=tuple(CardRule(str(i), "tdm" if i < 8 else "mig") for i in range(4, 16)))
    bench_propagation("mixed whole/tdm/mig", mixed, args.flips)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
