from __future__ import annotations

from nomad_plugin.nvml.backend import NvmlBackend
from tests.doubles.fake_pynvml import NVML_ERROR_DRIVER_NOT_LOADED, FakeNvml, a100_mig, h100, write_sysfs_numa


def test_whole_cards_with_static_facts(fake: FakeNvml, make_backend) -> None:
    inv = make_backend(fake).inventory()
    assert inv.reachable
    assert inv.node == {"driver_version": "550.54.15", "cuda_version": "12.4", "source": "nvml"}
    h100_card, h200_card, a100_card = inv.cards
    assert (h100_card.model, h100_card.memory_mib, h100_card.minor) == ("NVIDIA H100 80GB HBM3", 81559, 0)
    assert (h200_card.model, h200_card.memory_mib) == ("NVIDIA H200", 143771)
    assert (a100_card.model, a100_card.memory_mib) == ("NVIDIA A100-SXM4-80GB", 81920)
    assert h100_card.uuid == fake.gpus[0].uuid and h100_card.uuid.startswith("GPU-")
    assert h100_card.pci_bus_id == "0000:18:00.0"
    assert {c.vendor for c in inv.cards} == {"nvidia"} and {c.xpu_type for c in inv.cards} == {"gpu"}
    assert all(c.driver_version == "550.54.15" and c.healthy for c in inv.cards)
    assert h100_card.extra["power_limit"] == "700" and h100_card.extra["power"] == "72"
    assert h100_card.extra["pci_bandwidth"] == str(3072 * 16)  # nomad-device-nvidia's table: gen5 x16
    assert a100_card.extra["pci_bandwidth"] == str(2048 * 16)  # gen4 x16
    assert h100_card.extra["cores_clock"] == "1980" and h200_card.extra["memory_clock"] == "3201"
    assert a100_card.extra["compute_capability"] == "8.0"
    # GPU Feature Discovery's family from the compute capability, and whether NVML has MIG on the card
    assert (h100_card.extra["architecture"], a100_card.extra["architecture"]) == ("hopper", "ampere")
    assert h100_card.extra["mig_capable"] == "true"


def test_mig_instances_reported_only_where_mig_is_on(fake: FakeNvml, make_backend) -> None:
    inv = make_backend(fake).inventory()
    h100_card, _, a100_card = inv.cards
    assert h100_card.mig_capable and h100_card.mig_instances == () and h100_card.extra["mig_mode"] == "disabled"
    assert a100_card.extra["mig_mode"] == "enabled"
    migs = {m.profile: m for m in a100_card.mig_instances}
    assert set(migs) == {"3g.40gb", "2g.20gb", "1g.10gb"}
    assert (migs["3g.40gb"].slices, migs["3g.40gb"].memory_mib, migs["3g.40gb"].gpu_instance_id) == (3, 40192, 2)
    assert (migs["1g.10gb"].slices, migs["1g.10gb"].memory_mib) == (1, 9728)
    assert all(m.uuid.startswith("MIG-") and m.compute_instance_id == 0 for m in migs.values())


def test_mig_not_capable_card(make_backend) -> None:
    gpu = h100(0)
    gpu.mig_capable = False
    card = make_backend(FakeNvml([gpu])).inventory().cards[0]
    assert not card.mig_capable and "mig_mode" not in card.extra


def test_numa_from_sysfs_first_then_nvml(tmp_path, make_backend) -> None:
    fake = FakeNvml([h100(0), h100(1), a100_mig(2)])
    write_sysfs_numa(tmp_path / "sys", "0000:18:00.0", 0)  # card 0: sysfs knows
    fake.gpus[2].numa_node = 1
    write_sysfs_numa(tmp_path / "sys", "0000:87:00.0", 3)  # sysfs wins over NVML's 1
    cards = make_backend(fake).inventory().cards
    assert [c.numa_node for c in cards] == [0, None, 3]
    fake2 = FakeNvml([a100_mig(0)])  # no sysfs file: NVML's answer
    assert make_backend(fake2).inventory().cards[0].numa_node == 1


def test_init_failure_is_unreachable_then_recovers(make_backend, wait_for) -> None:
    fake = FakeNvml()
    fake.init_error = NVML_ERROR_DRIVER_NOT_LOADED
    backend: NvmlBackend = make_backend(fake, start=False)
    seen = []
    backend.subscribe(seen.append)
    backend.start()
    assert wait_for(
        lambda: not backend.inventory().reachable and "Driver Not Loaded" in backend.inventory().unreachable_reason
    )
    assert "NVML error 9" in backend.inventory().unreachable_reason
    assert backend.inventory().unreachable_since > 0
    fake.init_error = None
    assert backend.wait_ready(5.0)
    assert wait_for(lambda: backend.inventory().reachable and len(backend.inventory().cards) == 3)
    assert fake.init_calls >= 2
    assert seen[-1].reachable and seen[0].reachable is False
    gens = [s.generation for s in seen]
    assert gens == sorted(gens) and len(set(gens)) == len(gens)


def test_unreadable_card_kept_visible_and_unhealthy(make_backend) -> None:
    fake = FakeNvml([h100(0), h100(1)])
    fake.gpus[1].lost = True  # lost before we ever read it
    inv = make_backend(fake).inventory()
    # NVML cannot even give a UUID for index 1: only card 0 can be reported.
    assert [c.minor for c in inv.cards] == [0]
    backend = make_backend(FakeNvml([h100(0), h100(1)]))
    backend_fake = backend._nvml
    backend_fake.gpus[1].lost = True
    backend._rescan(backend_fake)  # a resync while the card is lost
    card = backend.inventory().by_minor(1)
    assert card is not None and card.model == "NVIDIA H100 80GB HBM3"
    assert not card.healthy and "GPU is lost" in card.health_reason


def test_stop_is_prompt_and_shuts_nvml_down(fake: FakeNvml, make_backend) -> None:
    import time

    backend = make_backend(fake, event_timeout_ms=200)
    assert fake.init_count == 1
    t0 = time.monotonic()
    backend.stop()
    assert time.monotonic() - t0 < 1.5
    assert fake.init_count == 0
    backend.stop()  # idempotent
