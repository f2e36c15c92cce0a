"""Time from exec to the go-plugin handshake line, and the plugin's RSS right after it.

Nomad launches the plugin three times at every agent start (fingerprint,
validate, run), so time-to-handshake adds up. Target: median < 400 ms on a
2-core box.

    .venv/bin/python benchmarks/handshake.py [--runs 20] [--cmd console|module]

Each run execs the plugin as Nomad does (cookie and PLUGIN_PROTOCOL_VERSIONS in
the environment, stdout/stderr pipes), waits for the handshake line, reads
VmRSS from /proc/<pid>/status, then stops it with SIGTERM (the same graceful
path as GRPCController.Shutdown). One untimed warm-up launch comes first.
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COOKIE = ("NOMAD_PLUGIN_MAGIC_COOKIE", "e4327c2e01eabfd75a8a67adb114fb34a757d57eee7728d857a8cec6e91a7255")


def command(kind: str) -> list[str]:
    venv_bin = REPO / ".venv" / "bin"
    if kind == "console":
        return [str(venv_bin / "nomad-device-lingjun")]
    return [str(venv_bin / "python"), "-m", "nomad_plugin"]


def vm_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return -1


def one_launch(cmd: list[str], env: dict[str, str]) -> tuple[float, int]:
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 30)
    if not ready:
        proc.kill()
        raise SystemExit("no handshake within 30 s")
    line = proc.stdout.readline()
    elapsed = time.perf_counter() - start
    if not line.startswith(b"1|2|unix|"):
        proc.kill()
        raise SystemExit(f"bad handshake line {line!r}")
    rss = vm_rss_kib(proc.pid)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=10)
    proc.stdout.close()
    return elapsed, rss


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--cmd", choices=("console", "module"), default="console")
    args = parser.parse_args()
    cmd = command(args.cmd)
    env = dict(os.environ)
    env[COOKIE[0]] = COOKIE[1]
    env["PLUGIN_PROTOCOL_VERSIONS"] = "2"
    one_launch(cmd, env)  # warm the page cache and .pyc files; not counted
    times, rss = [], []
    for _ in range(args.runs):
        elapsed, kib = one_launch(cmd, env)
        times.append(elapsed * 1000)
        rss.append(kib)
    times.sort()
    p95 = times[min(len(times) - 1, round(0.95 * (len(times) - 1)))]
    print(f"command: {' '.join(cmd)}  (NOMAD_PLUGIN_MAGIC_COOKIE set, PLUGIN_PROTOCOL_VERSIONS=2)")
    print(f"runs: {args.runs}  cpus: {os.cpu_count()}  python: {sys.version.split()[0]}")
    print(
        f"exec -> handshake: median {statistics.median(times):.0f} ms, p95 {p95:.0f} ms, "
        f"min {times[0]:.0f} ms, max {times[-1]:.0f} ms"
    )
    print(f"VmRSS after handshake: median {statistics.median(rss) / 1024:.1f} MiB, max {max(rss) / 1024:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
