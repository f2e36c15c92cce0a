"""Time to handshake of the zipapp (dist/nomad-device-lingjun), cold and warm shiv cache.

Reuses benchmarks/handshake.py's one_launch (exec with Nomad's cookie and
PLUGIN_PROTOCOL_VERSIONS=2, wait for the handshake line, SIGTERM). "cold" is
the very first launch with an empty SHIV_ROOT (shiv extracts the bundled
dependencies); "warm" launches reuse the extraction, as every later Nomad
launch does.

    .venv/bin/python tools/build_zipapp.py
    .venv/bin/python benchmarks/zipapp_handshake.py [--runs 20] [--zipapp dist/nomad-device-lingjun]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from handshake import COOKIE, one_launch

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--zipapp", type=Path, default=REPO / "dist" / "nomad-device-lingjun")
    args = parser.parse_args()
    if not args.zipapp.exists():
        raise SystemExit(f"{args.zipapp} missing: run tools/build_zipapp.py first")
    root = Path(tempfile.mkdtemp(prefix="shiv-bench-"))
    env = dict(os.environ, SHIV_ROOT=str(root), PLUGIN_PROTOCOL_VERSIONS="2")
    env[COOKIE[0]] = COOKIE[1]
    try:
        cold, cold_rss = one_launch([str(args.zipapp)], env)
        times, rss = [], []
        for _ in range(args.runs):
            elapsed, kib = one_launch([str(args.zipapp)], env)
            times.append(elapsed * 1000)
            rss.append(kib)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    times.sort()
    p95 = times[min(len(times) - 1, round(0.95 * (len(times) - 1)))]
    size = args.zipapp.stat().st_size
    print(f"zipapp: {args.zipapp} ({size / 2**20:.1f} MiB)  runs: {args.runs}  cpus: {os.cpu_count()}")
    print(f"cold (empty SHIV_ROOT, extraction): {cold * 1000:.0f} ms, VmRSS {cold_rss / 1024:.1f} MiB")
    print(
        f"warm exec -> handshake: median {statistics.median(times):.0f} ms, p95 {p95:.0f} ms, "
        f"min {times[0]:.0f} ms, max {times[-1]:.0f} ms; VmRSS median {statistics.median(rss) / 1024:.1f} MiB"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
