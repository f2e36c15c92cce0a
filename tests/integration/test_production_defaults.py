"""Production defaults, exercised through the real plugin executable.

Every other real-plugin test pins ``backend = "xdm"`` and turns NVML off.
Here the defaults an operator actually ships run inside the executable the
Go conformance host launches the way Nomad does:

- ``backend = "auto"`` on an XDM node (NVML present too: the socket wins);
- XDM enriched from NVML (a fake NVML imported as ``pynvml`` by the real
  process, see tests/doubles/nvml_shim/pynvml.py);
- a Reserve while the grant journal cannot be used;
- the Prometheus metrics, whose values must move as the plugin works
  (app.py's housekeeping pump mirrors the journal size every few seconds).
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import httpx

from tests.conformance.hostlib import REPO, HostProcess, start_host
from tests.e2e.agent_setup import free_port
from tests.integration.harness import Node, assert_conformant, first_fingerprint_with_devices, set_of
from tests.waiting import wait_until

SHIM = Path(__file__).resolve().parents[1] / "doubles" / "nvml_shim"
DEADLINE_S = 60


@functools.cache
def _nvml_library_dir() -> str:
    """A directory whose ``libnvidia-ml.so.1`` opens: a link to this process's libc.

    The plugin opens NVML's library before it imports the bindings
    (nomad_plugin/nvml/lib.py, ``load_if_library``); the shim stands in for the
    bindings, and this link for the library, which the shim never calls.
    """
    libc = next(line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines() if "/libc.so" in line)
    where = Path(tempfile.mkdtemp(prefix="ljnvml-"))
    atexit.register(shutil.rmtree, where, True)
    (where / "libnvidia-ml.so.1").symlink_to(libc)
    return str(where)


def _nvml_env(gpus: list[dict[str, Any]]) -> dict[str, str]:
    """The plugin process imports the shim as pynvml: a FakeNvml holding ``gpus``."""
    path = os.pathsep.join([str(SHIM), str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    libs = os.pathsep.join([_nvml_library_dir(), os.environ.get("LD_LIBRARY_PATH", "")]).rstrip(os.pathsep)
    return {"PYTHONPATH": path, "FAKE_NVML_GPUS": json.dumps(gpus), "LD_LIBRARY_PATH": libs}


def _gpus_of(node: Node, **extra: Any) -> list[dict[str, Any]]:
    """NVML's view of the simulator's own cards (same UUIDs and minors)."""
    return [
        {
            "name": card.model,
            "memory_total_mib": card.memory_mib,
            "pci_bus_id": f"00000000:{0x18 + i:02X}:00.0",
            "minor": card.minor,
            "uuid": card.uuid,
            **extra,
        }
        for i, card in enumerate(node.sim.cards)
    ]


def _start(node: Node, conformance_host: Path, *sets: str, env: dict[str, str] | None = None) -> HostProcess:
    args = [*node.plugin_args(*sets, phase="run"), "--duration", "0", "--stats-interval", "1"]
    return start_host(args, env=env, binary=conformance_host)


def _ids(fp: dict[str, Any]) -> set[str]:
    return {d["id"] for g in fp["groups"] for d in g["devices"]}


def test_backend_auto_on_an_xdm_node_picks_xdm_even_with_nvml_present(node: Node, conformance_host: Path) -> None:
    # NVML works on this node and reports two other GPUs: "auto" must still take
    # XDM, whose socket exists (checking NVML first would advertise NVML's cards).
    nvml_only = [
        {"name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559, "pci_bus_id": f"00000000:{b:02X}:00.0", "minor": m}
        for m, b in ((0, 0x61), (1, 0x62))
    ]
    env = _nvml_env([{**g, "uuid": f"GPU-nvml-only-{g['minor']}"} for g in nvml_only])
    proc = _start(node, conformance_host, set_of("backend", "auto"), set_of("nvml_enrich", False), env=env)
    fp = first_fingerprint_with_devices(proc, timeout=DEADLINE_S)
    run = proc.finish()
    assert_conformant(run)
    sim_uuids = {c.uuid for c in node.sim.cards}
    assert {i.split("-share-")[0] for i in _ids(fp)} == sim_uuids, fp
    assert "backend: xdm" in run.stderr and "backend: nvml" not in run.stderr, run.stderr[-2000:]


def test_xdm_enriched_from_nvml_in_the_real_process(node: Node, conformance_host: Path) -> None:
    # Values only NVML knows (the simulator reports no clocks or compute capability).
    env = _nvml_env(_gpus_of(node, graphics_clock_mhz=1755, compute_capability=[9, 0]))
    proc = _start(node, conformance_host, set_of("backend", "auto"), set_of("nvml_enrich", True), env=env)
    fp = proc.wait_for(
        lambda e: e["event"] == "fingerprint" and e["n_devices"] > 0 and "cores_clock" in e["groups"][0]["attributes"],
        timeout=DEADLINE_S,
    )
    run = proc.finish()
    assert_conformant(run)
    for group in fp["groups"]:
        attrs = group["attributes"]
        assert attrs["cores_clock"] == {"kind": "int", "unit": "MHz", "value": 1755}, (group["name"], attrs)
        assert attrs["compute_capability"] == {"kind": "float", "unit": "", "value": 9.0}, attrs
        assert attrs["architecture"]["value"] == "hopper" and attrs["cuda_driver_version"]["value"] == "12.4", attrs
    assert "backend: xdm, enriched from NVML" in run.stderr


def test_enrichment_is_off_when_nvml_cannot_start(node: Node, conformance_host: Path) -> None:
    """The contrast: NVML's driver is not loaded (nvmlInit fails): no NVML attributes, the node still serves."""
    env = {**_nvml_env(_gpus_of(node, graphics_clock_mhz=1755)), "FAKE_NVML_INIT_ERROR": "9"}  # DRIVER_NOT_LOADED
    proc = _start(node, conformance_host, set_of("backend", "auto"), set_of("nvml_enrich", True), env=env)
    fp = first_fingerprint_with_devices(proc, timeout=DEADLINE_S)
    run = proc.finish()
    assert_conformant(run)
    assert all("cores_clock" not in g["attributes"] for g in fp["groups"]), fp["groups"][0]["attributes"]
    assert "enriched from NVML" not in run.stderr


