"""The product's simulator serving a drifted schema (drifted_schemas.py) and schema drift (drift.py).

    python -m tests.doubles.drifted_sim --schema renumbered --socket-dir DIR [--profile P] [--reflection on]
        [--drift MODES]

It serves the same sockets as ``nomad-device-lingjun xdm-sim`` (dp2mgr, config-daemon and the control
socket, so ``xdm-sim ctl`` works on it), takes the same socket-directory lock, and stops on SIGTERM or
SIGINT. :class:`DriftedSimulator` is the in-process form. Its control channel also takes ``restart
DOWNTIME SCHEMA`` (come back serving another schema, by name) and ``drift MODES|none``; its ``status``
names the drift.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

from google.protobuf.message import Message

from nomad_plugin._proto.lingjun import api_outer_pb2 as pb
from nomad_plugin.cli.xdm_sim import LOCK_NAME, claim_socket_dir, socket_dir_problem
from nomad_plugin.sim import Simulator
from tests.doubles.drift import EXPORTER_RPCS, Drift, parse_drift
from tests.doubles.drifted_schemas import SCHEMAS, served_schema


class DriftedSimulator(Simulator):
    """A :class:`Simulator` whose schema is named (one of :data:`SCHEMAS`) and whose answers drift."""

    def __init__(
        self,
        socket_dir: Path | str,
        profile: str = "h800-8",
        state_file: Path | str | None = None,
        schema: str = "builtin",
        drift: str | None = None,
        **options: Any,
    ) -> None:
        self.drift: Drift = parse_drift(drift)
        super().__init__(socket_dir, profile, state_file, schema=served_schema(schema), **options)

    def set_drift(self, mode: str | None) -> None:
        drift = parse_drift(mode)
        with self.lock:
            self.drift = drift

    def service_of(self, rpc: str, config: bool) -> str:
        if config:
            return super().service_of(rpc, config)
        exporter = self.drift.split_services and rpc in EXPORTER_RPCS
        return self.drift.service(self.schema, "XpuExporterService" if exporter else "XpuDeviceManagerService")

    def serialize(self, msg: Message) -> bytes:
        return self.drift.serialize(self.schema.to_served(msg))

    def allocate(self, req: pb.AllocateRequest) -> pb.AllocateResponse:
        if self.drift.minor_omit_zero:  # a minor of 0 reads as none given
            copy = pb.AllocateRequest()
            copy.CopyFrom(req)
            for d in copy.devices:
                if d.HasField("minor") and d.minor == 0:
                    d.ClearField("minor")
            req = copy
        return super().allocate(req)

    def status(self) -> dict[str, Any]:
        return {**super().status(), "drift": self.drift.describe()}

    def command(self, argv: list[str]) -> Any:
        if argv and argv[0] == "restart" and len(argv) == 3:
            self.restart(float(argv[1]), schema=served_schema(argv[2]))
            return "ok"
        if argv and argv[0] == "drift":
            if len(argv) != 2:
                raise ValueError("usage: drift MODE|none")
            self.set_drift(argv[1])
            return "ok"
        return super().command(argv)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.doubles.drifted_sim", description=__doc__.splitlines()[0])
    parser.add_argument("--schema", choices=SCHEMAS, default="builtin")
    parser.add_argument("--profile", default="h800-8")
    parser.add_argument("--socket-dir", required=True)
    parser.add_argument("--reflection", choices=("on", "off"), default="off")
    parser.add_argument("--drift", help="drift modes, comma separated (tests/doubles/drift.py)")
    args = parser.parse_args(argv)
    socket_dir = Path(args.socket_dir)
    if problem := socket_dir_problem(socket_dir):
        sys.stderr.write(f"drifted_sim: {problem}\n")
        return 1
    lock = claim_socket_dir(socket_dir)
    if isinstance(lock, str):
        sys.stderr.write(f"drifted_sim: {lock}\n")
        return 1
    stop: list[int] = []  # the handler takes no lock (an Event's could be held by the code it interrupts)

    def _stop(signum: int, _frame: FrameType | None) -> None:
        stop.append(signum)

    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    try:
        sim = DriftedSimulator(
            socket_dir, args.profile, schema=args.schema, drift=args.drift, reflection=args.reflection == "on"
        )
        with sim:
            while not stop:
                time.sleep(0.5)
    finally:
        with contextlib.suppress(OSError):
            (socket_dir / LOCK_NAME).unlink()
        os.close(lock)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
