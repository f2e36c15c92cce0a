"""The ``container_mounts = "auto"`` question as the node fills: node list against view + one allocation.

    .venv/bin/python benchmarks/mount_lookup.py [--levels 1,112,1024] [--lookups 200]

Under ``auto`` each Reserve whose grant carries mounts asks the Nomad API
which task is starting and whether it mounts volumes. Nomad's
``GET /v1/node/<id>/allocations`` embeds every allocation's whole job and
task events, terminal allocations included until Nomad collects them, so
asking it grows with what the node holds. The plugin now finds the
allocation in the reconciler's view (the same list, which the reconciler
keeps by blocking query anyway) and confirms it with
``GET /v1/allocation/<id>``, one allocation whatever the node holds
(``reconcile/alloc_volumes.py``).

For each level N, a Nomad API double (``tests/doubles``, its own
process, real HTTP on loopback) holds N allocations shaped like Nomad's
(embedded job, task events, placement metrics; ~4 KB of JSON each). The
view is built the way the reconciler builds it (``node_allocations``,
parsed). Then, in the same run, ``--lookups`` lookups (each for the
devices of another allocation) by the view path, as many bare GETs of one
allocation (the floor the view path cannot go under), and as many by the
baseline (no view: the node list, as before), one pass each. Reported per
level: the list's size, each p50/p99, the list's p50 over the view's, the
view's over the bare GET's, and the growth exponent of each p50 over the
levels (1.0 = linear in the allocations, 0 = flat).

Absolute times are bound to this machine and to the double (Python's JSON
encoder answering for Nomad's Go one); the ratios and exponents are what
carry over.
"""

from __future__ import annotations

import argparse
import json
import math
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
        size = len(json.dumps(client._get(f"/v1/node/{node_id}/allocations", {}, 30)[0]))  # (also warms up)
        started = time.perf_counter()
        page = client.node_allocations(node_id)  # what the reconciler holds after its blocking query
        assert page.holders  # the reconciler builds it once per page, off the Reserve path
        list_ms = (time.perf_counter() - started) * 1000
        before = AllocVolumeLookup(client, node_id, attempts=1)
        after = AllocVolumeLookup(client, node_id, attempts=1, view=lambda: page)
        # One pass per path, the subject first: each node-list answer (MBs encoded by the
        # double, parsed here) leaves both processes slower for the calls right after it, so
        # alternating would charge the baseline's cost to the subject.
        times: dict[str, list[float]] = {}
        for name, ask in (
            ("view", lambda ids: after.lookup(ids)),
            ("get", lambda ids: client._get(f"/v1/allocation/{ids[0][4:12]}-0000-4000-8000-000000000000", {}, 30)),
            ("list", lambda ids: before.lookup(ids)),
        ):
            times[name] = []
            for k in range(lookups):
                ids = [f"PPU-{k % count:08d}-share-{(k % count) % 7}"]
                t0 = time.perf_counter()
                verdict = ask(ids)
                times[name].append((time.perf_counter() - t0) * 1000)
                if name != "get" and (not verdict.known or verdict.has_volume_mounts):
                    raise SystemExit(f"{name} lookup of {ids}: {verdict}")
        client.close()
        return {
            "size_kb": size / 1024,
            "reconciler_list_ms": list_ms,
            "list_p50": pct(times["list"], 50),
            "list_p99": pct(times["list"], 99),
            "view_p50": pct(times["view"], 50),
            "view_p99": pct(times["view"], 99),
            "get_p50": pct(times["get"], 50),
            "get_p99": pct(times["get"], 99),
        }
    finally:
        child.stdin.close() if child.stdin else None
        child.wait(30)


def exponent(levels: list[int], values: list[float]) -> float:
    """Slope of log(value) over log(level), first to last level."""
    return math.log(values[-1] / values[0]) / math.log(levels[-1] / levels[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", default="1,112,1024", help="allocations on the node, comma-separated")
    parser.add_argument("--lookups", type=int, default=200, help="lookups per path and level")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve is not None:
        serve(args.serve)
        return
    levels = [int(v) for v in args.levels.split(",")]
    rows = {n: one_level(n, args.lookups) for n in levels}
    print(f"container_mounts = auto: the lookup of one Reserve, {args.lookups} per path and level, one pass each")
    print(
        "| allocations | node list | node list p50 | p99 | view + /v1/allocation p50 | p99 "
        "| bare GET of one allocation p50 | list ÷ view | view ÷ bare GET |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for n, r in rows.items():
        print(
            f"| {n} | {r['size_kb']:.0f} KB | {r['list_p50']:.2f} ms | {r['list_p99']:.2f} ms | {r['view_p50']:.2f} ms "
            f"| {r['view_p99']:.2f} ms | {r['get_p50']:.2f} ms | x{r['list_p50'] / r['view_p50']:.1f} "
            f"| x{r['view_p50'] / r['get_p50']:.2f} |"
        )
    if len(levels) > 1:
        list_exp = exponent(levels, [rows[n]["list_p50"] for n in levels])
        view_exp = exponent(levels, [rows[n]["view_p50"] for n in levels])
        spread = max(rows[n]["view_p50"] for n in levels) / min(rows[n]["view_p50"] for n in levels) - 1
        print(
            f"growth exponent of the p50 over {levels[0]}..{levels[-1]}: node list {list_exp:.2f}, view {view_exp:.2f}"
        )
        print(
            f"view p50 spread across levels: {100 * spread:.1f} % (target: within 20 %, as Reserve's): "
            f"{'PASS' if spread <= 0.2 else 'FAIL'}"
        )
    print(
        "the reconciler's own GET and parse of the list, holders index included (once per change of the node's "
        "allocations, on its thread): " + ", ".join(f"{n}: {r['reconciler_list_ms']:.1f} ms" for n, r in rows.items())
    )


if __name__ == "__main__":
    main()
