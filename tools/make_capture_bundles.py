#!/usr/bin/env python3
"""Make the simulator's capture bundles under tests/captures/ (one per served schema: the reconstruction and
the drifted schemas of tests/doubles/drifted_schemas.py).

Each bundle is what ``nomad-device-lingjun xdm-probe --capture DIR`` writes
against a simulator serving that schema, plus ``expected-inventory.json``: the
simulator's own truth, which a correct schema binding must reproduce from the
bundle alone (tests/captures/test_replay.py). A real node's capture is added
the same way: its directory plus an expected inventory written by a person who
knows the node.

Usage: python tools/make_capture_bundles.py [--out DIR] [NAME ...]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
EXPECTED = "expected-inventory.json"


@dataclass(frozen=True)
class BundleSpec:
    name: str
    profile: str
    schema: str
    reflection: bool


BUNDLES = (
    BundleSpec("sim-h800-builtin", "h800-8", "builtin", False),
    BundleSpec("sim-h800-renumbered", "h800-8", "renumbered", False),
    BundleSpec("sim-h800-renumbered-reflection", "h800-8", "renumbered", True),
    BundleSpec("sim-m890p-foreign-reflection", "m890p-8", "foreign", True),
)


def expected_inventory(sim: Any, spec: BundleSpec) -> dict[str, Any]:
    """The simulator's truth, in the domain model's field names (nomad_plugin.model.card.Card).

    ``expect`` is what the plugin's default config (``xdm_schema = "auto"``)
    must make of the bundle: this ``inventory`` exactly, or a loud ``mismatch``
    (no reflection and a schema other than the reconstruction: only the
    operator's proto, ``xdm_schema = <path>``, gives the inventory then).
    """
    mismatch = spec.schema != "builtin" and not spec.reflection
    return {
        "source": {"kind": "simulator", "profile": sim.profile, "schema": spec.schema, "reflection": spec.reflection},
        "expect": "mismatch" if mismatch else "inventory",
        "xpu_types": sorted({c.xpu_type for c in sim.cards}),
        "runtime_kit_enabled": bool(sim.state.enabled),
        "exporter": {"collect_interval_ms": sim.options.collect_interval_ms, "version": sim.options.version},
        "cards": [
            {
                "minor": c.minor,
                "uuid": c.uuid,
                "model": c.model,
                "vendor": c.vendor,
                "xpu_type": c.xpu_type,
                "memory_mib": c.memory_mib,
                "total_core": c.total_core,
                "pci_bus_id": c.pci_bus_id,
                "healthy": True,
                "driver_version": c.driver_version,
            }
            for c in sim.cards
        ],
    }


def make_bundle(spec: BundleSpec, out: Path) -> dict[str, Any]:
    """Run a simulator in ``spec``'s mode, capture it into ``out / spec.name``; returns the manifest."""
    from nomad_plugin.cli.xdm_probe import raw_text
    from nomad_plugin.config.decode import decode_config
    from nomad_plugin.launcher.config import load_config, msgpack_config
    from nomad_plugin.launcher.process import socket_overrides
    from nomad_plugin.sim import Simulator
    from nomad_plugin.xdm.capture import capture
    from tests.doubles.drifted_schemas import served_schema

    target = out / spec.name
    if target.exists():
        shutil.rmtree(target)
    tmp = Path(tempfile.mkdtemp(prefix="cap", dir="/tmp"))
    try:
        sock = tmp / "s"
        with Simulator(
            sock, spec.profile, schema=served_schema(spec.schema), reflection=spec.reflection, control=False
        ) as sim:
            config = decode_config(msgpack_config(load_config(None, socket_overrides(sock))))
            manifest = capture(config, target, render_raw=raw_text)
            if sim.grants():
                raise SystemExit(f"{spec.name}: the capture made a grant: {sorted(sim.grants())}")
            inventory = expected_inventory(sim, spec)
        # a bundle must not depend on where it was made
        manifest["sockets"] = {k: Path(v).name for k, v in manifest["sockets"].items()}
        (target / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        (target / EXPECTED).write_text(json.dumps(inventory, indent=2, sort_keys=True) + "\n")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return manifest


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "tests" / "captures")
    parser.add_argument("names", nargs="*", help="bundle names (default: all)")
    ns = parser.parse_args()
    specs = [b for b in BUNDLES if not ns.names or b.name in ns.names]
    unknown = set(ns.names) - {b.name for b in BUNDLES}
    if unknown:
        parser.error(f"unknown bundle {sorted(unknown)[0]!r} (known: {', '.join(b.name for b in BUNDLES)})")
    for spec in specs:
        manifest = make_bundle(spec, ns.out)
        state = "ok" if manifest["ok"] else "INCOMPLETE"
        print(f"{ns.out / spec.name}: {state}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
