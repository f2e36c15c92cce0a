from __future__ import annotations

from nomad_plugin.model.card import Card, Inventory
from nomad_plugin.nvml.companion import CardFacts, Enricher, apply_facts, enrich, read_facts
from tests.doubles.fake_pynvml import NVML_ERROR_DRIVER_NOT_LOADED, FakeNvml, write_sysfs_numa


def _xdm_card(minor: int, uuid: str, **kw) -> Card:
    kw.setdefault("vendor", "nvidia")
    return Card(minor=minor, uuid=uuid, model="H100", xpu_type="gpu", memory_mib=81559, **kw)


def test_fills_pci_numa_and_clocks_matching_by_uuid(fake: FakeNvml, tmp_path) -> None:
    fake.nvmlInit()
    write_sysfs_numa(tmp_path, "0000:39:00.0", 1)
    inv = Inventory(cards=(_xdm_card(7, fake.gpus[1].uuid),), node={"driver_version": "550.54.15"}, generation=4)
    out = enrich(inv, fake, str(tmp_path))
    card = out.cards[0]
    assert (card.minor, card.pci_bus_id, card.numa_node) == (7, "0000:39:00.0", 1)
    assert card.extra["cores_clock"] == "1980" and card.extra["memory_clock"] == "3201"
    assert card.extra["power_limit"] == "700" and card.extra["power"] == "72"  # limit and draw, W
    assert card.extra["pci_bandwidth"] == str(3072 * 16)  # nomad-device-nvidia's gen5 lane rate x16
    assert card.extra["bar1"] == "131072"
    assert (card.extra["display_state"], card.extra["persistence_mode"]) == (
        "0",
        "1",
    )  # the enum number, as the official
    assert out.generation == 4 and out.node == inv.node


def test_falls_back_to_minor_when_uuid_unknown(fake: FakeNvml) -> None:
    fake.nvmlInit()
    inv = Inventory(cards=(_xdm_card(2, "xdm-serial-123"), _xdm_card(2, "ppu-1", vendor="alibaba")))
    out = enrich(inv, fake, "/nonexistent")
    assert out.cards[0].pci_bus_id == "0000:87:00.0" and out.cards[0].numa_node == 1
    assert out.cards[1] == inv.cards[1]  # another vendor's minor says nothing about NVML's cards


def test_xdm_values_win_and_unmatched_cards_untouched() -> None:
    facts = [CardFacts(uuid="GPU-a", minor=0, pci_bus_id="0000:18:00.0", numa_node=0, extra={"power_limit_w": "700"})]
    xdm = _xdm_card(0, "GPU-a", pci_bus_id="0000:1a:00.0", numa_node=1, extra={"power_limit_w": "650"})
    other = _xdm_card(4, "GPU-z")
    inv = Inventory(cards=(xdm, other))
    out = apply_facts(inv, facts)
    assert out.cards[0].pci_bus_id == "0000:1a:00.0" and out.cards[0].numa_node == 1
    assert out.cards[0].extra == {"power_limit_w": "650"}
    assert out.cards[1] is other
    assert apply_facts(Inventory(cards=(other,)), facts) == Inventory(cards=(other,))


def test_read_facts_skips_a_lost_card(fake: FakeNvml) -> None:
    fake.nvmlInit()
    fake.lose_gpu(0)
    facts = read_facts(fake, "/nonexistent")
    assert [f.uuid for f in facts] == [fake.gpus[1].uuid, fake.gpus[2].uuid]


def test_enricher_keeps_nvml_open_and_survives_failures() -> None:
    fake = FakeNvml()
    fake.init_error = NVML_ERROR_DRIVER_NOT_LOADED
    enricher = Enricher(nvml=fake, sysfs_root="/nonexistent")
    inv = Inventory(cards=(_xdm_card(0, fake.gpus[0].uuid),))
    assert enricher(inv) is inv
    assert "Driver Not Loaded" in enricher.last_error
    fake.init_error = None
    out = enricher(inv)
    assert out.cards[0].pci_bus_id == "0000:18:00.0" and enricher.last_error == ""
    enricher(inv)
    assert fake.init_count == 1  # initialised once, reused
    enricher.close()
    assert fake.init_count == 0


def test_enricher_without_bindings() -> None:
    from nomad_plugin.nvml import lib

    def missing():
        raise lib.NvmlMissing("the NVML backend needs the Python package nvidia-ml-py")

    enricher = Enricher(loader=missing)
    inv = Inventory(cards=(_xdm_card(0, "GPU-a"),))
    assert enricher(inv) is inv and "nvidia-ml-py" in enricher.last_error
