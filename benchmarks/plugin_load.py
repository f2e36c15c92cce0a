"""CPU and RSS of the real plugin process under Nomad-like load.

The simulator serves 16 cards (profile ``810e-16``); the plugin runs them in
tdm mode with 7 shares each (112 instances) and is driven by the Go
conformance host exactly as Nomad drives it: Fingerprint stream, Stats
stream at a 1 s collection interval, and a few Reserves. The plugin's own
process is sampled from ``/proc/<pid>`` (utime+stime, VmRSS) every few
seconds; the report gives CPU as a percentage of one core over the steady
part of the run (after a warm-up) and the maximum RSS.

The simulator's own process is sampled the same way over the same window:
it is the baseline (issue 14: the plugin should cost no more CPU than the
simulated XDM it serves). ``--cards N`` (N != 16) runs a synthetic node of N
M890P cards (``benchmarks/synthetic_sim.py``) instead of 810e-16, every card
in tdm mode with 7 shares. ``--plugin PATH`` runs another executable (e.g. an
older build, or the shipped self-contained one).

``--threads`` also reports, per thread of both processes, CPU and thread
switches a second over the same window (``/proc/<pid>/task/*/schedstat``);
with ``py-spy`` on PATH the plugin's Python threads are named (one
``py-spy dump``, taken before the window).

Usage: .venv/bin/python benchmarks/plugin_load.py [--seconds 600] [--warmup 15] [--cards 16] [--plugin PATH] [--threads]
Targets (issue 14): at 16 cards, plugin CPU <= the simulator's CPU and <= 60 MiB RSS;
at 256 cards x 7 shares, <= 8 % of one core and <= 100 MiB.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.conformance.hostlib import build_host, real_plugin  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def thread_times(pid: int) -> dict[int, tuple[str, int, int]]:
    """tid -> (comm, CPU ns, thread switches) from /proc (threads that exit meanwhile are skipped)."""
    out: dict[int, tuple[str, int, int]] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            run_ns, _wait, switches = (int(x) for x in (task / "schedstat").read_text().split())
            out[int(task.name)] = ((task / "comm").read_text().strip(), run_ns, switches)
        except (FileNotFoundError, ProcessLookupError, ValueError):
            continue
    return out


def python_thread_names(pid: int) -> dict[int, str]:
    """tid -> Python thread name, from ``py-spy dump`` when it is installed (else empty)."""
    spy = shutil.which("py-spy")
    if spy is None:
        return {}
    done = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60)
    names = {}
    for match in re.finditer(r'^Thread (\d+) \([^)]*\): "([^"]*)"', done.stdout, re.M):
        names[int(match.group(1))] = match.group(2)
    return names


def thread_report(
    before: dict[int, tuple[str, int, int]], after: dict[int, tuple[str, int, int]], wall: float, names: dict[int, str]
) -> list[dict[str, object]]:
    rows = []
    for tid, (comm, run_ns, switches) in after.items():
        if tid not in before:
            continue
        rows.append(
            {
                "thread": names.get(tid, comm),
                "tid": tid,
                "cpu_percent_of_one_core": round(100 * (run_ns - before[tid][1]) / 1e9 / wall, 3),
                "switches_per_second": round((switches - before[tid][2]) / wall, 1),
            }
        )
    return sorted(rows, key=lambda r: r["cpu_percent_of_one_core"], reverse=True)  # type: ignore[arg-type,return-value]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--warmup", type=float, default=15.0)
    parser.add_argument("--sample", type=float, default=5.0)
    parser.add_argument("--cards", type=int, default=16, help="16: the 810e-16 profile; else a synthetic node")
    parser.add_argument("--plugin", help="the plugin executable (default: the console script of this venv)")
    parser.add_argument("--threads", action="store_true", help="per-thread CPU and switches of both processes")
    args = parser.parse_args()
    plugin = Path(args.plugin).absolute() if args.plugin else real_plugin()

    host = build_host()
    tmp = Path(tempfile.mkdtemp(prefix="pl", dir="/tmp"))
    sock = tmp / "s"
    sim_args = ["--socket-dir", str(sock), "--collect-interval-ms", "1000", "-q"]
    if args.cards == 16:
        sim_cmd = [sys.executable, "-m", "nomad_plugin", "xdm-sim", "--profile", "810e-16", *sim_args]
    else:
        helper = str(REPO / "benchmarks" / "synthetic_sim.py")
        sim_cmd = [sys.executable, helper, "--cards", str(args.cards), "--", *sim_args]
    sim = subprocess.Popen(sim_cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while not (sock / "dp2mgr.sock").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    cmd = [
        str(host),
        "--plugin",
        str(plugin),
        "--config",
        str(REPO / "plugin.hcl"),
        "--phase",
        "run",
        "--duration",
        str(args.seconds),
        "--stats-interval",
        "1",
        "--reserve-count",
        "3",
        "--set",
        f'xdm_socket="{sock}/dp2mgr.sock"',
        "--set",
        f'config_socket="{sock}/config-daemon.sock"',
        "--set",
        f'data_dir="{tmp}/data"',
        "--set",
        "reconcile=false",
        "--set",
        'default_mode="tdm"',
        "--set",
        "tdm_shares=7",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    pid_box: dict[str, int] = {}
    counts = {"fingerprint": 0, "stats": 0, "violation": 0}
    instances = {"n": 0}

    def read_events() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if not line.startswith("{"):
                continue
            ev = json.loads(line)
            kind = ev.get("event")
            if kind == "launch" and ev.get("launch") == 3:
                pid_box["pid"] = int(ev["pid"])
            if kind in counts:
                counts[kind] += 1
            if kind == "stats":
                instances["n"] = int(ev.get("n_instances", 0))

    reader = threading.Thread(target=read_events, daemon=True)
    reader.start()
    while "pid" not in pid_box and proc.poll() is None:
        time.sleep(0.05)
    pid = pid_box["pid"]
    time.sleep(args.warmup)
    names = python_thread_names(pid) if args.threads else {}
    threads0 = (thread_times(pid), thread_times(sim.pid)) if args.threads else None
    t0, c0, s0 = time.monotonic(), cpu_seconds(pid), cpu_seconds(sim.pid)
    peak = rss_mib(pid)
    samples = []
    threads1 = None
    while proc.poll() is None:
        time.sleep(args.sample)
        try:
            peak = max(peak, rss_mib(pid))
            t1, c1, s1 = time.monotonic(), cpu_seconds(pid), cpu_seconds(sim.pid)
            now_threads = (thread_times(pid), thread_times(sim.pid)) if threads0 is not None else None
        except (FileNotFoundError, ProcessLookupError):
            break
        samples.append((t1 - t0, c1 - c0, peak, s1 - s0))
        threads1 = now_threads
    proc.wait()
    sim.terminate()
    sim.wait(10)
    reader.join(5)
    if not samples:
        print("no samples: the run was shorter than the warm-up", file=sys.stderr)
        return 1
    wall, cpu, _, sim_cpu = samples[-1]
    result = {
        "plugin": str(plugin),
        "cards": args.cards,
        "instances": instances["n"],
        "seconds_measured": round(wall, 1),
        "cpu_percent_of_one_core": round(100 * cpu / wall, 2),
        "simulator_cpu_percent_of_one_core": round(100 * sim_cpu / wall, 2),
        "ratio_plugin_to_simulator_cpu": round(cpu / sim_cpu, 2) if sim_cpu > 0 else None,
        "max_rss_mib": round(peak, 1),
        "fingerprints": counts["fingerprint"],
        "stats_responses": counts["stats"],
        "violations": counts["violation"],
        "host_exit": proc.returncode,
    }
    if threads0 is not None and threads1 is not None:
        result["plugin_threads"] = thread_report(threads0[0], threads1[0], wall, names)
        result["simulator_threads"] = thread_report(threads0[1], threads1[1], wall, {})
        for who in ("plugin", "simulator"):
            rows = result[f"{who}_threads"]
            result[f"{who}_switches_per_second"] = round(sum(r["switches_per_second"] for r in rows), 1)  # type: ignore[union-attr,misc]
    print(json.dumps(result, indent=2))
    if args.cards == 16:
        ok = cpu <= sim_cpu and result["max_rss_mib"] <= 60  # type: ignore[operator]
        target = "plugin CPU <= simulator CPU, <= 60 MiB RSS, no violations"
    else:
        ok = result["cpu_percent_of_one_core"] <= 8.0 and result["max_rss_mib"] <= 100  # type: ignore[operator]
        target = "<= 8 % of one core, <= 100 MiB RSS, no violations"
    ok = ok and result["violations"] == 0
    print("PASS" if ok else f"FAIL (targets: {target})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
