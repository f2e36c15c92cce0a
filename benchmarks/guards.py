"""The performance guards, measured in one run: a regression check, not a target to tune for.

    .venv/bin/python benchmarks/guards.py [--plugin PATH] [--json FILE] [--set KEY=JSON ...]
                                          [--steady-seconds 30] [--reserves 200] [--flips 60]
                                          [--releases 5] [--handshakes 20]
                                          [--stats-interval 1] [--collect-interval-ms 1000]

One simulated 16-card node (the simulator's ``810e-16`` profile, in this
process), every card in tdm mode with 10 shares: 160 instances. The real
plugin executable (the console script of this venv, or ``--plugin PATH``,
e.g. ``dist/nomad-device-lingjun``) runs under the Go conformance host as
Nomad runs it (launch 3: Fingerprint and Stats streams open, Stats at a 1 s
interval), with the reconciler on against the Nomad API double
(``tests/doubles/nomad_api.py``). The node is filled first: 160
allocations, each registered in the double and then reserved, so 160
grants stay live through every measurement below.

1. Reserve p99 <= x6 raw Release + Allocate p99. With every share held, a
   Reserve always re-reserves a share whose allocation ended, so XDM sees a
   Release of the old grant and an Allocate of the new one. The baseline is
   that pair of calls made by a generated stub from this process, on the
   same card and simulator, alternated with the Reserves. The stub's grant
   asks 1 GiB and no core percent, the memory the ten shares leave free (a
   card has no core percent left). Reserves are timed by the Go host around
   the gRPC call.
2. Plugin CPU <= 1 % of one core, over a window of the steady state (no
   Reserve, 1 s Stats, the reconciler's blocking queries).
3. RSS <= 64 MiB: the largest VmRSS of the plugin seen in that window (the
   peak of the whole run, the fill included, is shown beside it).
4. Health flip -> Fingerprint p99 <= 100 ms (``health_propagation.py``;
   the plugin runs with health_recovery_checks = 1, health_recovery_delay = 0s).
5. Release <= grace + 2 s: an allocation turns ``complete`` in the double,
   and the time until XDM no longer holds its grant is taken.
6. Handshake <= 300 ms: median exec -> handshake line (``handshake.py``),
   after the node is gone.

The table gives each guard's limit, the figure, its ratio to the limit and
PASS/FAIL; the exit status is 1 when any guard fails or the host saw a
protocol violation. The box's load moves every figure: run it on a quiet box.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import grpc

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(REPO), str(HERE)]

from handshake import measure as measure_handshake  # noqa: E402
from handshake import pct  # noqa: E402
from health_propagation import time_flips  # noqa: E402
from plugin_load import PeakRss, cpu_percent  # noqa: E402

from nomad_plugin._proto.lingjun import api_outer_pb2 as pb  # noqa: E402
from nomad_plugin._proto.lingjun import api_outer_pb2_grpc as pb_grpc  # noqa: E402
from nomad_plugin.sim import Simulator  # noqa: E402
from tests.conformance.hostlib import Event, HostProcess, build_host, real_plugin, start_host  # noqa: E402
from tests.doubles.nomad_api import NomadApiDouble  # noqa: E402
from tests.integration.harness import reserve, set_of, short_root  # noqa: E402

CARDS, SHARES = 16, 10
GRACE_S = 1.0
RESERVE_RATIO, CPU_PERCENT, RSS_MIB, HEALTH_P99_MS, RELEASE_SLACK_S, HANDSHAKE_MS = 6.0, 1.0, 64.0, 100.0, 2.0, 300.0


@dataclass
class Guard:
    name: str
    limit: str
    measured: str
    ratio: float  # measured / limit: below 1 passes
    passed: bool
    detail: dict[str, Any]


def ms(seconds: float) -> float:
    return round(seconds * 1000, 2)


class Node:
    """The simulator, the Nomad API double and the real plugin under the host, filled to 160 grants."""

    def __init__(
        self, plugin: Path, sim: Simulator, api: NomadApiDouble, root: Path, extra: list[str], stats_interval: float
    ) -> None:
        self.sim, self.api = sim, api
        sets = {
            "backend": "xdm",
            "xdm_socket": str(sim.dp2mgr_path),
            "config_socket": str(sim.config_path),
            "data_dir": str(root / "data"),
            "nvml_enrich": False,
            "reconcile": True,
            "nomad_address": api.address,
            "release_grace_period": f"{GRACE_S:g}s",
            "default_mode": "tdm",
            "tdm_shares": SHARES,
            "health_recovery_checks": 1,
            "health_recovery_delay": "0s",
        }
        args = ["--plugin", str(plugin), "--config", str(REPO / "plugin.hcl"), "--phase", "run"]
        for key, value in sets.items():
            args += ["--set", set_of(key, value)]
        for item in extra:  # after ours: the host applies overrides in order
            args += ["--set", item]
        args += ["--duration", "0", "--stats-interval", f"{stats_interval:g}"]
        self.proc: HostProcess = start_host(args, binary=build_host())
        fp = self.proc.wait_for(lambda e: e["event"] == "fingerprint" and e["n_devices"] >= CARDS * SHARES, 120)
        group = fp["groups"][0]
        self.device = f"{group['vendor']}/{group['type']}/{group['name']}"
        self.ids = sorted(d["id"] for g in fp["groups"] for d in g["devices"])
        if len(self.ids) != CARDS * SHARES:
            raise SystemExit(f"the plugin fingerprinted {len(self.ids)} instances, expected {CARDS * SHARES}")
        self.pid = next(int(e["pid"]) for e in self.proc.events if e["event"] == "launch" and e.get("launch") == 3)
        self.holder: dict[str, tuple[str, str]] = {}  # share id -> (allocation id, grant id)

    def reserve_for_new_alloc(self, share: str) -> float:
        """Nomad's order: the allocation exists with its device ID, then Reserve. Seconds (Go host's clock)."""
        alloc = f"alloc-{uuid.uuid4()}"
        self.api.add_alloc(alloc, [share], "running", device=self.device)
        event = reserve(self.proc, [share], alloc)
        if not event["ok"]:
            raise SystemExit(f"Reserve({share}) failed: {event.get('error')}")
        self.holder[share] = (alloc, str(event["envs"]["LINGJUN_GRANT_ID"]))
        return float(event["seconds"])

    def re_reserve(self, share: str) -> float:
        """The share's allocation is gone (garbage-collected), a new one gets it: the plugin releases, then allocates."""
        self.api.remove_alloc(self.holder[share][0])
        return self.reserve_for_new_alloc(share)

    def stats_seen(self) -> int:
        """Stats responses the host has reported so far (an echo round trip takes in all before it)."""
        tag = str(uuid.uuid4())
        self.proc.send({"op": "echo", "data": tag})
        self.proc.wait_for(lambda e: e["event"] == "echo" and e.get("data") == tag, 30)
        return sum(1 for e in self.proc.events if e["event"] == "stats")

    def minor_of(self, share: str) -> int:
        return next(c.minor for c in self.sim.cards if share.startswith(c.uuid))