def test_reserve_with_an_unusable_journal_fails_clearly_and_grants_nothing(node: Node, conformance_host: Path) -> None:
    blocker = node.root / "not-a-directory"
    blocker.write_text("a file where the data_dir should be\n")
    data_dir = blocker / "data"
    proc = _start(node, conformance_host, set_of("data_dir", str(data_dir)))
    fp = first_fingerprint_with_devices(proc, timeout=DEADLINE_S)
    uuid = sorted(_ids(fp))[0]
    proc.send({"op": "reserve", "ids": [uuid], "expect": "error", "tag": "no-journal"})
    refused = proc.wait_for(lambda e: e["event"] == "reserve" and e.get("tag") == "no-journal", timeout=DEADLINE_S)
    run = proc.finish()
    assert refused["ok"] is False, refused
    assert "journal" in refused["message"] and str(data_dir) in refused["message"], refused["message"]
    assert node.sim.grants() == {}, "a grant was made although it could not be journalled"
    assert_conformant(run)  # the plugin kept serving: the streams never ended


def _metric(text: str, name: str) -> float | None:
    match = re.search(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else None


def test_prometheus_values_move_as_the_plugin_works(node: Node, conformance_host: Path) -> None:
    port = free_port()
    proc = _start(node, conformance_host, set_of("metrics_port", port), set_of("metrics_bind", "127.0.0.1"))
    url = f"http://127.0.0.1:{port}/metrics"

    def scrape() -> str:
        try:
            return httpx.get(url, timeout=5).text
        except httpx.HTTPError:
            return ""

    try:
        fp = first_fingerprint_with_devices(proc, timeout=DEADLINE_S)
        wait_until(lambda: _metric(scrape(), "lingjun_plugin_xdm_up") == 1.0, "xdm_up = 1", DEADLINE_S)
        wait_until(lambda: _metric(scrape(), "lingjun_plugin_journal_entries") == 0.0, "journal gauge = 0", DEADLINE_S)
        before = scrape()
        assert (_metric(before, "lingjun_plugin_fingerprints_sent_total") or 0) >= 1, before
        assert _metric(before, "lingjun_plugin_reserve_duration_seconds_count") == 0.0, before

        uuid = sorted(_ids(fp))[0]
        proc.send({"op": "reserve", "ids": [uuid], "expect": "ok", "tag": "m"})
        done = proc.wait_for(lambda e: e["event"] == "reserve" and e.get("tag") == "m", timeout=DEADLINE_S)
        assert done["ok"] is True, done
        # The housekeeping pump mirrors the journal into the gauge every few seconds.
        wait_until(lambda: _metric(scrape(), "lingjun_plugin_journal_entries") == 1.0, "journal gauge = 1", DEADLINE_S)
        after = scrape()
        assert _metric(after, "lingjun_plugin_reserve_duration_seconds_count") == 1.0, after
        node.sim.crash()
        wait_until(lambda: _metric(scrape(), "lingjun_plugin_xdm_up") == 0.0, "xdm_up = 0 after a crash", DEADLINE_S)
    finally:
        proc.finish()
