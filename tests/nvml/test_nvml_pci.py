from __future__ import annotations

import pytest

from nomad_plugin.nvml.devices import (
    cuda_version_text,
    normalise_bus_id,
    profile_from_name,
    slices_from_profile,
    sysfs_numa_node,
)
from tests.doubles.fake_pynvml import write_sysfs_numa


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("00000000:18:00.0", "0000:18:00.0"),
        ("00000000:3B:00.0", "0000:3b:00.0"),
        ("0000:3b:00.0", "0000:3b:00.0"),
        ("3B:00.0", "0000:3b:00.0"),
        ("00000001:C1:1F.7", "0001:c1:1f.7"),
        (" 00000000:18:00.0 ", "0000:18:00.0"),
        ("00010000:01:00.0", "10000:01:00.0"),  # a VMD domain: the kernel prints it with five digits
    ],
)
def test_bus_id_normalised_to_sysfs_form(raw: str, expected: str) -> None:
    assert normalise_bus_id(raw) == expected


@pytest.mark.parametrize("raw", ["", "garbage", "0000:18:00", "0000:18:00.8", "0000:18:20.0", "100000000:18:00.0"])
def test_bad_bus_id_is_rejected_naming_the_value(raw: str) -> None:
    with pytest.raises(ValueError, match="pci_bus_id") as info:
        normalise_bus_id(raw)
    assert repr(raw) in str(info.value)


def test_sysfs_numa_node(tmp_path) -> None:
    write_sysfs_numa(tmp_path, "0000:18:00.0", 1)
    write_sysfs_numa(tmp_path, "0000:19:00.0", -1)
    assert sysfs_numa_node("0000:18:00.0", str(tmp_path)) == 1
    assert sysfs_numa_node("0000:19:00.0", str(tmp_path)) is None  # kernel says "no node"
    assert sysfs_numa_node("0000:20:00.0", str(tmp_path)) is None  # absent


def test_cuda_version_and_mig_profile_parsing() -> None:
    assert cuda_version_text(12040) == "12.4"
    assert cuda_version_text(11080) == "11.8"
    assert profile_from_name("NVIDIA A100-SXM4-80GB MIG 1g.10gb") == "1g.10gb"
    assert profile_from_name("NVIDIA H100 80GB HBM3") == ""
    assert slices_from_profile("3g.40gb") == 3
    assert slices_from_profile("1c.2g.20gb") == 2
    assert slices_from_profile("") == 0