class RawXdm:
    """A generated stub on the simulator's socket, holding one grant of its own: Release it, Allocate the next."""

    def __init__(self, sim: Simulator) -> None:
        self.channel = grpc.insecure_channel(f"unix://{sim.dp2mgr_path}")
        self.stub = pb_grpc.XpuDeviceManagerServiceStub(self.channel)
        self.grant = ""

    def allocate(self, minor: int) -> None:
        self.grant = f"raw-{uuid.uuid4()}"
        request = pb.AllocateRequest(id=self.grant, devices=[pb.DeviceRequest(minor=minor, memory=1)])
        response = self.stub.Allocate(request, timeout=10, wait_for_ready=True)
        if response.status != 0:
            raise SystemExit(f"raw Allocate failed: {response.message}")

    def release_allocate(self, minor: int) -> float:
        t0 = time.perf_counter()
        response = self.stub.Release(pb.ReleaseRequest(id=self.grant), timeout=10)
        if response.status != 0:
            raise SystemExit(f"raw Release failed: {response.message}")
        self.allocate(minor)
        return time.perf_counter() - t0


@contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic-GC pause of this process (which also serves XDM) lands in one timed call but not the other."""
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.unfreeze()


def reserve_guard(node: Node, count: int) -> Guard:
    raw = RawXdm(node.sim)
    try:
        raw.allocate(node.minor_of(node.ids[0]))
        for share in node.ids[:5]:  # warm both paths untimed
            node.re_reserve(share)
            raw.release_allocate(node.minor_of(share))
        reserves, raws = [], []
        with gc_paused():
            for k in range(count):
                share = node.ids[(k * 7) % len(node.ids)]  # 7 is prime to 160: every share, cards interleaved
                reserves.append(node.re_reserve(share))
                raws.append(raw.release_allocate(node.minor_of(share)))
        held = len(node.sim.grants())
    finally:
        raw.channel.close()
    r99, a99 = pct(reserves, 99), pct(raws, 99)
    ratio = r99 / a99
    detail = {
        "reserves": count,
        "reserve_p50_ms": ms(pct(reserves, 50)),
        "reserve_p99_ms": ms(r99),
        "raw_p50_ms": ms(pct(raws, 50)),
        "raw_p99_ms": ms(a99),
        "xdm_grants_after": held,
    }
    ok = ratio <= RESERVE_RATIO and held == CARDS * SHARES + 1
    return Guard(
        "Reserve p99 / raw Release+Allocate p99",
        f"x{RESERVE_RATIO:g}",
        f"{ms(r99)} / {ms(a99)} ms = x{ratio:.2f}",
        ratio / RESERVE_RATIO,
        ok,
        detail,
    )


def steady_guards(node: Node, warmup: float, seconds: float) -> tuple[Guard, Guard]:
    """CPU over the window, and the largest VmRSS seen in it."""
    time.sleep(warmup)
    stats_before = node.stats_seen()
    rss = PeakRss(node.pid, every=0.25)
    cpu = cpu_percent(node.pid, seconds)
    peak = rss.stop()
    stats = node.stats_seen() - stats_before
    detail = {"window_s": seconds, "stats_responses": stats, "live_grants": len(node.holder)}
    cpu_guard = Guard(
        "plugin CPU (steady, 1 s Stats)",
        f"{CPU_PERCENT:g} % of one core",
        f"{cpu:.2f} %",
        cpu / CPU_PERCENT,
        cpu <= CPU_PERCENT and stats >= seconds / 2,
        detail,
    )
    rss_guard = Guard("plugin RSS (steady)", f"{RSS_MIB:g} MiB", f"{peak:.1f} MiB", peak / RSS_MIB, peak <= RSS_MIB, {})
    return cpu_guard, rss_guard


def health_guard(node: Node, flips: int) -> Guard:
    samples = time_flips(node.proc, node.sim, flips, 0.05)
    p99 = pct(samples, 99)
    detail = {"flips": flips, "p50_ms": round(pct(samples, 50), 2), "max_ms": round(max(samples), 2)}
    return Guard(
        "health flip -> Fingerprint p99",
        f"{HEALTH_P99_MS:g} ms",
        f"{p99:.1f} ms",
        p99 / HEALTH_P99_MS,
        p99 <= HEALTH_P99_MS,
        detail,
    )


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> float:
    t0 = time.monotonic()
    while not condition():
        if time.monotonic() - t0 > timeout:
            raise SystemExit(f"{what}: not within {timeout} s")
        time.sleep(0.005)
    return time.monotonic() - t0


def release_guard(node: Node, trials: int) -> Guard:
    delays = []
    for t in range(trials):
        share = node.ids[(t * SHARES + t) % len(node.ids)]  # a different card each time
        alloc, grant = node.holder[share]
        node.api.set_status(alloc, "complete")
        delays.append(wait_until(lambda g=grant: g not in node.sim.grants(), 60, f"release of grant {grant}"))
        node.re_reserve(share)  # back to 160 live grants
    worst, limit = max(delays), GRACE_S + RELEASE_SLACK_S
    return Guard(
        "release after the allocation ends",
        f"grace {GRACE_S:g} s + {RELEASE_SLACK_S:g} s",
        f"{worst:.2f} s (max of {trials})",
        worst / limit,
        worst <= limit,
        {"delays_s": [round(d, 3) for d in delays]},
    )


def handshake_guard(plugin: Path, runs: int) -> Guard:
    result = measure_handshake([plugin], runs)[str(plugin)]
    median = result["median_ms"]
    return Guard(
        "exec -> handshake line (median)",
        f"{HANDSHAKE_MS:g} ms",
        f"{median:.0f} ms",
        median / HANDSHAKE_MS,
        median <= HANDSHAKE_MS,
        {"runs": runs, **result},
    )


def run(args: argparse.Namespace, plugin: Path) -> tuple[list[Guard], list[Event]]:
    root = short_root("guards")
    sim = Simulator(root / "s", profile=f"810e-{CARDS}", collect_interval_ms=args.collect_interval_ms).start()
    try:
        with NomadApiDouble() as api:
            node = Node(plugin, sim, api, root, args.set, args.stats_interval)
            rss = PeakRss(node.pid)
            try:
                fill = [node.reserve_for_new_alloc(share) for share in node.ids]
                print(f"filled: {len(fill)} grants, Reserve p50 {ms(pct(fill, 50))} ms", flush=True)
                cpu, memory = steady_guards(node, args.warmup, args.steady_seconds)
                reserving = reserve_guard(node, args.reserves)
                health = health_guard(node, args.flips)
                release = release_guard(node, args.releases)
            finally:
                peak = rss.stop()
                host = node.proc.finish()
    finally:
        sim.stop()
        shutil.rmtree(root, ignore_errors=True)
    memory.detail["peak_of_the_run_mib"] = round(peak, 1)
    handshake = handshake_guard(plugin, args.handshakes)
    return [reserving, cpu, memory, health, release, handshake], host.violations


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--plugin", type=Path, help="the plugin executable (default: this venv's console script)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=JSON",
        help="another plugin config override (repeatable), e.g. 'container_mounts=\"never\"' to see what a "
        "feature costs; the guards' verdicts hold only for the defaults",
    )
    parser.add_argument(
        "--stats-interval",
        type=float,
        default=1.0,
        help="Nomad's collection interval in seconds; with --collect-interval-ms, to see what the Stats stream and "
        "the exporter feed each cost (the CPU guard's verdict holds only for the defaults)",
    )
    parser.add_argument("--collect-interval-ms", type=int, default=1000, help="the simulated exporter's interval")
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds after the fill before the CPU window")
    parser.add_argument("--steady-seconds", type=float, default=30.0, help="the CPU window")
    parser.add_argument("--reserves", type=int, default=200, help="timed Reserves (and as many raw pairs)")
    parser.add_argument("--flips", type=int, default=60, help="health flips (>= 50 for a p99)")
    parser.add_argument("--releases", type=int, default=5, help="allocations ended, one after another")
    parser.add_argument("--handshakes", type=int, default=20, help="timed launches")
    args = parser.parse_args()
    plugin = args.plugin.absolute() if args.plugin else real_plugin()
    started = time.monotonic()
    guards, violations = run(args, plugin)
    print(f"plugin: {plugin}; {CARDS} cards x {SHARES} shares, {CARDS * SHARES} live grants; {os.cpu_count()} CPUs")
    print("| guard | limit | measured | ratio to limit | verdict |")
    print("|---|---|---|---|---|")
    for g in guards:
        print(f"| {g.name} | {g.limit} | {g.measured} | {g.ratio:.2f} | {'PASS' if g.passed else 'FAIL'} |")
    for v in violations:
        print(f"host violation: {v.get('rule')}: {v.get('detail')}")
    print(f"took {time.monotonic() - started:.0f} s; load average {os.getloadavg()[0]:.1f}")
    if args.json:
        out = {
            "plugin": str(plugin),
            "overrides": args.set,
            "guards": [asdict(g) for g in guards],
            "host_violations": violations,
            "load_average": os.getloadavg()[0],
        }
        args.json.write_text(json.dumps(out, indent=1))
    return 0 if all(g.passed for g in guards) and not violations else 1


if __name__ == "__main__":
    sys.exit(main())
