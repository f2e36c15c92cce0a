"""One Stats tick on realistic readings: pushes from the simulator, replayed into the assembler.

Why: ``stats_load.py`` changes every metric of every card every tick, the
worst case for the assembler's memo of encoded attributes. The simulator's
readings wander within a range as real ones do (a few values a card change
from one push to the next, and most of them were shown before), and that is
what the plugin's Stats stream meets every second (issue 14, goal 2).

The script starts the simulator (profile 810e-16, 16 cards), records
``--pushes`` pushes of its exporter stream as the bytes on the wire, then
replays each push through the plugin's own code, timing (thread CPU time)
the two things it does with it every second at 1 s stats:

- the *feed*: parse the push and check it for schema drift (the XDM client's
  deserializer), turn it into samples (``adapter.metric_samples``) and store
  them (``MetricsCache.update``);
- the *build*: one ``StatsAssembler.build`` on the node ``plugin_load.py``
  runs: every card in tdm mode with 7 shares, 3 of them granted.

It prints the median and p90 of each, how many attributes had to be encoded
per build (the memo's misses), and ``own_percent_of_one_core``: the two
medians as a share of one core at one push and one build a second. Set
against ``plugin_load.py``'s whole-process CPU, that is the part of the
plugin's steady state that is our code rather than grpcio's runtime (timed
warm, alone: inside the plugin each runs on cold caches). With ``--rev REV``
it also replays the same pushes through git revision REV, in a child
process, and prints the ratios: a baseline from the same run.

Usage: .venv/bin/python benchmarks/stats_replay.py [--pushes 300] [--rev fb94d93]
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
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def record(pushes: int, out: Path) -> None:
    """``pushes`` exporter pushes of the 810e-16 simulator, pickled as tuples."""
    sys.path.insert(0, str(REPO))
    from nomad_plugin.config.model import PluginConfig
    from nomad_plugin.xdm import adapter
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
            raw: list[bytes] = []
            convert = adapter.metric_samples

            def keeping(msg: Any, binding: Any = None) -> Any:
                # Each parsed push is kept as its bytes, what arrives on the wire, so the replay
                # times the parse too.
                raw.append(msg.SerializeToString())
                return convert(msg, binding)

            adapter.metric_samples = keeping
            subscription = client.exporter_data_stream()
            for _batch in subscription:
                if len(raw) >= pushes:
                    break
            subscription.cancel()
            client.close()
        finally:
            sim.terminate()
            sim.wait(10)
    out.write_bytes(pickle.dumps(raw))


def replay(path: Path, root: Path) -> dict[str, object]:
    """Replay each recorded push through the code found under ``root``: time its feed and one build."""
    sys.path.insert(0, str(root))
    from nomad_plugin._proto.lingjun.api_outer_pb2 import ExporterDataResponse
    from nomad_plugin.model.card import Card, Inventory
    from nomad_plugin.model.instances import Catalog, GroupKey, Instance, InstanceGroup, Kind, share_id
    from nomad_plugin.stats import assemble
    from nomad_plugin.stats.cache import MetricsCache
    from nomad_plugin.stats.layout import GrantInfo
    from nomad_plugin.xdm import adapter
    from nomad_plugin.xdm.adapter import DriftLog

    pushes: list[bytes] = pickle.loads(path.read_bytes())
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
    drift = DriftLog()
    feeds, builds = [], []
    for raw in pushes:
        start = time.thread_time()
        msg = ExporterDataResponse.FromString(raw)  # what the client's deserializer does
        drift.inspect(msg)
        cache.update(adapter.metric_samples(msg))
        middle = time.thread_time()
        assembler.build(catalog, inventory, cache, grants.get, time.monotonic(), 1.0)
        builds.append(time.thread_time() - middle)
        feeds.append(middle - start)
    if drift.findings():
        raise SystemExit(f"the recorded pushes drifted from the schema under {root}: {drift.findings()}")
    skip = len(pushes) // 10  # the first builds fill the memos
    feed, build = sorted(feeds[skip:]), sorted(builds[skip:])
    feed_ms, build_ms = statistics.median(feed) * 1000, statistics.median(build) * 1000
    return {
        "code": str(root),
        "samples_per_push": len(adapter.metric_samples(ExporterDataResponse.FromString(pushes[-1]))),
        "feed_median_ms": round(feed_ms, 3),
        "feed_p90_ms": round(feed[int(len(feed) * 0.9)] * 1000, 3),
        "median_ms": round(build_ms, 3),
        "p90_ms": round(build[int(len(build) * 0.9)] * 1000, 3),
        "encoded_per_build": round(encoded["n"] / len(pushes), 1),
        "own_percent_of_one_core": round((feed_ms + build_ms) / 1000 * 100, 3),  # one push, one build a second
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
        for key, name in (("median_ms", "ratio_median"), ("feed_median_ms", "ratio_feed_median")):
            ours, base = results["this tree"][key], results[args.rev][key]  # type: ignore[index]
            report[name] = round(float(ours) / float(base), 2)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
