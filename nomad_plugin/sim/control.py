"""The control channel: a JSON-lines Unix socket (``<socket_dir>/xdm-sim-control.sock``), so that a
person or a test in another process can flip health or force a restart.

A request is one line ``{"argv": ["health", "3", "unhealthy", "XID 79"]}``; the answer one line
``{"ok": true, "result": ...}`` or ``{"ok": false, "error": "..."}``. The commands are those of
``nomad-device-lingjun xdm-sim ctl`` (:data:`COMMANDS`), applied by ``sim.simulator.run_command``: the
simulator imports its control channel, not the reverse (docs/architecture.md).
"""

from __future__ import annotations

import json
import logging
import socket
import socketserver
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

COMMANDS: dict[str, str] = {
    "status": "summary: cards, health, grants, schema, error mode",
    "grants": "the simulator's allocations (id -> minors, core, memory, slice, time)",
    "health MINOR healthy|unhealthy [REASON]": "flip a card's health (pushed on ListAndWatch)",
    "remove MINOR / add MINOR": "a card disappears / comes back",
    "restart [DOWNTIME]": "stop, unlink the sockets, wait DOWNTIME s (default 0.5), re-bind",
    "reflection on|off": "serve gRPC server reflection of the served schema, or not",
    "crash / revive": "stop serving leaving stale socket files / come back",
    "slow-start SECONDS": "every RPC hangs for SECONDS from now",
    "latency RPC SECONDS": "delay RPC ('*' = all) by SECONDS; 'inf' hangs, 0 clears",
    "error-mode inband|grpc": "refusals as in-band status/message or as gRPC codes",
    "enable / disable": "flip the config-daemon flag (QueryStatus.enabled)",
    "topology LEVEL VALUE|none [MINOR...]": "set a string topology level (leafSwitch, pointOfDelivery, ...) "
    "on every card or the listed ones, or remove it (pushed on ListAndWatch)",
    "duplicate-id reject|idempotent": "what Allocate does with a known id",
    "release-unknown not-found|ok": "what Release does with an unknown id",
    "exporter running|stopped|error": "what ExporterGetStatus reports",
    "close-streams": "end every open stream with UNAVAILABLE",
}


class _Handler(socketserver.StreamRequestHandler):
    server: ControlServer

    def handle(self) -> None:
        for raw in self.rfile:
            try:
                argv = json.loads(raw)["argv"]
                if not isinstance(argv, list):
                    raise ValueError("argv must be a list")
                log.info("control: %s", " ".join(str(a) for a in argv))
                reply = {"ok": True, "result": self.server.run(argv)}
            except Exception as exc:
                reply = {"ok": False, "error": str(exc)}
            self.wfile.write(json.dumps(reply, default=str).encode() + b"\n")
            self.wfile.flush()


class ControlServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """Serves ``path`` on a thread of its own from construction until :meth:`stop`."""

    daemon_threads = True
    block_on_close = False

    def __init__(self, run: Callable[[list[str]], Any], path: Path) -> None:
        self.run = run  # one command's argv -> its result; ValueError for bad input
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        super().__init__(str(path), _Handler)
        threading.Thread(
            target=self.serve_forever, kwargs={"poll_interval": 0.05}, name="xdm-sim-control", daemon=True
        ).start()

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
        self.path.unlink(missing_ok=True)


def send_command(path: Path, argv: list[str], timeout: float = 60.0) -> Any:
    """Send one command to a running simulator's control socket; RuntimeError with its error text."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect(str(path))
        except OSError as exc:
            raise ConnectionError(f"control socket {path}: {exc.strerror or exc} (is xdm-sim running?)") from exc
        sock.sendall(json.dumps({"argv": argv}).encode() + b"\n")
        reply = json.loads(sock.makefile("rb").readline())
    if not reply.get("ok"):
        raise RuntimeError(str(reply.get("error")))
    return reply.get("result")
