"""What the real ``fingerprint`` command publishes, on every simulator profile and on the NVML double:

- every ``pci_bus_id`` (whole cards, shares, MIG units, existing MIG instances) matches the kernel's
  name of the same PCI device under Nomad's comparison (``equalBusID``, scheduler/feasible/device.go),
  so Nomad Enterprise's NUMA matcher finds it in the host's bus -> NUMA map (client/lib/numalib,
  the directory names of /sys/bus/pci/devices);
- the GPU Feature Discovery attributes have the types jobs compare them with.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from nomad_plugin.config.model import PluginConfig
from nomad_plugin.model.card import Inventory
from nomad_plugin.nomad.catalog import build_catalog
from nomad_plugin.sim.profiles import PROFILES, build_cards, resolve_profile
from nomad_plugin.xdm.backend import with_driver_bus_ids
from tests.doubles.fake_pynvml import a100_mig, h100
from tests.fingerprint.helpers import h800_node

REPO = Path(__file__).resolve().parents[2]
SHIM = REPO / "tests" / "doubles" / "nvml_shim"
_PCI = re.compile(r"^(?:([0-9A-Fa-f]+):)?([0-9A-Fa-f]{1,2}):([0-9A-Fa-f]{1,2})\.([0-7])$")


def kernel_name(address: str) -> str:
    """How Linux names a PCI device (pci_setup_device: "%04x:%02x:%02x.%d"), from any spelling of it."""
    match = _PCI.match(address)
    assert match, address
    domain, bus, device, function = match.groups()
    return f"{int(domain or '0', 16):04x}:{int(bus, 16):02x}:{int(device, 16):02x}.{int(function)}"


def nomad_equal_bus_id(a: str, b: str) -> bool:
    """Nomad's equalBusID: equal, or equal once the leading zeros are trimmed (so only the domain's
    width may differ; case and the other fields must agree)."""
    return a == b or a.lstrip("0") == b.lstrip("0")


def test_the_comparison_as_nomad_makes_it() -> None:
    assert nomad_equal_bus_id("0000:3b:00.0", "00000000:3b:00.0")
    assert not nomad_equal_bus_id("0000:3b:00.0", "00000000:3B:00.0")  # NVML's own spelling would never match
    assert not nomad_equal_bus_id("0000:3b:00.0", "3b:00.0")


def fingerprint(*args: str, env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    run = subprocess.run(
        [sys.executable, "-m", "nomad_plugin", "fingerprint", "--json", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
        cwd=REPO,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    groups: list[dict[str, Any]] = json.loads(run.stdout)["groups"]
    return groups


@pytest.mark.parametrize(
    ("profile", "sets"),
    [
        ("h800-8", ()),
        ("h800-8", ('default_mode="tdm"',)),
        ("a100-8", ('default_mode="mig"',)),
        ("m890p-8", ()),
        ("810e-16", ('default_mode="tdm"',)),
        ("l20-8", ('group_by="numa"',)),
    ],
)
def test_every_simulator_instance_carries_its_cards_kernel_bus_id(profile: str, sets: tuple[str, ...]) -> None:
    spec = resolve_profile(profile)
    groups = fingerprint("--profile", profile, *(a for s in sets for a in ("--set", s)))
    # The simulator's cards by UUID (what its XDM reports), with the kernel's name of their PCI address.
    cards = {c.uuid: kernel_name(c.pci_bus_id) for c in build_cards(spec)}
    seen = 0
    for group in groups:
        for device in group["devices"]:
            card = next(uuid for uuid in cards if device["id"].startswith(uuid))
            published = device["pci_bus_id"]
            assert published == cards[card], (group["name"], device)
            assert nomad_equal_bus_id(cards[card], published)
            seen += 1
    assert seen >= spec.count, groups


def test_nvml_instances_and_mig_instances_carry_the_kernel_form(tmp_path: Path) -> None:
    gpus = [h100(0), a100_mig(1)]
    gpus[0].pci_bus_id = "00000001:AF:1F.7"  # another domain, upper case: NVML's spelling
    spec = [
        {"profile": "h100", "index": 0, "pci_bus_id": gpus[0].pci_bus_id},
        {"profile": "a100_mig", "index": 1},
    ]
    groups = fingerprint("--set", 'backend="nvml"', env=nvml_env(spec, tmp_path))
    wanted = {g.uuid: kernel_name(g.pci_bus_id) for g in gpus}
    migs = {m.uuid: a.uuid for a in gpus for m in a.migs}
    published = {d["id"]: d["pci_bus_id"] for g in groups for d in g["devices"]}
    assert set(published) == {gpus[0].uuid, *migs}, published
    for device_id, bus_id in published.items():
        kernel = wanted[migs.get(device_id, device_id)]
        assert bus_id == kernel and nomad_equal_bus_id(kernel, bus_id), (device_id, bus_id)
    assert published[gpus[0].uuid] == "0001:af:1f.7"


def test_gpu_feature_discovery_attributes_from_nvml(tmp_path: Path) -> None:
    spec = [{"profile": "h100", "index": 0}, {"profile": "l40s", "index": 1}]
    groups = fingerprint("--set", 'backend="nvml"', env=nvml_env(spec, tmp_path))
    attrs = {g["name"]: {k: v["value"] for k, v in g["attributes"].items()} for g in groups}
    hopper, ada = attrs["NVIDIA H100 80GB HBM3"], attrs["NVIDIA L40S"]
    assert hopper["compute_capability"] == 9.0 and isinstance(hopper["compute_capability"], float)
    assert ada["compute_capability"] == 8.9
    assert (hopper["architecture"], ada["architecture"]) == ("hopper", "ada-lovelace")
    assert (hopper["mig_capable"], ada["mig_capable"]) == (True, False)
    assert hopper["cuda_driver_version"] == ada["cuda_driver_version"] == "12.4"


def test_xdm_nodes_publish_the_sdk_version_as_cuda_driver_version_on_nvidia_cards_only() -> None:
    nvidia = fingerprint("--profile", "h800-8")[0]["attributes"]
    assert nvidia["cuda_driver_version"]["value"] == PROFILES["h800-8"].sdk_version
    assert nvidia["mig_capable"]["value"] is True
    ppu = fingerprint("--profile", "m890p-8")[0]["attributes"]
    assert "cuda_driver_version" not in ppu and "compute_capability" not in ppu


def nvml_env(spec: list[dict[str, Any]], tmp: Path) -> dict[str, str]:
    """The real process imports the NVML double as pynvml (tests/doubles/nvml_shim), behind a
    ``libnvidia-ml.so.1`` that opens (a link to libc, never called)."""
    libc = next(line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines() if "/libc.so" in line)
    lib = Path(tempfile.mkdtemp(dir=tmp))
    (lib / "libnvidia-ml.so.1").symlink_to(libc)
    return {
        "PYTHONPATH": os.pathsep.join([str(SHIM), str(REPO), os.environ.get("PYTHONPATH", "")]),
        "LD_LIBRARY_PATH": str(lib),
        "FAKE_NVML_GPUS": json.dumps(spec),
    }


def test_an_nvidia_card_xdm_reports_without_an_address_takes_the_drivers(tmp_path: Path) -> None:
    gpus = tmp_path / "driver" / "nvidia" / "gpus"
    for minor, address in ((0, "0000:3b:00.0"), (1, "0000:86:00.0")):
        (gpus / address).mkdir(parents=True)
        (gpus / address / "information").write_text(
            f"Model: \t\t NVIDIA H800\nGPU UUID: \t GPU-x{minor}\nBus Location: \t {address}\nDevice Minor: \t {minor}\n"
        )
    cards = [replace(c, pci_bus_id="") for c in h800_node(3).cards]
    filled = with_driver_bus_ids(cards, str(tmp_path))
    assert [c.pci_bus_id for c in filled] == ["0000:3b:00.0", "0000:86:00.0", ""]  # card 2: the driver has none
    catalog = build_catalog(Inventory(cards=filled), PluginConfig(default_mode="tdm"))
    published = {i.minor: i.pci_bus_id for g in catalog.groups for i in g.instances}
    assert published == {0: "0000:3b:00.0", 1: "0000:86:00.0", 2: ""}
    assert nomad_equal_bus_id("0000:3b:00.0", published[0])
    # No driver tree, or cards with addresses: nothing changes.
    assert with_driver_bus_ids(cards, str(tmp_path / "none")) == tuple(cards)
    assert with_driver_bus_ids(h800_node(2).cards, str(tmp_path)) == tuple(h800_node(2).cards)
