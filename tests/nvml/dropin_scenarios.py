"""The nodes the drop-in comparison runs: typical ones, and every edge the official plugin's code has.

H100 and A100 nodes with MIG off, on and empty; readings NVML answers
NotSupported for; readings it cannot take at all; GH200 and GB10; every
PCIe generation of the official lane table; same-model cards whose readings
differ (UUID order against index order); ignored GPUs, MIG instances and
MIG parents; ``enabled = false``; an empty node; and the agent-block values
Go's ``time.ParseDuration`` takes.
"""

from __future__ import annotations

from typing import Any

from tests.doubles.fake_pynvml import (
    NVML_ERROR_NO_PERMISSION,
    NVML_ERROR_NOT_SUPPORTED,
    FakeMig,
    a100_mig,
    gb10,
    gh200,
    h100,
    h200,
    l40s,
)
from tests.nvml.dropin import Scenario, gpus

NS, NO_PERMISSION = NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_NO_PERMISSION


def _ids(groups: list[dict[str, Any]]) -> list[str]:
    return [d["id"] for g in groups for d in g["devices"]]


def _first_group(groups: list[dict[str, Any]]) -> list[str]:
    return [d["id"] for d in sorted(groups, key=lambda g: g["name"])[0]["devices"]]


def _reversed_group(groups: list[dict[str, Any]]) -> list[str]:
    """Every device of the largest group, last UUID first: Reserve keeps the order it was asked in."""
    return [d["id"] for d in max(groups, key=lambda g: len(g["devices"]))["devices"]][::-1]


def _one_mig(groups: list[dict[str, Any]]) -> list[str]:
    return [next(i for i in _ids(groups) if i.startswith("MIG-"))]


def h100_node(count: int = 8) -> list[dict[str, Any]]:
    made = [h100(i) for i in range(count)]
    for n, gpu in enumerate(made):
        gpu.power_mw = 70_000 + 1_000 * n
        gpu.memory_used_mib = 512 * n
    return gpus(*made)


def a100_mig_node() -> list[dict[str, Any]]:
    return gpus(a100_mig(0), a100_mig(1))


def h100_mig() -> list[dict[str, Any]]:
    gpu = h100(0)
    gpu.mig_enabled = True
    gpu.migs = [
        FakeMig("1g.10gb", 9856, gpu_instance_id=9, slices=1, uuid="MIG-h100-gi9"),
        FakeMig("1g.10gb", 9856, gpu_instance_id=10, slices=1, uuid="MIG-h100-gi10"),
        FakeMig("3g.40gb", 40192, gpu_instance_id=2, slices=3, uuid="MIG-h100-gi2"),
    ]
    return gpus(gpu, h100(1))


def mig_on_without_instances() -> list[dict[str, Any]]:
    empty = a100_mig(0)
    empty.migs = []
    return gpus(empty, h100(1))


def unsupported_readings() -> list[dict[str, Any]]:
    gpu = h100(0)
    gpu.errors = {
        "nvmlDeviceGetPowerUsage": NS,
        "nvmlDeviceGetTemperature": NS,
        "nvmlDeviceGetDetailedEccErrors": NS,
        "nvmlDeviceGetMemoryErrorCounter": NS,
        "nvmlDeviceGetMaxPcieLinkGeneration": NS,
        "nvmlDeviceGetMaxPcieLinkWidth": NS,
        "nvmlDeviceGetBAR1MemoryInfo": NS,
        "nvmlDeviceGetClockInfo:2": NS,
    }
    return gpus(gpu)


def fatal_to_the_official(kind: str) -> list[dict[str, Any]]:
    """Readings whose failure the official turns into an error for the whole response."""
    gpu = h100(0)
    gpu.errors = {
        "display": {"nvmlDeviceGetDisplayMode": NS},
        "cores_clock": {"nvmlDeviceGetClockInfo:0": NS},
        "encoder": {"nvmlDeviceGetEncoderUtilization": NS},
        "temperature_denied": {"nvmlDeviceGetTemperature": NO_PERMISSION},
    }[kind]
    return gpus(gpu, h100(1))


def pcie_table() -> list[dict[str, Any]]:
    made = []
    for gen in range(1, 7):
        gpu = h100(gen)
        gpu.name = f"NVIDIA H100 PCIe gen{gen}"
        gpu.pcie_gen, gpu.pcie_width = gen, 8 if gen % 2 else 16
        made.append(gpu)
    return gpus(*made)


def same_model_differs() -> list[dict[str, Any]]:
    """Two L40S: index 0 has the higher UUID, ECC on and persistence off, so index order != UUID order."""
    first, second = l40s(0, ecc=True), l40s(1, ecc=False)
    first.uuid, second.uuid = "GPU-f0000000-0000-0000-0000-000000000000", "GPU-a0000000-0000-0000-0000-000000000000"
    first.persistence_mode, second.persistence_mode = 0, 1
    first.power_mw, second.power_mw = 120_000, 36_000
    first.graphics_clock_mhz, second.graphics_clock_mhz = 2520, 210
    return gpus(first, second)


def ignore_node() -> list[dict[str, Any]]:
    return gpus(h100(0), h100(1), a100_mig(2))


SCENARIOS: list[Scenario] = [
    Scenario("h100-x8", h100_node(), reserves=[_reversed_group, lambda g: _ids(g)[:1], [], ["GPU-not-here"]]),
    Scenario("h100+h200+a100-mig", gpus(h100(0), h200(1), a100_mig(2)), reserves=[_one_mig, _first_group]),
    Scenario("a100-mig-x2", a100_mig_node(), reserves=[_one_mig, _reversed_group]),
    Scenario("h100-mig", h100_mig(), reserves=[_one_mig, lambda g: ["MIG-h100-gi10", "MIG-h100-gi9"]]),
    Scenario("mig-on-no-instances", mig_on_without_instances(), reserves=[_ids]),
    Scenario("unsupported-readings", unsupported_readings()),
    Scenario("gh200", gpus(gh200(0))),
    Scenario("gb10", gpus(gb10()), reserves=[_ids]),
    Scenario("pcie-table", pcie_table()),
    Scenario("same-model-differs", same_model_differs(), reserves=[_reversed_group]),
    Scenario(
        "ignored",
        ignore_node(),
        config={
            "ignored_gpu_ids": [
                ignore_node()[0]["uuid"],
                ignore_node()[2]["uuid"],
                ignore_node()[2]["migs"][1]["uuid"],
            ]
        },
        reserves=[_first_group, [ignore_node()[0]["uuid"]]],
    ),
    Scenario("enabled-false", gpus(h100(0), h100(1)), config={"enabled": False}, empty=True),
    Scenario("empty-node", [], empty=True),
    Scenario("fatal-display-mode", fatal_to_the_official("display")),
    Scenario("fatal-cores-clock", fatal_to_the_official("cores_clock")),
    Scenario("fatal-encoder", fatal_to_the_official("encoder")),
    Scenario("fatal-temperature-denied", fatal_to_the_official("temperature_denied")),
    Scenario("period-0s", gpus(h100(0)), config={"fingerprint_period": "0s", "ignored_gpu_ids": [""]}),
    Scenario("period-negative", gpus(h100(0)), config={"fingerprint_period": "-1s"}),
    Scenario("period-1000h", gpus(h100(0)), config={"fingerprint_period": "1000h"}),
]
