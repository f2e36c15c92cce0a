"""One Stats tick on realistic readings: pushes from the simulator, replayed into the assembler.

Why: ``stats_load.py`` changes every metric of every card every tick, the
worst case for the assembler's memo of encoded attributes. The simulator's
readings wander within a range as real ones do (a few values a card change
from one push to the next, and most of them were shown before), and that is
what the plugin's Stats stream meets every second (issue 14, goal 2).

The script starts the simulator (profile 810e-16, 16 cards), records
``--pushes`` pushes of its exporter stream through the plugin's own XDM
client, then replays each into a ``MetricsCache`` and times one
``StatsAssembler.build`` after each (thread CPU time), on the node
``plugin_load.py`` runs: every card in tdm mode with 7 shares, 3 of them
granted. It prints the median and p90 per build and how many attributes had
to be encoded per build (the memo's misses). With ``--rev REV`` it also
times the assembler of git revision REV on the same pushes, in a child
process, and prints the ratio: a baseline from the same run.

Usage: .venv/bin/python benchmarks/stats_replay.py [--pushes 300] [--rev c1368d1]
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def record(pushes: int, out: Path) -> None:
    """``pushes`` exporter pushes of the 810e-16 simulator, pickled as tuples."""
    sys.path.insert(0, str(REPO))
    from nomad_plugin.config.model import PluginConfig
    from nomad_plugin.xdm.client import XdmClient

    with tempfile.TemporaryDirectory() as tmp:
        command = [sys.executable, "-m", "nomad_plugin", "xdm-sim", "--profile", "810e-16", "--socket-dir", tmp]
        sim = subprocess.Popen(
            [*command, "-q", "--collect-interval-ms", "50"],
            cwd=REPO,
        )
        try:
            deadline = time.monotonic() + 20
            while not os.path.exists(f"{tmp}/dp2mgr.sock") and time.monotonic() < deadline:
                time.sleep(0.05)
            client = XdmClient(PluginConfig(xdm_socket=f"{tmp}/dp2mgr.sock", config_socket=f"{tmp}/config-daemon.sock"))
            subscription = client.exporter_data_stream()
            batches = []
            for batch in subscription:
                batches.append([tuple(sample) for sample in batch])
                if len(batches) >= pushes:
                    break
            subscription.cancel()
            client.close()
        finally:
            sim.terminate()
            sim.wait(10)
    out.write_bytes(pickle.dumps(batches))


def replay(path: Path, root: Path) -> dict[str, object]:
    """Time one build after each recorded push with the assembler found under ``root``."""
    sys.path.insert(0, str(root))
    from nomad_plugin.model.card import Card, Inventory
    from nomad_plugin.model.instances import Catalog, GroupKey, Instance, InstanceGroup, Kind, share_id
    from nomad_plugin.model.metrics import MetricSample
    from nomad_plugin.stats import assemble
    from nomad_plugin.stats.cache import MetricsCache
    from nomad_plugin.stats.layout import GrantInfo

    pushes = [[MetricSample(*s) for s in batch] for batch in pickle.loads(path.read_bytes())]
    cards = tuple(
        Card(minor=i, uuid=f"GPU-{i:04d}", model="M890P", vendor="alibaba", xpu_type="gpu", memory_mib=98304)
        for i in range(16)
    )
    shares = tuple(
        Instance(share_id(c.uuid, i), Kind.SHARE, c.uuid, c.minor, index=i, core=14, memory_gib=13)
        for c in cards
        for i in range(7)
    )
    catalog = Catalog(groups=(InstanceGroup(GroupKey("alibaba", "gpu", "M890P-share"), shares),))
    grants = {shares[n].id: GrantInfo(f"grant-{n}", 14, 13) for n in (0, 8, 20)}
    inventory = Inventory(cards=cards)
    encoded = {"n": 0}
    stat_value = assemble.stat_value

    def counting(spec: tuple[object, ...]) -> object:
        encoded["n"] += 1
        return stat_value(spec)  # type: ignore[arg-type]

    assemble.stat_value = counting  # type: ignore[assignment]
    cache = MetricsCache()
    assembler = assemble.StatsAssembler()
    times = []
    for batch in pushes:
        cache.update(batch)
        start = time.thread_time()
        assembler.build(catalog, inventory, cache, grants.get, time.monotonic(), 1.0)
        times.append(time.thread_time() - start)
    times = times[len(times) // 10 :]  # the first builds fill the memos
    times.sort()
    return {
        "assembler": assemble.__file__,
        "median_ms": round(statistics.median(times) * 1000, 3),
        "p90_ms": round(times[int(len(times) * 0.9)] * 1000, 3),
        "encoded_per_build": round(encoded["n"] / len(pushes), 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pushes", type=int, default=300)
    parser.add_argument("--rev", help="also time this git revision's assembler (the baseline)")
    parser.add_argument("--replay", nargs=2, metavar=("PUSHES", "ROOT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.replay:
        print(json.dumps(replay(Path(args.replay[0]), Path(args.replay[1]))))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        pushes = Path(tmp) / "pushes.pkl"
        record(args.pushes, pushes)
        roots = {"this tree": REPO}
        if args.rev:
            baseline = Path(tmp) / "baseline"
            subprocess.run(
                ["git", "-C", str(REPO), "worktree", "add", "-q", "--detach", str(baseline), args.rev], check=True
            )
            roots[args.rev] = baseline
        try:
            results = {}
            for label, root in roots.items():
                done = subprocess.run(
                    [sys.executable, __file__, "--replay", str(pushes), str(root)],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                results[label] = json.loads(done.stdout)
        finally:
            if args.rev:
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(baseline)], check=False)
    report: dict[str, object] = {"pushes": args.pushes, **results}
    if args.rev:
        ours, base = results["this tree"]["median_ms"], results[args.rev]["median_ms"]
        report["ratio_median"] = round(float(ours) / float(base), 2)  # type: ignore[arg-type]
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
