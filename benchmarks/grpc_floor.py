"""What grpcio's own runtime costs a process shaped like the plugin, with none of our code.

Why: issue 14 asks the plugin to use no more CPU than the simulator it serves
(``plugin_load.py``). Both are Python gRPC processes, and grpcio's sync stack
has a fixed cost of its own: the thread that polls a server's completion queue
and the one that polls a channel's wake five times a second to check for
signals, and every message crosses from grpcio's threads to a Python one.
This script measures that floor on the same box, in the same run, for:

- ``server idle``: a gRPC server with no calls;
- ``server + idle stream``: the same, plus a client stream to another process
  that never sends (the plugin's ListAndWatch between changes);
- ``plugin traffic``: a server that streams one ``--stats-bytes`` message a
  second to a client process (Stats to Nomad, 16 cards: about 190 KB) and holds
  one idle stream for it (Fingerprint between changes), while its own client
  receives one ``--push-bytes`` message a second from a server process (XDM's
  exporter push, 16 cards: about 22 KB) and holds one idle stream there
  (ListAndWatch);
- ``simulator traffic``: a server only, that streams one ``--push-bytes``
  message a second to a client process (the exporter stream) and holds one
  idle stream for it (ListAndWatch).

The payloads are opaque bytes: nothing is parsed, converted or built. Each
process runs with the plugin's own settings (its ``GRPC_EXPERIMENTS`` default,
its relaxed stream waits) and is measured over ``--seconds`` after a warm-up,
as a share of one core. ``plugin traffic`` against ``plugin_load.py``'s
whole-plugin CPU is what is left for our code; ``plugin traffic ÷ simulator
traffic`` is the ratio a plugin with no code of its own would reach.

Usage: .venv/bin/python benchmarks/grpc_floor.py [--seconds 60] [--warmup 5] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from nomad_plugin.goplugin.handshake import choose_polling  # noqa: E402

choose_polling()  # before grpc is imported, as the plugin does
import grpc  # noqa: E402

from nomad_plugin.goplugin.serve import WORKERS  # noqa: E402
from nomad_plugin.xdm.client import relax_stream_waits  # noqa: E402

SERVICE = "floor.Floor"
SCENARIOS = ("server idle", "server + idle stream", "plugin traffic", "simulator traffic")


def serve(address: str, payload_bytes: int) -> grpc.Server:
    """A server with two streams: ``Push`` sends ``payload_bytes`` a second, ``Hold`` never sends."""
    payload = os.urandom(payload_bytes) if payload_bytes else b""

    def push(_request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        stop = threading.Event()
        context.add_callback(stop.set)
        while not stop.wait(1.0):
            yield payload

    def hold(_request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        stop = threading.Event()
        context.add_callback(stop.set)
        stop.wait()
        yield from ()

    handlers = {
        "Push": grpc.unary_stream_rpc_method_handler(push),
        "Hold": grpc.unary_stream_rpc_method_handler(hold),
    }
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="grpc"))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    server.add_insecure_port(address)
    server.start()
    return server


def follow(address: str, method: str) -> grpc.Channel:
    """Open ``method`` on ``address`` and read it on a background thread, as the plugin reads XDM."""
    channel = grpc.insecure_channel(address)
    call = channel.unary_stream(f"/{SERVICE}/{method}")(b"", wait_for_ready=True)  # the peer may still be starting

    def read() -> None:
        try:
            for _message in call:
                pass
        except grpc.RpcError:
            pass  # the peer was killed at the end of the measurement

    threading.Thread(target=read, daemon=True).start()
    return channel


def measured(scenario: str, tmp: str, stats_bytes: int, push_bytes: int) -> list[Any]:
    """Set up ``scenario`` in this process; its peers live in the parent's peer process."""
    relax_stream_waits()
    payload = {"plugin traffic": stats_bytes, "simulator traffic": push_bytes}.get(scenario, 0)
    keep: list[Any] = [serve(f"unix://{tmp}/own.sock", payload)]
    if scenario in ("server + idle stream", "plugin traffic"):  # the plugin's client streams to XDM
        keep.append(follow(f"unix://{tmp}/peer.sock", "Hold"))
    if scenario == "plugin traffic":
        keep.append(follow(f"unix://{tmp}/peer.sock", "Push"))
    return keep


def peer(scenario: str, tmp: str, push_bytes: int) -> list[Any]:
    """The other side: XDM for the plugin's client streams, Nomad (or the plugin) for server streams."""
    keep: list[Any] = [serve(f"unix://{tmp}/peer.sock", push_bytes)]
    deadline = time.monotonic() + 20
    while not os.path.exists(f"{tmp}/own.sock") and time.monotonic() < deadline:
        time.sleep(0.02)
    if scenario in ("plugin traffic", "simulator traffic"):
        # One active and one idle stream on the measured server: Stats and Fingerprint from Nomad,
        # or the exporter stream and ListAndWatch from the plugin.
        keep.append(follow(f"unix://{tmp}/own.sock", "Push"))
        keep.append(follow(f"unix://{tmp}/own.sock", "Hold"))
    return keep


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid``, summed over its threads in nanoseconds (schedstat), in seconds."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue  # a thread that ended between the listing and the read
    return total / 1e9


def run_scenario(scenario: str, args: argparse.Namespace) -> float:
    """Percent of one core the measured process used over ``--seconds``."""
    with tempfile.TemporaryDirectory() as tmp:
        common = ["--stats-bytes", str(args.stats_bytes), "--push-bytes", str(args.push_bytes)]
        child = [sys.executable, __file__, "--scenario", scenario, "--dir", tmp, *common]
        own = subprocess.Popen([*child, "--role", "measured"])
        other = subprocess.Popen([*child, "--role", "peer"])
        try:
            time.sleep(args.warmup)
            for proc in (own, other):
                if proc.poll() is not None:
                    raise SystemExit(f"{scenario}: a child exited early with {proc.returncode}")
            start_cpu, start = cpu_seconds(own.pid), time.monotonic()
            time.sleep(args.seconds)
            used, wall = cpu_seconds(own.pid) - start_cpu, time.monotonic() - start
        finally:
            for proc in (own, other):
                proc.kill()
                proc.wait()
    return round(used / wall * 100, 3)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=2, help="each scenario this many times, alternating")
    parser.add_argument("--stats-bytes", type=int, default=190_000)
    parser.add_argument("--push-bytes", type=int, default=22_000)
    parser.add_argument("--scenario", choices=SCENARIOS, help=argparse.SUPPRESS)
    parser.add_argument("--role", choices=("measured", "peer"), help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role:
        if args.role == "measured":
            keep = measured(args.scenario, args.dir, args.stats_bytes, args.push_bytes)
        else:
            keep = peer(args.scenario, args.dir, args.push_bytes)
        threading.Event().wait()  # killed by the parent
        del keep
        return 0
    results: dict[str, list[float]] = {name: [] for name in SCENARIOS}
    for _ in range(args.rounds):
        for scenario in SCENARIOS:
            results[scenario].append(run_scenario(scenario, args))
    mean = {name: sum(values) / len(values) for name, values in results.items()}
    report = {
        "seconds": args.seconds,
        "percent_of_one_core": results,
        "ratio_plugin_traffic_to_simulator_traffic": round(mean["plugin traffic"] / mean["simulator traffic"], 2),
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
