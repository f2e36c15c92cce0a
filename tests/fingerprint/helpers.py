"""Inventories, a fake backend and a fake clock for the fingerprint tests."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import replace

from nomad_plugin.model.card import Card, Inventory, parse_topology
from nomad_plugin.model.grant import Grant, GrantRequest
from nomad_plugin.model.metrics import MetricSample
from tests.seed_topologies import E810_GPU0 as SEED_810E_GPU0
from tests.seed_topologies import M890P_GPU0 as SEED_M890P_GPU0


def _m890p_json(i: int) -> str:
    if i == 0:
        return SEED_M890P_GPU0
    pair, quad = i // 2, i // 4
    levels = [
        {"level": 1, "name": "pcieSwitches", "topo1": [pair], "peers": [2 * pair, 2 * pair + 1]},
        {"level": 2, "name": "numaNodes", "topo2": [pair], "peers": [2 * pair, 2 * pair + 1]},
        {"level": 3, "name": "cpuSockets", "topo3": [quad], "peers": list(range(4 * quad, 4 * quad + 4))},
        {"level": 11, "name": "hyperNode", "topo11": "hypernode-001"},
        {"level": 21, "name": "leafSwitch", "topo21": "asw-001"},
        {"level": 22, "name": "pointOfDelivery", "topo22": "pod-g13-p1"},
    ]
    return json.dumps({"levels": levels})


def _810e_json(i: int) -> str:
    if i == 0:
        return SEED_810E_GPU0
    numa = 1 if i in (0, 1, 2, 3, 8, 9, 10, 11) else 0
    levels = [
        # levels deliberately out of order: consumers must key on names
        {"level": 5, "name": "numaNodes", "topo5": [numa]},
        {"level": 1, "name": "icnLink2", "topo1": [i // 2]},
        {"level": 2, "name": "icnLink4", "topo2": [i // 4]},
        {"level": 3, "name": "icnLink8", "topo3": [i // 8]},
        {"level": 4, "name": "pcieSwitches", "topo4": [4 + i // 4]},
        {"level": 6, "name": "cpuSockets", "topo6": [i // 8]},
        {"level": 21, "name": "leafSwitch", "topo21": "ASW-VM-SQA-G10-P2-S25"},
        {"level": 22, "name": "pointOfDelivery", "topo22": "VM-SQA-G10-P2"},
    ]
    return json.dumps({"levels": levels})


def m890p_node(n: int = 8) -> Inventory:
    cards = tuple(
        Card(
            minor=i,
            uuid=f"PPU-m890p-{i:04d}",
            model="PPU M890P",
            vendor="alibaba",
            xpu_type="ppu",
            memory_mib=147456,
            pci_bus_id=f"00000000:{0x10 + i:02X}:00.0",
            driver_version="1.5.2",
            topology=parse_topology(_m890p_json(i)),
        )
        for i in range(n)
    )
    return Inventory(cards=cards, node={"runtime_kit": "enabled"}, generation=1)


def ppu810e_node(n: int = 16) -> Inventory:
    cards = tuple(
        Card(
            minor=i,
            uuid=f"PPU-810e-{i:04d}",
            model="PPU 810E",
            vendor="alibaba",
            xpu_type="ppu",
            memory_mib=98304,
            pci_bus_id=f"0000:{0x40 + i:02x}:00.0",
            topology=parse_topology(_810e_json(i)),
        )
        for i in range(n)
    )
    return Inventory(cards=cards, node={"driver_version": "2.0.1"}, generation=1)


def h800_node(n: int = 8, *, model: str = "NVIDIA H800", memory_mib: int = 81559) -> Inventory:
    cards = []
    for i in range(n):
        topo = {
            "levels": [
                {"level": 1, "name": "pcieSwitches", "topo1": [i // 2]},
                {"level": 2, "name": "numaNodes", "topo2": [i // 4]},
                {"level": 3, "name": "cpuSockets", "topo3": [i // 4]},
                {"level": 21, "name": "leafSwitch", "topo21": "asw-007"},
            ]
        }
        cards.append(
            Card(
                minor=i,
                uuid=f"GPU-{i:08x}-aaaa-bbbb-cccc-000000000000",
                model=model,
                vendor="nvidia",
                xpu_type="gpu",
                memory_mib=memory_mib,
                pci_bus_id=f"00000000:{0x18 + 0x10 * i:02X}:00.0",
                driver_version="535.161.08",
                numa_node=i // 4,
                topology=parse_topology(json.dumps(topo)),
            )
        )
    return Inventory(cards=tuple(cards), generation=1)


def with_health(inv: Inventory, minor: int, healthy: bool, reason: str = "") -> Inventory:
    cards = tuple(replace(c, healthy=healthy, health_reason=reason) if c.minor == minor else c for c in inv.cards)
    return replace(inv, cards=cards, generation=inv.generation + 1)


class FakeClock:
    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self.now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.now += seconds


class FakeBackend:
    """Implements the Backend protocol's inventory side; pushes on demand."""

    name = "xdm"

    def __init__(self, inventory: Inventory | None = None) -> None:
        self._inventory = inventory or Inventory()
        self._listeners: list[Callable[[Inventory], None]] = []
        self._lock = threading.Lock()

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def inventory(self) -> Inventory:
        return self._inventory

    def subscribe(self, listener: Callable[[Inventory], None]) -> Callable[[], None]:
        with self._lock:
            self._listeners.append(listener)

        def unsubscribe() -> None:
            with self._lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)

        return unsubscribe

    def push(self, inventory: Inventory) -> None:
        self._inventory = inventory
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            listener(inventory)

    @property
    def listener_count(self) -> int:
        with self._lock:
            return len(self._listeners)

    def allocate(self, request: GrantRequest) -> Grant:
        raise NotImplementedError

    def release(self, grant_id: str) -> None:
        raise NotImplementedError

    def metrics_snapshot(self) -> list[MetricSample]:
        return []

    def metrics_stream(self, cancel: threading.Event):  # type: ignore[no-untyped-def]
        return iter(())
