"""MIG instances through the NVML backend, end to end, in the real plugin under the Go conformance host.

Fingerprint: each MIG device name is a group of MIG UUIDs (the card in MIG
mode is not offered whole). Reserve: ``NVIDIA_VISIBLE_DEVICES`` holds the MIG
UUIDs in the order asked, and the devices are the parent card's node, the
control nodes and the two capability nodes per instance whose minors the
driver's ``/proc/driver/nvidia/capabilities`` files give (here a test
directory the NVML shim points the backend at). Stats: each instance shows
its own memory beside the parent card's readings.
"""

from __future__ import annotations

from pathlib import Path

from tests.conformance.conftest import conformance_host
from tests.doubles.fake_pynvml import a100_mig, h100, write_mig_caps
from tests.nvml.dropin import PluginNode, Scenario, gpus

__all__ = ["conformance_host"]


def test_a_mig_instance_is_fingerprinted_reserved_and_reported(conformance_host: Path, tmp_path: Path) -> None:
    a, b = a100_mig(0), a100_mig(1)
    scenario = Scenario("mig-e2e", gpus(a, b, h100(2)))
    caps = write_mig_caps(tmp_path, scenario.fake())
    three = [m.uuid for m in (a.migs[0], b.migs[0])]  # the two 3g.40gb instances
    with PluginNode(scenario, conformance_host) as node:
        groups = {g["name"]: g for g in node.fingerprint(want_devices=True)}
        assert set(groups) == {
            "NVIDIA A100-SXM4-80GB MIG 3g.40gb",
            "NVIDIA A100-SXM4-80GB MIG 2g.20gb",
            "NVIDIA A100-SXM4-80GB MIG 1g.10gb",
            "NVIDIA H100 80GB HBM3",
        }, "the A100s are in MIG mode: only their instances are offered"
        big = groups["NVIDIA A100-SXM4-80GB MIG 3g.40gb"]
        assert [d["id"] for d in big["devices"]] == sorted(three)
        assert big["attributes"]["memory"] == {"kind": "int", "unit": "MiB", "value": 40192}
        assert big["devices"][0]["pci_bus_id"] in ("0000:07:00.0", "0000:47:00.0")  # the parent card's

        one = node.reserve([a.migs[0].uuid], "one")
        assert one["ok"], one
        assert one["envs"]["NVIDIA_VISIBLE_DEVICES"] == a.migs[0].uuid
        assert one["envs"]["LINGJUN_MODE"] == "mig-instance"
        gi, ci = caps[a.migs[0].uuid]
        paths = {d["host_path"]: d for d in one["devices"]}
        for path in (
            "/dev/nvidia0",
            "/dev/nvidiactl",
            f"/dev/nvidia-caps/nvidia-cap{gi}",
            f"/dev/nvidia-caps/nvidia-cap{ci}",
        ):
            assert path in paths, sorted(paths)
            assert paths[path]["task_path"] == path and paths[path]["permissions"] == "rwm"
        other_gi, _ = caps[a.migs[1].uuid]
        assert f"/dev/nvidia-caps/nvidia-cap{other_gi}" not in paths, "only the asked instance's capabilities"

        both = node.reserve(sorted(three, reverse=True), "both")
        assert both["ok"], both
        assert both["envs"]["NVIDIA_VISIBLE_DEVICES"] == ",".join(sorted(three, reverse=True))  # the order asked
        assert {"/dev/nvidia0", "/dev/nvidia1"} <= {d["host_path"] for d in both["devices"]}

        whole = node.reserve([h100_uuid := h100(2).uuid], "whole")
        assert whole["ok"] and whole["envs"]["NVIDIA_VISIBLE_DEVICES"] == h100_uuid, whole

        stats = node.stats({a.migs[0].uuid, h100_uuid})
        mig = stats[a.migs[0].uuid]
        assert (mig["summary"]["int_numerator"], mig["summary"]["int_denominator"]) == (37, 40192)
        assert mig["stats"]["mig.Slices"]["int_numerator"] == 3
        assert mig["stats"]["Memory state"]["int_denominator"] == 81920  # the parent card's readings beside it
        run = node.proc.finish()
    assert not run.violations, run.describe()
