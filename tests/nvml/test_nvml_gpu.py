"""Checks against a real NVIDIA GPU; skipped (with a reason) where NVML is absent."""

from __future__ import annotations

import threading

import pytest

from nomad_plugin.model.grant import DeviceAsk, GrantRequest
from nomad_plugin.nvml.backend import NvmlBackend
from nomad_plugin.nvml.lib import nvml_unavailable_reason

_WHY = nvml_unavailable_reason()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_WHY != "", reason=f"no usable NVML here: {_WHY[:120]}")]


@pytest.fixture
def backend():
    b = NvmlBackend()
    b.start()
    assert b.wait_ready(30), b.inventory().unreachable_reason
    yield b
    b.stop()


def test_real_inventory(backend: NvmlBackend) -> None:
    inv = backend.inventory()
    assert inv.reachable and inv.cards
    assert inv.node["driver_version"]
    for card in inv.cards:
        assert card.uuid.startswith("GPU-") and card.memory_mib > 0 and card.vendor == "nvidia"
        assert len(card.pci_bus_id) == 12 and card.pci_bus_id[4] == ":"


def test_real_readings_and_grant(backend: NvmlBackend) -> None:
    samples = backend.metrics_snapshot()
    card = backend.inventory().cards[0]
    names = {s.name for s in samples if s.device == card.uuid}
    assert {"memory_total_mib", "temperature_c", "health"} <= names
    grant = backend.allocate(GrantRequest("gpu-test", (DeviceAsk(minor=card.minor),)))
    assert grant.envs["NVIDIA_VISIBLE_DEVICES"] == card.uuid
    assert any(n.container_path == f"/dev/nvidia{card.minor}" for n in grant.device_nodes)
    cancel = threading.Event()
    for batch in backend.metrics_stream(cancel):
        assert batch
        cancel.set()
