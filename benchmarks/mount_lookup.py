"""The ``container_mounts = "auto"`` question of one Reserve, at 1, 16 and 160 allocations on the node.

    .venv/bin/python benchmarks/mount_lookup.py [--levels 1,16,160] [--lookups 200]

Under ``auto`` each Reserve whose grant carries mounts asks the Nomad API
which task is starting and whether it mounts volumes: one
``GET /v1/node/<id>/allocations``, which embeds every allocation's job and
task events (``reconcile/alloc_volumes.py``). For each level N, a Nomad API
double (``tests/doubles``, its own process, real HTTP on loopback) holds N
allocations shaped like Nomad's (embedded job, task events, placement
metrics; ~4 KB of JSON each); then ``--lookups`` lookups, each for the
devices of another allocation, and as many bare GETs of one allocation (the
floor of any HTTP question). Reported per level: the list's size and each
p50/p99. Absolute times are bound to this machine and to the double
(Python's JSON encoder answering for Nomad's Go one).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nomad_plugin.reconcile.alloc_volumes import AllocVolumeLookup
from nomad_plugin.reconcile.nomad_api import NomadApiSettings, NomadClient

DEVICE = "alibaba/ppu/PPU-ZW810E"


def _event(kind: str, message: str, t: int) -> dict[str, object]:
    return {
        "Type": kind,
        "Time": t,
        "DisplayMessage": message,
        "Message": message,
        "Details": {"message": message},
        "FailsTask": False,
        "ExitCode": 0,
        "Signal": 0,
        "RestartReason": "",
        "SetupError": "",
        "DriverError": "",
        "KillError": "",
        "KillReason": "",
        "DownloadError": "",
        "ValidationError": "",
        "DiskLimit": 0,
        "FailedSibling": "",
        "VaultError": "",
        "TaskSignalReason": "",
        "TaskSignal": "",
        "DriverMessage": "",
        "GenericSource": "",
    }


def serve(count: int) -> None:
    """Child process: a double with ``count`` allocations; prints address and node ID, serves until stdin closes."""
    from tests.doubles.nomad_api import NomadApiDouble
    from tests.doubles.nomad_jobs import add_alloc_with_job

    double = NomadApiDouble(task="train").start()
    now = time.time_ns()
    for i in range(count):
        alloc_id = f"{i:08d}-0000-4000-8000-000000000000"
        add_alloc_with_job(double, alloc_id, [f"PPU-{i:08d}-share-{i % 7}"], device=DEVICE, job_id=f"train-{i}")
        with double._cond:
            alloc = double._allocs[alloc_id]
            alloc["TaskStates"] = {
                "train": {
                    "State": "running",
                    "Failed": False,
                    "Restarts": 0,
                    "StartedAt": "2026-12-01T00:00:00Z",
                    "FinishedAt": "0001-01-01T00:00:00Z",
                    "Events": [
                        _event(kind, message, now + k)
                        for k, (kind, message) in enumerate(
                            [
                                ("Received", "Task received by client"),
                                ("Task Setup", "Building Task Directory"),
                                ("Driver", "Downloading image"),
                                ("Started", "Task started by client"),
                            ]
                        )
                    ],
                }
            }
            alloc["Metrics"] = {
                "NodesEvaluated": 16,
                "NodesFiltered": 0,
                "NodesAvailable": {"dc1": 16},
                "ClassFiltered": None,
                "ConstraintFiltered": None,
                "NodesExhausted": 3,
                "ClassExhausted": None,
                "DimensionExhausted": {"devices: no devices match request": 3},
                "QuotaExhausted": None,
                "ScoreMetaData": [
                    {
                        "NodeID": f"node-{n:02d}",
                        "NormScore": 0.5 + n / 100,
                        "Scores": {"binpack": 0.5, "job-anti-affinity": 0},
                    }
                    for n in range(5)
                ],
                "AllocationTime": 412345,
                "CoalescedFailures": 0,
            }
            alloc["DeploymentStatus"] = {"Healthy": True, "Timestamp": "2026-12-01T00:00:10Z", "Canary": False}
            alloc["EvalID"] = f"{i:08d}-1111-4000-8000-000000000000"
    print(double.address, double.node_id, flush=True)
    sys.stdin.read()
    double.stop()


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def one_level(count: int, lookups: int) -> dict[str, float]:
    child = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(count)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        address, node_id = child.stdout.readline().split()
        client = NomadClient(NomadApiSettings(address=address, timeout=30))
        size = len(json.dumps(client.get(f"/v1/node/{node_id}/allocations")))  # (also warms up)
        lookup = AllocVolumeLookup(client, node_id, attempts=1)
        times: dict[str, list[float]] = {}
        for name, ask in (
            ("lookup", lambda ids: lookup.lookup(ids)),
            ("get", lambda ids: client.get(f"/v1/allocation/{ids[0][4:12]}-0000-4000-8000-000000000000")),
        ):
            times[name] = []
            for k in range(lookups):
                ids = [f"PPU-{k % count:08d}-share-{(k % count) % 7}"]
                t0 = time.perf_counter()
                verdict = ask(ids)
                times[name].append((time.perf_counter() - t0) * 1000)
                if name == "lookup" and (not verdict.known or verdict.has_volume_mounts):
                    raise SystemExit(f"lookup of {ids}: {verdict}")
        client.close()
        return {"size_kb": size / 1024, **{f"{n}_p{p}": pct(times[n], p) for n in times for p in (50, 99)}}
    finally:
        child.stdin.close() if child.stdin else None
        child.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", default="1,16,160", help="allocations on the node, comma-separated")
    parser.add_argument("--lookups", type=int, default=200, help="lookups per path and level")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve is not None:
        serve(args.serve)
        return
    rows = {n: one_level(n, args.lookups) for n in (int(v) for v in args.levels.split(","))}
    print(f"container_mounts = auto: the lookup of one Reserve, {args.lookups} per path and level")
    print("| allocations | node list | lookup p50 | p99 | bare GET of one allocation p50 | p99 |")
    print("|---|---|---|---|---|---|")
    for n, r in rows.items():
        print(
            f"| {n} | {r['size_kb']:.0f} KB | {r['lookup_p50']:.2f} ms | {r['lookup_p99']:.2f} ms "
            f"| {r['get_p50']:.2f} ms | {r['get_p99']:.2f} ms |"
        )


if __name__ == "__main__":
    main()
