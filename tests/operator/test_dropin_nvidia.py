"""A drop-in for hashicorp/nomad-device-nvidia: its config keys, attributes, stats and job files.

Facts checked against its source (device.go, fingerprint.go, stats.go,
nvml/driver_linux.go): ``enabled`` false reports no devices; ``ignored_gpu_ids``
hides GPU and MIG UUIDs; ``fingerprint_period`` is how often cards are re-read,
parsed as Go's time.ParseDuration parses it; ``power`` is the draw (W), clocks
the current ones (MHz), ``bar1`` MiB, ``pci_bandwidth`` MB/s from its per-lane
table, the two modes the enum's number. The item-by-item comparison with the
restated plugin is tests/nvml/test_dropin_compare.py; its own unit-test tables
run in tests/nvml/test_official_tests.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import msgpack
import pytest

from nomad_plugin.cli import check_job
from nomad_plugin.config.decode import decode_config
from nomad_plugin.config.model import ConfigError, PluginConfig
from nomad_plugin.jobspec import evaluate_job, parse_job_text
from nomad_plugin.launcher.config import load_config, msgpack_config
from nomad_plugin.launcher.process import LiveNode, device_groups
from nomad_plugin.model.card import Inventory
from nomad_plugin.model.instances import Attr
from nomad_plugin.nomad.catalog import build_catalog, check_modes
from nomad_plugin.nomad.fingerprint import build_response
from nomad_plugin.nvml.backend import NvmlBackend
from nomad_plugin.nvml.devices import FirstReadings
from tests.doubles.fake_pynvml import FakeNvml, h100

JOBS = Path(__file__).parent / "official_jobs"
POOL = ["--node-value", "node.pool=default", "--node-value", "node.datacenter=dc1"]  # Nomad's client defaults: scope.py
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
    # Nomad fills every default in (both "1m"): the one that differs from its default was written
    assert decode(fingerprint_period="1m", inventory_resync_period="30s").inventory_resync_period == 30.0
    assert decode(fingerprint_period="", inventory_resync_period="30s").inventory_resync_period == 30.0
    assert decode(fingerprint_period="30s", inventory_resync_period="30s").inventory_resync_period == 30.0
    assert decode(fingerprint_period="30s", inventory_resync_period="1m").inventory_resync_period == 30.0


def test_the_schema_defaults_are_the_officials() -> None:
    from nomad_plugin.config.options import option

    assert (option("enabled").default, option("ignored_gpu_ids").default, option("fingerprint_period").default) == (
        True,
        [],
        "1m",
    )


@pytest.mark.parametrize(
    ("values", "period", "in_use"),
    [
        ({"fingerprint_period": "0s"}, 0.0, 1.0),
        ({"fingerprint_period": "-1s"}, -1.0, 1.0),
        ({"fingerprint_period": "721h"}, 721 * 3600.0, 721 * 3600.0),
        ({"fingerprint_period": "1h2m3.5s"}, 3723.5, 3723.5),
    ],
)
def test_what_go_parse_duration_takes_loads(values: dict[str, object], period: float, in_use: float) -> None:
    """nomad-device-nvidia takes any time.ParseDuration value: an agent block that loads it loads this plugin."""
    config = decode(**values)
    assert (config.fingerprint_period, config.inventory_resync_period) == (period, in_use)


def test_an_empty_ignored_gpu_id_is_taken_and_matches_nothing() -> None:
    config = decode(ignored_gpu_ids=[""])
    assert config.ignored_gpu_ids == ("",)
    inventory = nvml_inventory(FakeNvml([h100(0)]))
    assert [i.id for g in build_catalog(inventory, config).groups for i in g.instances] == [inventory.cards[0].uuid]


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
        ({"fingerprint_period": "1d"}, "is not a Go duration"),
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
    # The parent of MIG instances is never fingerprinted there: naming it hides none of them, and says so.
    parent = fake.gpus[2].uuid
    config = PluginConfig(ignored_gpu_ids=(parent,))
    kept = {i.id for g in build_catalog(inventory, config).groups for i in g.instances}
    assert {m.uuid for m in fake.gpus[2].migs} <= kept
    assert any("hides none of its MIG instances" in p for p in check_modes(inventory, config))
    # ignored_ids (ours) hides the card with all carved from it.
    hidden = {i.id for g in build_catalog(inventory, PluginConfig(ignored_ids=(parent,))).groups for i in g.instances}
    assert not {m.uuid for m in fake.gpus[2].migs} & hidden


def test_enabled_false_fingerprints_no_devices_from_the_real_plugin() -> None:
    with LiveNode(None, ["enabled=false"], "h800-8", None, None) as node:
        assert node.session is not None
        hit = node.session.fingerprints.wait_for(lambda groups: True, 20.0)
        assert hit is not None, "awaited the first fingerprint of a disabled plugin"
        assert hit[1] == []
        later = node.session.fingerprints.wait_for(lambda groups: bool(groups), 1.0, after=1)
        assert later is None, "a disabled plugin must never fingerprint a device"
        with pytest.raises(Exception, match="device is not enabled"):
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
    first = min(fake.gpus, key=lambda g: g.uuid)  # the group's first card in UUID order, as the official
    assert attrs["power"] == Attr(first.power_mw // 1000, "W")  # the draw, whole W
    assert attrs["power_limit"] == Attr(700, "W")  # ours: the limit, under its own name
    assert attrs["cores_clock"] == Attr(first.graphics_clock_mhz, "MHz") and attrs["memory_clock"] == Attr(2619, "MHz")
    assert attrs["bar1"] == Attr(131072, "MiB")
    assert attrs["pci_bandwidth"] == Attr(3072 * 16, "MB/s")  # gen5 x16 in the official table
    assert attrs["display_state"] == Attr("0") and attrs["persistence_mode"] == Attr("1")  # the enum's number


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
    code = check_job.main([str(JOBS / name), "--profile", "h800-8", *POOL, "--json"])
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
    assert check_job.main([str(JOBS / "nvml-attributes.nomad.hcl"), "--fingerprint", str(saved), *POOL]) == 0


@pytest.mark.parametrize(
    ("operator", "value", "matches"), [("=", "1", False), ("=", "Enabled", False), ("is_set", "", True)]
)
def test_the_two_modes_compare_as_nomad_compares_a_string_with_a_literal(
    operator: str, value: str, matches: bool
) -> None:
    """persistence_mode is the string "1": Nomad parses the literal "1" as a number, and a number never equals a
    string (plugins/shared/structs/attribute.go), so only is_set tests it, on nomad-device-nvidia as here."""
    inventory = nvml_inventory(FakeNvml([h100(0)]))
    groups = device_groups(build_response(build_catalog(inventory, PluginConfig()), {}))
    clause = f'operator = "{operator}"' + (f'\n value = "{value}"' if value else "")
    job = (
        'job "j" {\n group "g" {\n task "t" {\n driver = "docker"\n config { image = "x" }\n resources {\n'
        ' device "nvidia/gpu" {\n constraint {\n attribute = "${device.attr.persistence_mode}"\n'
        f" {clause}\n }}\n }}\n }}\n }}\n }}\n}}\n"
    )
    verdicts = evaluate_job(parse_job_text(job), groups)
    assert [v.ok for v in verdicts] == [matches], [g.reasons for v in verdicts for g in v.groups]


# --- doctor warns where this plugin departs from the official one on purpose ------------------------


def _doctor(fake: FakeNvml, *sets: str) -> dict[str, list[str]]:
    from nomad_plugin.cli import doctor

    found = doctor.Doctor(overrides=['backend="nvml"', *sets], host=doctor.Host(nvml_loader=lambda: fake))
    found.check_config()
    assert found.config is not None, found.findings
    found.check_nvml()
    by: dict[str, list[str]] = {}
    for f in found.findings:
        by.setdefault(f.check, []).append(f"{f.status}: {f.summary} | {f.next_step}")
    return by


def test_doctor_warns_of_a_mig_card_without_instances_and_an_ignored_mig_parent() -> None:
    from tests.doubles.fake_pynvml import a100_mig

    empty, full = a100_mig(0), a100_mig(1)
    empty.migs = []
    found = _doctor(FakeNvml([empty, full]), f'ignored_gpu_ids=["{full.uuid}"]')
    (line,) = found["config vs cards"]
    assert line.startswith("warn:"), line
    assert "holds no MIG instance, so nothing of it is offered" in line
    assert f"ignored_gpu_ids names card 1 ({full.uuid}" in line and "hides none of its MIG instances" in line


def test_doctor_warns_of_an_unreadable_card_and_of_enabled_false() -> None:
    from tests.doubles.fake_pynvml import NVML_ERROR_NO_PERMISSION

    broken = h100(1)
    broken.errors = {"nvmlDeviceGetPciInfo": NVML_ERROR_NO_PERMISSION}
    found = _doctor(FakeNvml([h100(0), broken]), "enabled=false")
    (health,) = found["nvml cards"]
    assert health.startswith("warn: 1 of 2 cards unhealthy") and "Insufficient Permissions" in health, health
    assert "nomad-device-nvidia would report such a card healthy" in health
    (enabled,) = found["enabled"]
    assert enabled.startswith("warn: enabled = false") and "keeps its Fingerprint stream open" in enabled


@pytest.mark.parametrize(
    "text",
    [
        "0",
        "0s",
        "-1s",
        "+5s",
        "1h30m",
        "1.5h",
        ".5s",
        "1.s",
        "300ms",
        "2us",
        "2µs",
        "1000h",
        "2562047h",
        "2562048h",
        "",
        "5",
        "0.0",
        "1d",
        "1h 30m",
        "5 minutes",
        "s",
        ".s",
        "1..5s",
    ],
)
def test_fingerprint_period_is_taken_exactly_when_go_parse_duration_takes_it(text: str) -> None:
    """The restated official SetConfig (time.ParseDuration) and ours agree on every spelling ("" aside: ours
    reads it as "not written", an older default of this plugin)."""
    from tests.nvml import official_oracle

    try:
        decode(fingerprint_period=text)
        ours = True
    except ConfigError:
        ours = False
    assert ours == (official_oracle.go_parse_duration_ok(text) or text == "")
