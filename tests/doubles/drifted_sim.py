"""The product's simulator serving a drifted schema (tests/doubles/drifted_schemas.py), as a process.

    python -m tests.doubles.drifted_sim --schema renumbered --profile h800-8 --socket-dir DIR [--reflection on]

It serves the same sockets as ``nomad-device-lingjun xdm-sim`` (dp2mgr, config-daemon and the control
socket, so ``xdm-sim ctl`` works on it), takes the same socket-directory lock, and stops on SIGTERM or
SIGINT. :class:`DriftedSimulator` is the in-process form: its control channel's ``restart DOWNTIME
SCHEMA`` comes back serving another schema by name.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

from nomad_plugin.cli.xdm_sim import LOCK_NAME, claim_socket_dir, socket_dir_problem
from nomad_plugin.sim import Simulator
from tests.doubles.drifted_schemas import SCHEMAS, served_schema


class DriftedSimulator(Simulator):
    """A :class:`Simulator` whose schema is named (one of :data:`SCHEMAS`), here and on its control socket."""

    def __init__(
        self, socket_dir: Path | str, profile: str = "h800-8", schema: str = "builtin", **options: Any
    ) -> None:
        super().__init__(socket_dir, profile, schema=served_schema(schema), **options)

    def command(self, argv: list[str]) -> Any:
        if argv and argv[0] == "restart" and len(argv) == 3:
            self.restart(float(argv[1]), schema=served_schema(argv[2]))
            return "ok"
        return super().command(argv)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.doubles.drifted_sim", description=__doc__.splitlines()[0])
    parser.add_argument("--schema", choices=SCHEMAS, required=True)
    parser.add_argument("--profile", default="h800-8")
    parser.add_argument("--socket-dir", required=True)
    parser.add_argument("--reflection", choices=("on", "off"), default="off")
    parser.add_argument("--drift")
    args = parser.parse_args(argv)
    socket_dir = Path(args.socket_dir)
    if problem := socket_dir_problem(socket_dir):
        sys.stderr.write(f"drifted_sim: {problem}\n")
        return 1
    lock = claim_socket_dir(socket_dir)
    if isinstance(lock, str):
        sys.stderr.write(f"drifted_sim: {lock}\n")
        return 1
    done = threading.Event()

    def _stop(_signum: int, _frame: FrameType | None) -> None:
        done.set()

    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    sim = DriftedSimulator(socket_dir, args.profile, args.schema, reflection=args.reflection == "on", drift=args.drift)
    try:
        with sim:
            while not done.wait(0.5):
                pass
    finally:
        with contextlib.suppress(OSError):
            (socket_dir / LOCK_NAME).unlink()
        os.close(lock)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
