#!/usr/bin/env python3
"""What binding XDM's schema at run time costs (issue 12), as ratios measured in one run.

1. Allocate+Release round trip against the simulator serving the ``renumbered``
   schema with server reflection: ``XdmClient`` with the *reflected* binding
   (default ``xdm_schema = "auto"``) vs a raw stub made from the served schema's
   own message classes (no binding, no verification). Same server, alternating
   blocks. Target: client/stub p50 <= 1.20.
2. Fingerprint build for 16 cards: one ListAndWatch push decoded through a
   binding (adapter + plausibility guards), composed with ListGpuInfo facts,
   then catalog -> verdicts -> response -> sanitize -> bytes. The renumbered
   schema bound by name vs the built-in reconstruction, each decoding bytes in
   its own numbering, alternating blocks. Target: |bound/builtin - 1| <= 10 %
   at the median.

Usage: .venv/bin/python benchmarks/xdm_schema_binding.py [--calls 2000] [--builds 3000]
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
from typing import Any

import grpc

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nomad_plugin.config.model import PluginConfig  # noqa: E402
from nomad_plugin.model.card import Inventory  # noqa: E402
from nomad_plugin.model.grant import DeviceAsk, GrantRequest  # noqa: E402
from nomad_plugin.nomad.catalog import build_catalog  # noqa: E402
from nomad_plugin.nomad.fingerprint import (  # noqa: E402  # noqa: E402
    HealthTracker,
    build_response,
    conflict_reasons,
    instance_verdicts,
    sanitize,
    serialize,
)
from nomad_plugin.sim import Simulator  # noqa: E402
from nomad_plugin.xdm import adapter  # noqa: E402
from nomad_plugin.xdm.adapter import DriftLog  # noqa: E402
from nomad_plugin.xdm.backend import compose_cards  # noqa: E402
from nomad_plugin.xdm.binder import Binding, bind, builtin_binding  # noqa: E402


def percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(pct / 100 * (len(ordered) - 1))))]


def alternate(paths: dict[str, Callable[[], object]], total: int, block: int) -> dict[str, list[float]]:
    for fn in paths.values():  # warm-up: channels, caches, bindings
        for _ in range(50):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in paths}
    done = 0
    while done < total:
        n = min(block, total - done)
        for name, fn in paths.items():
            for _ in range(n):
                t0 = time.perf_counter()
                fn()
                samples[name].append(time.perf_counter() - t0)
        done += n
    return samples


def show(samples: dict[str, list[float]]) -> dict[str, float]:
    p50s = {}
    for name, values in samples.items():
        p50, p99 = percentile(values, 50) * 1000, percentile(values, 99) * 1000
        p50s[name] = p50
        print(f"  {name:22} p50 {p50:8.3f} ms   p99 {p99:8.3f} ms   mean {statistics.fmean(values) * 1000:8.3f} ms")
    return p50s


def allocate_release(calls: int, block: int) -> float:
    root = Path(tempfile.mkdtemp(prefix="xsb", dir="/tmp"))
    sim = Simulator(root / "s", profile="h800-8", schema="renumbered", reflection=True)
    sim.start()
    schema = sim.schema
    client = make_client(sim)
    channel = grpc.insecure_channel(f"unix://{sim.dp2mgr_path}")
    service = schema.device_service
    req_cls = schema.message_class("AllocateRequest")
    dev_cls = schema.message_class("DeviceRequest")
    resp_cls = schema.message_class("AllocateResponse")
    rel_cls, rel_resp = schema.message_class("ReleaseRequest"), schema.message_class("ReleaseResponse")
    allocate = channel.unary_unary(
        f"/{service}/Allocate", request_serializer=req_cls.SerializeToString, response_deserializer=resp_cls.FromString
    )
    release = channel.unary_unary(
        f"/{service}/Release", request_serializer=rel_cls.SerializeToString, response_deserializer=rel_resp.FromString
    )
    counter = [0]

    def via_client() -> None:
        counter[0] += 1
        grant_id = f"c-{counter[0]}"
        client.allocate(GrantRequest(grant_id, (DeviceAsk(minor=1, core=10, memory_gib=1),)))
        client.release(grant_id)

    def via_stub() -> None:
        counter[0] += 1
        grant_id = f"s-{counter[0]}"
        response = allocate(
            req_cls(id=grant_id, devices=[dev_cls(minor=1, core=10, memory=1)]), timeout=5.0, wait_for_ready=True
        )
        if response.status != 0 or not response.devices:
            raise RuntimeError(f"raw Allocate failed: {response.message}")
        release(rel_cls(id=grant_id), timeout=5.0, wait_for_ready=True)

    try:
        assert client.binding().source == "reflection"
        samples = alternate({"client (reflected)": via_client, "raw stub": via_stub}, calls, block)
    finally:
        client.close()
        channel.close()
        sim.stop()
        shutil.rmtree(root, ignore_errors=True)
    print(f"1. Allocate+Release, simulator h800-8 schema=renumbered reflection=on, {calls} per path:")
    p50 = show(samples)
    ratio = p50["client (reflected)"] / p50["raw stub"]
    print(f"  client/stub p50 ratio {ratio:.3f} (target <= 1.20: {'PASS' if ratio <= 1.20 else 'FAIL'})")
    return ratio


def make_client(sim: Simulator) -> Any:
    from nomad_plugin.xdm.client import XdmClient

    return XdmClient(PluginConfig(xdm_socket=str(sim.dp2mgr_path), config_socket=str(sim.config_path)))


def fingerprint_build(builds: int, block: int) -> float:
    root = Path(tempfile.mkdtemp(prefix="xsb", dir="/tmp"))
    pushes: dict[str, tuple[Binding, bytes, bytes]] = {}
    try:
        for schema in ("builtin", "renumbered"):
            sim = Simulator(root / schema, profile="810e-16", schema=schema)
            sim.start()
            try:
                served = sim.schema
                law = served.to_served(sim.device_list()).SerializeToString()
                facts = served.to_served(sim.gpu_info(_gpu_request())).SerializeToString()
                binding = builtin_binding() if schema == "builtin" else bind(served.descriptor_set(), "bench")
                pushes[schema] = (binding, law, facts)
            finally:
                sim.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    config = PluginConfig()
    tracker = HealthTracker()

    def build(name: str) -> Callable[[], object]:
        binding, law, facts_bytes = pushes[name]
        law_cls = binding.rpc("ListAndWatch").response.cls
        info_cls = binding.rpc("ListGpuInfo").response.cls
        drift = DriftLog()

        def run() -> bytes:
            cards = adapter.cards_from_list_and_watch(law_cls.FromString(law), drift, binding)
            facts = adapter.gpu_facts(info_cls.FromString(facts_bytes), binding)
            assert not adapter.card_problems(cards) and not adapter.facts_problems(facts)
            inventory = Inventory(cards=compose_cards(cards, facts), node={"runtime_kit": "enabled"})
            catalog = build_catalog(inventory, config)
            verdicts = instance_verdicts(catalog, tracker.verdicts(), conflict_reasons(catalog, {}), None)
            response, problems = sanitize(build_response(catalog, verdicts))
            assert not problems and len(inventory.cards) == 16, problems
            return serialize(response)

        return run

    assert build("builtin")() == build("renumbered")()  # the same fingerprint bytes either way
    # one build each in turn: a 10 % band needs both paths to see the same machine load
    samples = alternate({"builtin": build("builtin"), "renumbered (bound)": build("renumbered")}, builds, 1)
    print(f"2. Fingerprint build, 16 cards (810e-16), decode+guards+compose+catalog+response, {builds} per path:")
    p50 = show(samples)
    ratio = p50["renumbered (bound)"] / p50["builtin"]
    print(f"  bound/builtin p50 ratio {ratio:.3f} (target within 10 %: {'PASS' if abs(ratio - 1) <= 0.10 else 'FAIL'})")
    return ratio


def _gpu_request():
    from nomad_plugin._proto.lingjun import api_outer_pb2 as pb

    return pb.ListGpuInfoRequest()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000, help="Allocate+Release round trips per path")
    parser.add_argument("--builds", type=int, default=3000, help="fingerprint builds per path")
    parser.add_argument("--block", type=int, default=100, help="iterations per alternating block")
    args = parser.parse_args(argv)
    r1 = allocate_release(args.calls, args.block)
    r2 = fingerprint_build(args.builds, args.block)
    return 0 if r1 <= 1.20 and abs(r2 - 1) <= 0.10 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
