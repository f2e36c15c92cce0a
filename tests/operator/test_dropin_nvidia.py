"""A drop-in for hashicorp/nomad-device-nvidia: its config keys, attributes, stats and job files.

Facts checked against its source (device.go, fingerprint.go, stats.go,
nvml/driver_linux.go): ``enabled`` false reports no devices; ``ignored_gpu_ids``
hides GPU and MIG UUIDs; ``fingerprint_period`` is how often cards are re-read;
``power`` is the draw (W), clocks the current ones (MHz), ``bar1`` MiB,
``pci_bandwidth`` MB/s from its per-lane table.
"""

from __future__ import annotations

import json
from pathlib import Path

import msgpack
import pytest

from nomad_plugin.cli import check_job
from nomad_plugin.config.decode import decode_config
from nomad_plugin.config.model import PluginConfig
from nomad_plugin.jobspec import evaluate_job, parse_job_text
from nomad_plugin.launcher.config import load_config, msgpack_config
from nomad_plugin.launcher.convert import device_groups
from nomad_plugin.launcher.live import LiveNode
from nomad_plugin.model.card import Inventory
from nomad_plugin.model.catalog import build_catalog
from nomad_plugin.model.errors import ConfigError
from nomad_plugin.model.instances import Attr
from nomad_plugin.nomad.fingerprint import build_response
from nomad_plugin.nvml.backend import NvmlBackend
from nomad_plugin.nvml.devices import FirstReadings
from nomad_plugin.testing.fake_pynvml import FakeNvml, h100

JOBS = Path(__file__).parent / "official_jobs"
XDM_JOBS = ["gpu-test.nomad.hcl", "device-docs.nomad.hcl", "common-constraints.nomad.hcl"]
OFFICIAL_ATTRS = {
    "memory": "MiB",
    "power": "W",
    "bar1": "MiB",
    "driver_version": "",
    "cores_clock": "MHz",
    "memory_clock": "MHz",
    "pci_bandwidth": "MB/s",
    "display_state": "",
    "persistence_mode": "",
}


def decode(**values: object) -> PluginConfig:
    return decode_config(msgpack.packb(values))


# --- config keys --------------------------------------------------------------------


def test_official_config_block_is_accepted_with_its_meaning() -> None:
    config = decode(enabled=True, ignored_gpu_ids=["GPU-fef8089b", "GPU-ac81e44d"], fingerprint_period="5s")
    assert config.enabled and config.ignored_gpu_ids == ("GPU-fef8089b", "GPU-ac81e44d")
    assert config.fingerprint_period == config.inventory_resync_period == 5.0
    # Nomad fills every default in: fingerprint_period "" leaves inventory_resync_period alone
    assert decode(fingerprint_period="", inventory_resync_period="30s").inventory_resync_period == 30.0
    assert decode(fingerprint_period="30s", inventory_resync_period="30s").inventory_resync_period == 30.0
    assert decode(fingerprint_period="30s", inventory_resync_period="1m").inventory_resync_period == 30.0


def test_the_official_docs_plugin_block_loads_as_ours(tmp_path: Path) -> None:
    """Nomad's nvidia.mdx example block, renamed to this plugin, goes through the agent's SetConfig path."""
    agent = tmp_path / "plugin.hcl"
    agent.write_text(
        'plugin "nomad-device-lingjun" {\n  config {\n    enabled            = true\n'
        '    ignored_gpu_ids    = ["GPU-fef8089b", "GPU-ac81e44d"]\n    fingerprint_period = "1m"\n  }\n}\n'
    )
    config = decode_config(msgpack_config(load_config(agent)))
    assert config.ignored_gpu_ids == ("GPU-fef8089b", "GPU-ac81e44d") and config.inventory_resync_period == 60.0


