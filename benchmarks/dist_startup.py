"""Exec → handshake of the shipped executable against the console script, measured in one run.

Issue 14 asks for the shipped executable (``make dist``) within 1.2 times the
console script. Each round launches every command once, in turn, so load on
a shared box hits them alike; the ratio of medians is the result. Launches
reuse benchmarks/handshake.py's ``one_launch`` (Nomad's cookie and
PLUGIN_PROTOCOL_VERSIONS=2 in the environment, wait for the handshake line,
read VmRSS, SIGTERM). The dist file runs with its unpack cache in a temporary
directory: first the cold launches (each with an empty cache: the one-time
unpack), then the warm ones that every later Nomad launch sees. ``--extra
LABEL=PATH`` adds another executable to the rounds (e.g. a PyInstaller
onefile build from ``tools/build_dist.py --onefile``).

    make dist
    .venv/bin/python benchmarks/dist_startup.py [--runs 20] [--plugin dist/nomad-device-lingjun] [--extra onefile=PATH]
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
CACHE_ENV = "NOMAD_DEVICE_LINGJUN_CACHE_DIR"


def summary(label: str, ms: list[float], base: float) -> str:
    ms = sorted(ms)
    p95 = ms[min(len(ms) - 1, round(0.95 * (len(ms) - 1)))]
    med = statistics.median(ms)
    return f"{label:<16} median {med:6.1f} ms  p95 {p95:6.1f}  min {ms[0]:6.1f}  ratio {med / base:.2f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--cold-runs", type=int, default=3)
    parser.add_argument("--plugin", type=Path, default=REPO / "dist" / "nomad-device-lingjun")
    parser.add_argument("--console", type=Path, default=REPO / ".venv" / "bin" / "nomad-device-lingjun")
    parser.add_argument("--extra", action="append", default=[], metavar="LABEL=PATH")
    args = parser.parse_args()
    if not args.plugin.is_file():
        raise SystemExit(f"{args.plugin} is missing: run `make dist` first")
    root = Path(tempfile.mkdtemp(prefix="dist-bench-"))
    env = dict(os.environ, PLUGIN_PROTOCOL_VERSIONS="2")
    env[COOKIE[0]] = COOKIE[1]
    try:
        cold = []
        for i in range(args.cold_runs):
            elapsed, _ = one_launch([str(args.plugin)], {**env, CACHE_ENV: str(root / f"cold{i}")})
            cold.append(elapsed * 1000)
        warm_env = {**env, CACHE_ENV: str(root / "warm")}
        commands = {"console script": ([str(args.console)], env), "dist file": ([str(args.plugin)], warm_env)}
        for extra in args.extra:
            label, path = extra.split("=", 1)
            commands[label] = ([path], env)
        for cmd, e in commands.values():  # warm-up: page cache, .pyc files, the dist file's unpack
            one_launch(cmd, e)
        times: dict[str, list[float]] = {label: [] for label in commands}
        rss: dict[str, list[int]] = {label: [] for label in commands}
        for _ in range(args.runs):
            for label, (cmd, e) in commands.items():
                elapsed, kib = one_launch(cmd, e)
                times[label].append(elapsed * 1000)
                rss[label].append(kib)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    base = statistics.median(times["console script"])
    size = args.plugin.stat().st_size
    print(f"dist file: {args.plugin} ({size / 2**20:.1f} MiB)  rounds: {args.runs}  cpus: {os.cpu_count()}")
    for label in commands:
        print(summary(label, times[label], base) + f"  VmRSS {statistics.median(rss[label]) / 1024:.1f} MiB")
    print(f"dist file, first launch (empty cache, unpacks): {', '.join(f'{c:.0f}' for c in cold)} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
