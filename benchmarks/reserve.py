"""Reserve latency as the node fills (end to end through go-plugin gRPC), and release delay after an allocation ends.

    .venv/bin/python benchmarks/reserve.py [--fill 1088] [--repeats 2] [--window 64] [--plugin PATH]
                                           [--grace 0.5] [--trials 10] [--skip-release] [--interleaved]
                                           [--idle-ms 0] [--container-mounts auto|always|never]

Part 1 (issue 14): a synthetic 256-card simulator (``benchmarks/synthetic_sim.py``,
its own process) and the real plugin launched as Nomad launches it (magic
cookie, handshake, PluginInfo, ConfigSchema, SetConfig twice, Fingerprint
stream; ``nomad_plugin.launcher``), every card in tdm mode with 7 shares
(1,792 instances), the durable journal on ext4 (/var/tmp). The benchmark
FILLS the node: Reserve one share after another over go-plugin's gRPC and
never releases, so the journal holds 1, 2, ... ``--fill`` live grants. After
each Reserve, a raw ``Allocate`` of a whole card that the fill never reaches
(the last one) is timed from this process with the plugin's own XDM client,
then released untimed: the baseline, interleaved with the subject in the
same run. Reported per window of ``--window`` Reserves starting at 1, 112
and 1,024 live grants: Reserve p50/p99, raw Allocate p50/p99, the ratios.
Targets: the three Reserve p50s within +-20 % of each other; Reserve p99 <=
x3 raw Allocate p99 over the run (each level's ratio is shown too; a p99 of
its 128 samples is their second largest, so it is not judged). The first
Reserve after the plugin starts is reported apart (its gRPC server and XDM
paths warm up) and left out of the windows.

``--idle-ms N`` (fill only): the box idles N ms before each timed Reserve
and before each timed raw Allocate, so both meet processes that have slept,
as a Reserve does in production (Nomad calls it once per task start). Both
calls slow down after an idle pause (on the 2-core VM a 30 ms pause adds
about 0.9 ms of CPU to the plugin's side of a Reserve), and a Reserve more,
as it wakes two processes where the raw Allocate wakes one; the pause
gives both the same start.

``--interleaved`` (for a loaded box, where the load changes during one fill
and so moves one level's p50 against another's): one node per level, each
filled untimed to ``level - 1`` live grants (never released), then the
timed Reserves go round-robin over the nodes, each followed by a raw
Allocate on that node's simulator, so every level sees the same moments.
Each node keeps filling: level L covers L .. L + window - 1 live grants. The
last pre-fill Reserve of each node and one raw Allocate are made in one
untimed round over all nodes right before the timed ones, so no node starts
its timed Reserves cold after idling while the others filled. This
process's own cyclic GC is paused while it times (``harness_gc_paused``).

Part 2: the Nomad API double and the reconciler thread (blocking queries,
short grace), in-process. Each trial marks an allocation ``complete`` and
times until the grant is gone from the simulator. Target: <= 2 s + grace.
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nomad_plugin._proto.nomad import device_pb2, device_pb2_grpc
from nomad_plugin.config.model import PluginConfig
from nomad_plugin.journal import Journal
from nomad_plugin.launcher.config import full_config
from nomad_plugin.launcher.process import launch, wait_for_devices
from nomad_plugin.model.grant import DeviceAsk, GrantRequest
from nomad_plugin.model.instances import Catalog, GroupKey, Instance, InstanceGroup, Kind
from nomad_plugin.nomad.reserve import Reserver
from nomad_plugin.reconcile.nomad_api import NomadApiSettings, NomadClient
from nomad_plugin.reconcile.reconciler import Reconciler
from nomad_plugin.sim import Simulator
from tests.doubles.nomad_api import NomadApiDouble

REPO = Path(__file__).resolve().parents[1]
CARDS = 256
SHARES = 7
LEVELS = (1, 112, 1024)


def make_backend(config: PluginConfig):  # type: ignore[no-untyped-def]
    try:
        from nomad_plugin.xdm.backend import XdmBackend  # type: ignore[import-not-found]

        backend = XdmBackend(config)
        backend.start()
        return backend, "XdmBackend"
    except ImportError:
        from nomad_plugin.xdm.client import XdmClient

        return XdmClient(config), "XdmClient (XdmBackend not in the tree yet)"


def _p99_verdict(run_ratio: float, worst_level_ratio: float, level_samples: int) -> None:
    """Judge the p99 over the whole run (issue 14's target); show the worst level's for what it is.

    A level holds ``level_samples`` Reserves, so its "p99" is about its second-largest sample: one
    scheduler hiccup on the shared box moves it, and it is printed, not judged.
    """
    print(f"p99 ratio over the run: x{run_ratio:.2f} (target <= x3): {'PASS' if run_ratio <= 3 else 'FAIL'}")
    print(f"worst level's p99 ratio: x{worst_level_ratio:.2f} (a p99 of {level_samples} samples; shown, not judged)")


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def start_sim(sockets: str, collect_ms: int = 1000) -> subprocess.Popen[bytes]:
    helper = str(REPO / "benchmarks" / "synthetic_sim.py")
    sim_args = ["--socket-dir", sockets, "-q", "--collect-interval-ms", str(collect_ms)]
    sim = subprocess.Popen(
        [sys.executable, helper, "--cards", str(CARDS), "--", *sim_args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while not os.path.exists(f"{sockets}/dp2mgr.sock"):
        if time.monotonic() > deadline or sim.poll() is not None:
            raise SystemExit("the synthetic simulator did not start")
        time.sleep(0.05)
    return sim


class Node:
    """A synthetic simulator, the real plugin launched on it, and a raw XDM client; filled one share at a time."""

    def __init__(self, args: argparse.Namespace, need: int) -> None:
        self.sockets = tempfile.mkdtemp(prefix="ljr-", dir="/tmp")
        self.data = tempfile.mkdtemp(prefix="ljr-data-", dir="/var/tmp")
        self.sim = start_sim(self.sockets, args.collect_interval_ms)
        config = PluginConfig(
            xdm_socket=f"{self.sockets}/dp2mgr.sock", config_socket=f"{self.sockets}/config-daemon.sock"
        )
        self.backend, _ = make_backend(config)
        plugin_cfg = full_config(
            {
                "xdm_socket": config.xdm_socket,
                "config_socket": config.config_socket,
                "data_dir": self.data,
                "reconcile": False,
                "nvml_enrich": False,
                "default_mode": "tdm",
                "tdm_shares": SHARES,
                "container_mounts": args.container_mounts,
            }
        )
        self.session = launch(plugin_cfg, plugin=args.plugin)
        groups = wait_for_devices(self.session, 60)
        self.ids = sorted(
            (d.id for g in groups for d in g.devices),
            key=lambda i: (i.rsplit("-", 1)[0], int(i.rsplit("-", 1)[1]) if i.rsplit("-", 1)[1].isdigit() else 0),
        )
        if len(self.ids) < need + SHARES:
            raise SystemExit(f"only {len(self.ids)} instances fingerprinted; need {need + SHARES}")
        self.stub = device_pb2_grpc.DevicePluginStub(self.session.plugin.channel)
        self.spare = DeviceAsk(minor=CARDS - 1)  # whole last card: the fill never gets there
        self.live = 0
        for _ in range(5):  # warm-up of the raw path (channel, probe)
            self.raw_allocate()

    def reserve(self) -> float:
        """Reserve the next share (never released): ms."""
        req = device_pb2.ReserveRequest(device_ids=[self.ids[self.live]])
        t0 = time.perf_counter()
        self.stub.Reserve(req, timeout=60)
        ms = (time.perf_counter() - t0) * 1000
        self.live += 1
        return ms

    def raw_allocate(self) -> float:
        """A raw Allocate of the spare card from this process (timed), then its release (untimed): ms."""
        gid = str(uuid.uuid4())
        t0 = time.perf_counter()
        self.backend.allocate(GrantRequest(grant_id=gid, asks=(self.spare,)))
        ms = (time.perf_counter() - t0) * 1000
        self.backend.release(gid)
        return ms

    def check(self) -> None:
        live = len(Journal(self.data).entries())
        if live != self.live:
            raise SystemExit(f"the journal holds {live} grants, expected {self.live}")

    def close(self) -> None:
        self.session.plugin.shutdown()
        self.sim.terminate()
        self.sim.wait(10)
        close = getattr(self.backend, "close", None) or getattr(self.backend, "stop", None)
        if close is not None:
            close()
        shutil.rmtree(self.data, ignore_errors=True)
        shutil.rmtree(self.sockets, ignore_errors=True)


@contextmanager
def harness_gc_paused() -> Iterator[None]:
    """No cyclic-GC pause in this (measuring) process while it times.

    Why: this process times both the Reserve and the raw Allocate, and a collection
    of its own heap (13-27 ms for a full one, measured with ``gc.callbacks``) lands
    in whichever call is running: a profile put two 12.6 ms stalls of this kind in
    the Reserve column of one run, with the plugin's own handling at 1.9 ms. The
    plugin and the simulator keep their GC as shipped.
    """
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.unfreeze()


def fill_once(args: argparse.Namespace) -> tuple[list[float], list[float], float]:
    """One fill from an empty node: (Reserve ms, raw Allocate ms), index i = i+1 live grants; first Reserve ms."""
    node = Node(args, args.fill)
    try:
        reserve_ms: list[float] = []
        raw_ms: list[float] = []
        idle = args.idle_ms / 1000
        with harness_gc_paused():
            for _ in range(args.fill):
                time.sleep(idle)
                reserve_ms.append(node.reserve())
                time.sleep(idle)
                raw_ms.append(node.raw_allocate())
        node.check()
        return reserve_ms, raw_ms, reserve_ms[0]
    finally:
        node.close()


def interleaved_once(args: argparse.Namespace) -> dict[int, tuple[list[float], list[float]]]:
    """One node per level, pre-filled untimed; timed Reserves round-robin. Level -> (Reserve ms, raw ms)."""
    nodes: dict[int, Node] = {}
    try:
        for level in LEVELS:
            node = Node(args, level + args.window)
            nodes[level] = node
            node.reserve()  # the first Reserve after start warms the plugin up: untimed, as the rest of the fill
            while node.live < level - 2:
                node.reserve()
        # One untimed round over every node right before timing: the level-1 node sat idle for
        # seconds while the others filled, and its first Reserve after that paid cold caches on
        # both sides of XDM (p50 x2: 4.3-5.7 ms in-plugin at every level) that the raw Allocate,
        # timed right after it on an XDM it had just woken, never saw.
        for level, node in nodes.items():
            if node.live < level - 1:
                node.reserve()
            node.raw_allocate()
        out: dict[int, tuple[list[float], list[float]]] = {level: ([], []) for level in LEVELS}
        with harness_gc_paused():
            for k in range(args.window):
                order = LEVELS[k % len(LEVELS) :] + LEVELS[: k % len(LEVELS)]  # rotate who goes first
                for level in order:
                    node = nodes[level]
                    out[level][0].append(node.reserve())
                    out[level][1].append(node.raw_allocate())
        for node in nodes.values():
            node.check()
        return out
    finally:
        for node in nodes.values():
            node.close()


def part1_interleaved(args: argparse.Namespace) -> None:
    runs = [interleaved_once(args) for _ in range(args.repeats)]
    print(
        f"Reserve at {', '.join(str(v) for v in LEVELS)} live grants, interleaved: one {CARDS}-card x {SHARES}-share "
        f"node per level, {args.window} Reserves each round-robin, {args.repeats} runs; "
        f"container_mounts = {args.container_mounts}"
    )
    print(
        "| live grants | n | Reserve p50 | Reserve p99 | raw Allocate p50 | raw Allocate p99 | p50 ratio | p99 ratio |"
    )
    print("|---|---|---|---|---|---|---|---|")
    p50s, p99_ratios = [], []
    for level in LEVELS:
        rs = [ms for run in runs for ms in run[level][0]]
        ra = [ms for run in runs for ms in run[level][1]]
        r50, r99, a50, a99 = pct(rs, 50), pct(rs, 99), pct(ra, 50), pct(ra, 99)
        p50s.append(r50)
        p99_ratios.append(r99 / a99)
        print(
            f"| {level}-{level + args.window - 1} | {len(rs)} | {r50:.2f} ms | {r99:.2f} ms | {a50:.2f} ms "
            f"| {a99:.2f} ms | x{r50 / a50:.2f} | x{r99 / a99:.2f} |"
        )
    allr = [ms for run in runs for level in LEVELS for ms in run[level][0]]
    alla = [ms for run in runs for level in LEVELS for ms in run[level][1]]
    print(
        f"all levels: Reserve p50 {pct(allr, 50):.2f} ms p99 {pct(allr, 99):.2f} ms; "
        f"raw Allocate p50 {pct(alla, 50):.2f} ms p99 {pct(alla, 99):.2f} ms; "
        f"p99 ratio x{pct(allr, 99) / pct(alla, 99):.2f}"
    )
    spread = max(p50s) / min(p50s) - 1
    print(f"p50 spread across levels: {100 * spread:.1f} % (target <= 20 %): {'PASS' if spread <= 0.2 else 'FAIL'}")
    _p99_verdict(pct(allr, 99) / pct(alla, 99), max(p99_ratios), args.window * args.repeats)
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")


def part1(args: argparse.Namespace) -> None:
    reserves: list[list[float]] = []
    raws: list[list[float]] = []
    firsts: list[float] = []
    for _ in range(args.repeats):
        r, a, first = fill_once(args)
        reserves.append(r[1:])  # the first Reserve after start is reported apart
        raws.append(a[1:])
        firsts.append(first)
    plugin = args.plugin or "console script (.venv) / python -m nomad_plugin"
    print(
        f"Reserve while filling a {CARDS}-card x {SHARES}-share node to {args.fill} live grants, {args.repeats} fills"
    )
    print(f"plugin: {plugin}; end to end over go-plugin gRPC; journal on /var/tmp (ext4), a synced snapshot per change")
    print(
        f"simulator exporter interval: {args.collect_interval_ms} ms; container_mounts = {args.container_mounts}; "
        f"idle before each timed call: {args.idle_ms:g} ms"
    )
    print(
        "| live grants | n | Reserve p50 | Reserve p99 | raw Allocate p50 | raw Allocate p99 | p50 ratio | p99 ratio |"
    )
    print("|---|---|---|---|---|---|---|---|")
    p50s = []
    worst_p99_ratio = 0.0
    for level in LEVELS:
        lo = max(2, level - args.window // 2)
        hi = lo + args.window - 1
        rs = [ms for fill in reserves for ms in fill[lo - 2 : hi - 1]]  # fill[i] = i + 2 live grants
        ra = [ms for fill in raws for ms in fill[lo - 2 : hi - 1]]
        r50, r99, a50, a99 = pct(rs, 50), pct(rs, 99), pct(ra, 50), pct(ra, 99)
        p50s.append(r50)
        worst_p99_ratio = max(worst_p99_ratio, r99 / a99)
        print(
            f"| {lo}-{hi} | {len(rs)} | {r50:.2f} ms | {r99:.2f} ms | {a50:.2f} ms | {a99:.2f} ms "
            f"| x{r50 / a50:.2f} | x{r99 / a99:.2f} |"
        )
    allr = [ms for fill in reserves for ms in fill]
    alla = [ms for fill in raws for ms in fill]
    print(
        f"whole fill: Reserve p50 {pct(allr, 50):.2f} ms p99 {pct(allr, 99):.2f} ms; "
        f"raw Allocate p50 {pct(alla, 50):.2f} ms p99 {pct(alla, 99):.2f} ms; "
        f"p99 ratio x{pct(allr, 99) / pct(alla, 99):.2f}"
    )
    spread = max(p50s) / min(p50s) - 1
    print(f"p50 spread across levels: {100 * spread:.1f} % (target <= 20 %): {'PASS' if spread <= 0.2 else 'FAIL'}")
    _p99_verdict(pct(allr, 99) / pct(alla, 99), worst_p99_ratio, args.window * args.repeats)
    print(f"first Reserve after the plugin started (left out above): {', '.join(f'{ms:.1f} ms' for ms in firsts)}")
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fill", type=int, default=1024 + 64, help="live grants at the end of a fill")
    parser.add_argument("--repeats", type=int, default=2, help="fills (each from an empty node)")
    parser.add_argument("--window", type=int, default=64, help="Reserves per reported level")
    parser.add_argument("--plugin", help="the plugin executable (default: the console script, else -m)")
    parser.add_argument("--skip-release", action="store_true", help="only part 1")
    parser.add_argument(
        "--collect-interval-ms",
        type=int,
        default=1000,
        help="the simulator's exporter interval (a large value takes the metrics load off both processes)",
    )
    parser.add_argument(
        "--interleaved",
        action="store_true",
        help="one node per level, timed Reserves round-robin (for a loaded box); implies --skip-release",
    )
    parser.add_argument(
        "--container-mounts",
        choices=("auto", "always", "never"),
        default="auto",
        help="the plugin's container_mounts (default auto, the plugin's default: with no Nomad agent here, "
        "each Reserve's mount question fails on a refused connection and the mounts are withheld)",
    )
    parser.add_argument(
        "--idle-ms",
        type=float,
        default=0.0,
        help="fill only: the box idles this long before each timed Reserve and each timed raw Allocate "
        "(Nomad calls Reserve once per task start, so in production a Reserve meets an idle plugin and XDM)",
    )
    parser.add_argument("--grace", type=float, default=0.5)
    parser.add_argument("--trials", type=int, default=10)
    args = parser.parse_args()
    if args.plugin is None and (REPO / ".venv" / "bin" / "nomad-device-lingjun").exists():
        args.plugin = str(REPO / ".venv" / "bin" / "nomad-device-lingjun")
    if args.interleaved:
        part1_interleaved(args)
        return 0
    part1(args)
    if args.skip_release:
        return 0

    sockets = tempfile.mkdtemp(prefix="ljb-", dir="/tmp")
    data = tempfile.mkdtemp(prefix="ljb-data-", dir="/var/tmp")
    sim = Simulator(sockets, profile="810e-16").start()
    config = PluginConfig(
        data_dir=data,
        xdm_socket=f"{sockets}/dp2mgr.sock",
        config_socket=f"{sockets}/config-daemon.sock",
        release_grace_period=args.grace,
    )
    backend, _ = make_backend(config)
    insts = tuple(Instance(c.uuid, Kind.WHOLE, c.uuid, c.minor) for c in sim.cards)
    cat = Catalog((InstanceGroup(GroupKey("alibaba", "ppu", "PPU 810E"), insts),))
    reserver = Reserver(backend, lambda: cat, Journal(data), config)
    try:
        with NomadApiDouble() as api:
            client = NomadClient(NomadApiSettings(address=api.address, timeout=5.0))
            rec = Reconciler(reserver, client, lambda: cat, grace=args.grace, max_wait=30.0)
            rec.start()
            delays: list[float] = []
            for t in range(args.trials):
                card = sim.cards[t % len(sim.cards)]
                gid = reserver.reserve([card.uuid]).container_res.envs["LINGJUN_GRANT_ID"]
                api.add_alloc(f"alloc-{t}", [card.uuid])
                time.sleep(0.3)  # the reconciler sees it live
                t0 = time.monotonic()
                api.set_status(f"alloc-{t}", "complete")
                while gid in sim.grants():
                    time.sleep(0.005)
                    if time.monotonic() - t0 > 60:
                        raise SystemExit("grant not released within 60 s")
                delays.append(time.monotonic() - t0)
            rec.stop()
            requests = len(api.requests)
        print(
            f"release after alloc ends (grace {args.grace}s, {args.trials} trials): "
            f"median {statistics.median(delays):.3f} s  max {max(delays):.3f} s; "
            f"{requests} API requests in total (blocking queries)"
        )
        print(f"target <= 2 s + grace ({2 + args.grace:.1f} s): {'PASS' if max(delays) <= 2 + args.grace else 'FAIL'}")
    finally:
        sim.stop()
        shutil.rmtree(data, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
