"""Run the XDM simulator with a synthetic node of any size (a benchmark helper, not a product profile).

    .venv/bin/python benchmarks/synthetic_sim.py --cards 256 -- --socket-dir DIR [xdm-sim options]

Registers ``m890p-<N>``: N copies of the M890P card (144 GiB, no MIG) with
the generic switch/NUMA topology, then runs ``nomad-device-lingjun xdm-sim
--profile m890p-<N>`` in this process. The shipped profiles stop at 16 cards;
issue 14 asks for a 256-card node and for 1,024 live grants.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def register(cards: int) -> str:
    from nomad_plugin.sim import profiles

    name = f"m890p-{cards}"
    base = profiles.PROFILES["m890p-8"]
    profiles.PROFILES[name] = dataclasses.replace(
        base,
        name=name,
        count=cards,
        pci_buses=tuple(i % 256 for i in range(cards)),
        description=f"{cards} x PPU M890P (synthetic, benchmarks only)",
    )
    return name


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cards", type=int, default=256)
    parser.add_argument("rest", nargs=argparse.REMAINDER, help="xdm-sim options after --")
    args = parser.parse_args()
    name = register(args.cards)
    rest = [a for a in args.rest if a != "--"]
    from nomad_plugin.cli.xdm_sim import main as sim_main

    return sim_main(["--profile", name, *rest])


if __name__ == "__main__":
    raise SystemExit(main())
