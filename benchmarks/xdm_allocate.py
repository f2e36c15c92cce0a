#!/usr/bin/env python3
"""Allocate+Release round trip: XdmClient vs a raw generated stub, same server, same run.

Target: the client (probing, drift inspection, grant verification, mapping to
model types) adds at most 20 % to the p50 round trip. Runs against the XDM
simulator on a real Unix socket (falls back to the test server if the
simulator is unavailable). Both paths alternate in blocks so machine noise
hits them equally.

Usage: .venv/bin/python benchmarks/xdm_allocate.py [--calls 2000] [--block 100]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import grpc

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nomad_plugin._proto.lingjun import api_outer_pb2 as pb  # noqa: E402
from nomad_plugin._proto.lingjun import api_outer_pb2_grpc as pb_grpc  # noqa: E402
from nomad_plugin.config.model import PluginConfig  # noqa: E402
from nomad_plugin.model.grant import DeviceAsk, GrantRequest  # noqa: E402
from nomad_plugin.xdm.client import XdmClient  # noqa: E402


def start_server(sockdir: Path) -> tuple[Callable[[], None], str]:
    try:
        from nomad_plugin.sim import Simulator

        sim = Simulator(socket_dir=sockdir, profile="h800-8")
        sim.start()
        return sim.stop, "nomad_plugin.sim Simulator (h800-8)"
    except ImportError:
        sys.path.insert(0, str(ROOT))
        from tests.doubles.fake_xdm import FakeXdm

        fake = FakeXdm(str(sockdir / "dp2mgr.sock")).start()
        return fake.stop, "tests/doubles/fake_xdm.py"


def percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(pct / 100 * (len(ordered) - 1))))
    return ordered[index]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000, help="round trips per path (default 2000)")
    parser.add_argument("--block", type=int, default=100, help="round trips per alternating block")
    args = parser.parse_args(argv)

    sockdir = Path(tempfile.mkdtemp(prefix="xdmb", dir="/tmp"))
    stop, server_name = start_server(sockdir)
    socket_path = str(sockdir / "dp2mgr.sock")
    client = XdmClient(PluginConfig(xdm_socket=socket_path, xdm_call_timeout=5.0))
    channel = grpc.insecure_channel(f"unix://{socket_path}")
    stub = pb_grpc.XpuDeviceManagerServiceStub(channel)
    counter = [0]

    def via_client() -> None:
        counter[0] += 1
        grant_id = f"c-{counter[0]}"
        client.allocate(GrantRequest(grant_id, (DeviceAsk(minor=1, core=10, memory_gib=1),)))
        client.release(grant_id)

    def via_stub() -> None:
        counter[0] += 1
        grant_id = f"s-{counter[0]}"
        request = pb.AllocateRequest(id=grant_id, devices=[pb.DeviceRequest(minor=1, core=10, memory=1)])
        response = stub.Allocate(request, timeout=5.0, wait_for_ready=True)
        if response.status != 0 or not response.devices:
            raise RuntimeError(f"raw Allocate failed: {response.message}")
        stub.Release(pb.ReleaseRequest(id=grant_id), timeout=5.0, wait_for_ready=True)

    try:
        for fn in (via_client, via_stub):  # warm up both paths (probe, channel, caches)
            for _ in range(50):
                fn()
        samples: dict[str, list[float]] = {"client": [], "stub": []}
        done = 0
        while done < args.calls:
            n = min(args.block, args.calls - done)
            for name, fn in (("client", via_client), ("stub", via_stub)):
                for _ in range(n):
                    t0 = time.perf_counter()
                    fn()
                    samples[name].append(time.perf_counter() - t0)
            done += n
    finally:
        client.close()
        channel.close()
        stop()
        shutil.rmtree(sockdir, ignore_errors=True)

    print(f"server: {server_name}; {args.calls} Allocate+Release round trips per path, blocks of {args.block}")
    print(f"{'path':8} {'p50 ms':>8} {'p99 ms':>8} {'mean ms':>8}")
    stats = {}
    for name, values in samples.items():
        p50, p99 = percentile(values, 50) * 1000, percentile(values, 99) * 1000
        stats[name] = (p50, p99)
        print(f"{name:8} {p50:8.3f} {p99:8.3f} {statistics.fmean(values) * 1000:8.3f}")
    ratio50 = stats["client"][0] / stats["stub"][0]
    ratio99 = stats["client"][1] / stats["stub"][1]
    verdict = "PASS" if ratio50 <= 1.20 else "FAIL"
    print(f"client/stub p50 ratio {ratio50:.3f} (target <= 1.20: {verdict}); p99 ratio {ratio99:.3f}")
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