@pytest.mark.parametrize(
    ("values", "needle"),
    [
        ({"fingerprint_period": "5 minutes"}, "config option \"fingerprint_period\": value '5 minutes'"),
        ({"fingerprint_period": "0s"}, "fingerprint_period"),
        ({"fingerprint_period": "10s", "inventory_resync_period": "20s"}, "disagree"),
        ({"enabled": "yes"}, 'config option "enabled"'),
        ({"ignored_gpu_ids": "GPU-1"}, 'config option "ignored_gpu_ids"'),
    ],
)
def test_bad_official_values_name_the_key(values: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        decode(**values)
    assert needle in str(err.value)


def test_enabled_false_and_ignored_gpu_ids_in_the_catalog() -> None:
    fake = FakeNvml()
    inventory = nvml_inventory(fake)
    assert build_catalog(inventory, PluginConfig(enabled=False)).groups == ()
    h100_uuid, mig_uuid = fake.gpus[0].uuid, fake.gpus[2].migs[0].uuid
    catalog = build_catalog(inventory, PluginConfig(ignored_gpu_ids=(h100_uuid, mig_uuid)))
    ids = {i.id for g in catalog.groups for i in g.instances}
    assert h100_uuid not in ids and mig_uuid not in ids
    assert fake.gpus[1].uuid in ids and fake.gpus[2].migs[1].uuid in ids


def test_enabled_false_fingerprints_no_devices_from_the_real_plugin() -> None:
    with LiveNode(None, ["enabled=false"], "h800-8", None, None) as node:
        assert node.session is not None
        hit = node.session.fingerprints.wait_for(lambda groups: True, 20.0)
        assert hit is not None, "awaited the first fingerprint of a disabled plugin"
        assert hit[1] == []
        later = node.session.fingerprints.wait_for(lambda groups: bool(groups), 1.0, after=1)
        assert later is None, "a disabled plugin must never fingerprint a device"
        with pytest.raises(Exception, match="disabled"):
            node.session.plugin.reserve(["GPU-any"])


def test_ignored_gpu_ids_hides_a_card_of_the_real_plugin() -> None:
    with LiveNode(None, [], "h800-8", None, None) as node:
        first = node.devices()
    hidden = first[0].devices[0].id
    with LiveNode(None, [f'ignored_gpu_ids=["{hidden}"]'], "h800-8", None, None) as node:
        groups = node.devices()
    assert sum(len(g.devices) for g in groups) == sum(len(g.devices) for g in first) - 1
    assert hidden not in {d.id for g in groups for d in g.devices}


# --- attributes -------------------------------------------------------------------------


def nvml_inventory(fake: FakeNvml) -> Inventory:
    backend = NvmlBackend(PluginConfig(), nvml=fake, sysfs_root="/nonexistent", event_timeout_ms=20)
    backend.start()
    try:
        assert backend.wait_ready(10.0), "awaited the NVML backend's first inventory"
        return backend.inventory()
    finally:
        backend.stop()


def test_every_official_attribute_with_its_unit_and_meaning() -> None:
    fake = FakeNvml([h100(i) for i in range(2)])
    fake.gpus[0].power_mw, fake.gpus[1].power_mw = 312_900, 95_000  # draws differ per card
    fake.gpus[1].graphics_clock_mhz = 345  # an idle card's current clock
    (group,) = build_catalog(nvml_inventory(fake), PluginConfig()).groups
    attrs = group.attributes
    for name, unit in OFFICIAL_ATTRS.items():
        assert name in attrs, f"official attribute {name} missing"
        assert attrs[name].unit == unit, name
    assert attrs["power"] == Attr(312, "W")  # the draw, whole W, from the group's first card (as the official)
    assert attrs["power_limit"] == Attr(700, "W")  # ours: the limit, under its own name
    assert attrs["cores_clock"] == Attr(1980, "MHz") and attrs["memory_clock"] == Attr(2619, "MHz")
    assert attrs["bar1"] == Attr(131072, "MiB")
    assert attrs["pci_bandwidth"] == Attr(3072 * 16, "MB/s")  # gen5 x16 in the official table
    assert attrs["display_state"] == Attr("Disabled") and attrs["persistence_mode"] == Attr("Enabled")


def test_power_and_clocks_are_read_once_per_card() -> None:
    first = FirstReadings()
    seen = first.apply("GPU-a", {"power": "300", "cores_clock": "1980", "bar1": "1"})
    again = first.apply("GPU-a", {"power": "90", "cores_clock": "345", "bar1": "2"})
    assert seen == {"power": "300", "cores_clock": "1980", "bar1": "1"}
    assert again == {"power": "300", "cores_clock": "1980", "bar1": "2"}  # static facts still follow NVML
    assert first.apply("GPU-b", {"power": "90"}) == {"power": "90"}


def test_pci_bandwidth_uses_the_official_lane_table() -> None:
    fake = FakeNvml([h100(0), h100(1), h100(2)])
    for gpu, gen in zip(fake.gpus, (3, 4, 2), strict=True):
        gpu.pcie_gen, gpu.pcie_width = gen, 8
    cards = {c.minor: c for c in nvml_inventory(fake).cards}
    assert [cards[m].extra["pci_bandwidth"] for m in range(3)] == [str(1024 * 8), str(2048 * 8), "0"]


# --- job files written for the official plugin -----------------------------------------


@pytest.mark.parametrize("name", XDM_JOBS)
def test_official_job_passes_check_job_against_an_nvidia_profile(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = check_job.main([str(JOBS / name), "--profile", "h800-8", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0, json.dumps(doc["requests"], indent=1)[:3000]
    assert doc["ok"] and doc["requests"]


def test_nvml_attribute_constraints_pass_against_an_nvml_node(tmp_path: Path) -> None:
    """The constraints on bar1, clocks, power, bandwidth and modes hold on an NVML-fingerprinted node."""
    inventory = nvml_inventory(FakeNvml([h100(i) for i in range(4)]))
    response = build_response(build_catalog(inventory, PluginConfig()), {})
    groups = device_groups(response)
    saved = tmp_path / "fp.json"
    saved.write_text(json.dumps({"groups": [g.to_json() for g in groups]}))
    requests = parse_job_text((JOBS / "nvml-attributes.nomad.hcl").read_text())
    verdicts = evaluate_job(requests, groups)
    assert verdicts and all(v.ok for v in verdicts), [g.reasons for v in verdicts for g in v.groups]
    assert check_job.main([str(JOBS / "nvml-attributes.nomad.hcl"), "--fingerprint", str(saved)]) == 0
