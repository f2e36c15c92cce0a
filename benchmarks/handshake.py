"""Exec -> go-plugin handshake line, as Nomad launches a plugin, for one or more executables in one run.

    .venv/bin/python benchmarks/handshake.py [--runs 20] [--plugin PATH ...]

Nomad launches the plugin three times at every agent start (fingerprint,
validate, run), so time-to-handshake adds up. Each launch execs the plugin
with Nomad's magic cookie and ``PLUGIN_PROTOCOL_VERSIONS`` in the
environment and stdout/stderr as pipes, waits for the handshake line, reads
VmRSS, then stops it with SIGTERM (the path ``GRPCController.Shutdown``
takes). Several ``--plugin`` executables (e.g. the console script and the
shipped ``dist/nomad-device-lingjun``) are launched in turn, round after
round, so load on a shared box hits them alike; the ratio of medians to the
first is what carries over between machines. The shipped file unpacks into
a temporary cache here (``NOMAD_DEVICE_LINGJUN_CACHE_DIR``), warmed by the
untimed first launch as every later Nomad launch finds it.
"""

from __future__ import annotations

import argparse
import os
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONSOLE = REPO / ".venv" / "bin" / "nomad-device-lingjun"
# go-plugin's HandshakeConfig as Nomad sets it for device plugins (nomad/plugins/base/plugin.go, Handshake).
COOKIE = ("NOMAD_PLUGIN_MAGIC_COOKIE", "e4327c2e01eabfd75a8a67adb114fb34a757d57eee7728d857a8cec6e91a7255")
CACHE_ENV = "NOMAD_DEVICE_LINGJUN_CACHE_DIR"


def launch_env(cache_dir: Path | None = None) -> dict[str, str]:
    env = dict(os.environ, PLUGIN_PROTOCOL_VERSIONS="2")
    env[COOKIE[0]] = COOKIE[1]
    if cache_dir is not None:
        env[CACHE_ENV] = str(cache_dir)
    return env


def vm_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return -1


def one_launch(cmd: list[str], env: dict[str, str]) -> tuple[float, int]:
    """(seconds from exec to the handshake line, VmRSS KiB right after it); the plugin is then stopped."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdout is not None
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        if not ready:
            raise SystemExit(f"{cmd[0]}: no handshake within 60 s")
        line = proc.stdout.readline()
        elapsed = time.perf_counter() - start
        if not line.startswith(b"1|2|unix|"):
            raise SystemExit(f"{cmd[0]}: bad handshake line {line!r}")
        rss = vm_rss_kib(proc.pid)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
    return elapsed, rss


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def measure(plugins: list[Path], runs: int) -> dict[str, dict[str, float]]:
    """Per executable: median/p95/max ms and median VmRSS MiB over ``runs`` interleaved launches."""
    cache = Path(tempfile.mkdtemp(prefix="ljhs-"))
    env = launch_env(cache)
    try:
        for plugin in plugins:  # warm the page cache, .pyc files and the shipped file's unpack cache
            one_launch([str(plugin)], env)
        times: dict[str, list[float]] = {str(p): [] for p in plugins}
        rss: dict[str, list[int]] = {str(p): [] for p in plugins}
        for _ in range(runs):
            for plugin in plugins:
                elapsed, kib = one_launch([str(plugin)], env)
                times[str(plugin)].append(elapsed * 1000)
                rss[str(plugin)].append(kib)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    return {
        name: {
            "median_ms": round(statistics.median(ms), 1),
            "p95_ms": round(pct(ms, 95), 1),
            "max_ms": round(max(ms), 1),
            "rss_mib": round(statistics.median(rss[name]) / 1024, 1),
        }
        for name, ms in times.items()
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20, help="launches per executable, after one warm-up each")
    parser.add_argument("--plugin", type=Path, action="append", default=[], help="repeatable (default: .venv's)")
    args = parser.parse_args()
    plugins = [p.absolute() for p in args.plugin] or [CONSOLE]
    for plugin in plugins:
        if not os.access(plugin, os.X_OK):
            raise SystemExit(f"--plugin: {plugin} is not an executable file (make venv / make dist)")
    result = measure(plugins, args.runs)
    base = result[str(plugins[0])]["median_ms"]
    print(f"exec -> handshake, {args.runs} interleaved launches each, {os.cpu_count()} CPUs, {sys.version.split()[0]}")
    print("| executable | median | p95 | max | VmRSS | ratio to the first |")
    print("|---|---|---|---|---|---|")
    for name, r in result.items():
        print(
            f"| {name} | {r['median_ms']} ms | {r['p95_ms']} ms | {r['max_ms']} ms | {r['rss_mib']} MiB "
            f"| x{r['median_ms'] / base:.2f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
