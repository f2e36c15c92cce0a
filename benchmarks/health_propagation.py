"""Health-change propagation: simulator flip -> Nomad's Fingerprint stream.

    .venv/bin/python benchmarks/health_propagation.py [--flips 60] [--profile h800-8] [--gap 0.05] [--json out.json]

A simulated XDM node (in this process) and the real plugin executable under
the Go conformance host (launch 3 only, streams open, --stdin). The plugin
runs with health_recovery_checks = 1 and health_recovery_delay = "0s", so
every flip is visible: a card alternates unhealthy ("XID 79") / healthy.

Each sample is from ``time.time_ns()`` taken just before
``Simulator.set_health`` to the host's ``recv_unix_ns`` of the first
fingerprint that shows the card in the new state (the host stamps it when
the gRPC message arrives, so this process's reader thread is not in the
path). Cards rotate so consecutive flips touch different cards. Target:
p99 <= 100 ms (``benchmarks/guards.py`` measures the same on the 16-card node).
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nomad_plugin.model.instances import share_id
from nomad_plugin.sim.core import SimCore
from tests.conformance.hostlib import Event, HostProcess, build_host, start_host
from tests.integration.harness import first_fingerprint_with_devices, set_of, sim_node

TARGET_P99_MS = 100.0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]


def card_state(fp: Event, card_uuid: str) -> bool | None:
    """Whether the card (whole, or its first share) is healthy in this fingerprint; None if absent."""
    for group in fp["groups"]:
        for dev in group["devices"]:
            if dev["id"] in (card_uuid, share_id(card_uuid, 0)):
                return bool(dev["healthy"])
    return None


def time_flips(proc: HostProcess, sim: SimCore, flips: int, gap: float) -> list[float]:
    """Flip card health ``flips`` times; ms from each flip to the first fingerprint showing it.

    Even flips break a card, odd flips heal it; cards rotate so consecutive flips touch different
    cards. The plugin must run with health_recovery_checks = 1 and health_recovery_delay = "0s".
    """
    samples_ms: list[float] = []
    cards = sim.cards
    for i in range(flips):
        card = cards[(i // 2) % len(cards)]
        healthy = i % 2 == 1
        flipped = time.time_ns()
        sim.set_health(card.minor, healthy, "" if healthy else "XID 79 (benchmark)")
        fp = proc.wait_for(
            lambda e, c=card.uuid, h=healthy, t=flipped: (
                e["event"] == "fingerprint" and e["recv_unix_ns"] >= t and card_state(e, c) is h
            ),
            timeout=10,
        )
        samples_ms.append((fp["recv_unix_ns"] - flipped) / 1e6)
        time.sleep(gap)
    return samples_ms


def measure(flips: int, profile: str, gap: float) -> dict[str, object]:
    host = build_host()
    with sim_node(profile) as node:
        sets = (set_of("health_recovery_checks", 1), set_of("health_recovery_delay", "0s"))
        args = [*node.plugin_args(*sets, phase="run"), "--duration", "0", "--stats-interval", "1"]
        proc = start_host(args, binary=host)
        try:
            first_fingerprint_with_devices(proc)
            time.sleep(1.0)  # the first fingerprints come from ListGpuInfo, before the first push
            samples_ms = time_flips(proc, node.sim, flips, gap)
        finally:
            run = proc.finish()
    violations = run.summary["violations"] if run.of("summary") else "no summary"
    return {
        "profile": profile,
        "flips": flips,
        "p50_ms": round(statistics.median(samples_ms), 2),
        "p99_ms": round(percentile(samples_ms, 99), 2),
        "max_ms": round(max(samples_ms), 2),
        "target_p99_ms": TARGET_P99_MS,
        "meets_target": percentile(samples_ms, 99) <= TARGET_P99_MS,
        "host_violations": violations,
        "samples_ms": [round(s, 2) for s in samples_ms],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--flips", type=int, default=60, help="health flips to time (>= 50 for a p99)")
    parser.add_argument("--profile", default="h800-8", help="simulator profile")
    parser.add_argument("--gap", type=float, default=0.05, help="seconds between flips")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    if args.flips < 2:
        parser.error("--flips must be at least 2")
    print("command:", shlex.join([".venv/bin/python", "benchmarks/health_propagation.py", *(argv or sys.argv[1:])]))
    result = measure(args.flips, args.profile, args.gap)
    shown = {k: v for k, v in result.items() if k != "samples_ms"}
    print(json.dumps(shown, indent=1))
    print(
        f"health propagation over {result['flips']} flips ({result['profile']}): "
        f"p50 {result['p50_ms']} ms, p99 {result['p99_ms']} ms, max {result['max_ms']} ms "
        f"(target p99 <= {TARGET_P99_MS:g} ms: {'met' if result['meets_target'] else 'MISSED'})"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0 if result["meets_target"] and result["host_violations"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
