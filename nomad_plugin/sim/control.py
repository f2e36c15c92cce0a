"""The control channel: a JSON-lines Unix socket (``<socket_dir>/xdm-sim-control.sock``), so that a
person or a test in another process can flip health or force a restart.

A request is one line ``{"argv": ["health", "3", "unhealthy", "XID 79"]}``; the answer one line
``{"ok": true, "result": ...}`` or ``{"ok": false, "error": "..."}``. The commands are those of
``nomad-device-lingjun xdm-sim ctl`` (:data:`COMMANDS`).
"""

from __future__ import annotations

import json
import logging
import math
import socket
import socketserver
import threading
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol

from nomad_plugin.sim.allocation import GrantRecord

log = logging.getLogger(__name__)


class ControlTarget(Protocol):
    """What the channel drives (``sim.simulator.Simulator``): a Protocol, so that the simulator
    imports its control channel and not the other way round (docs/architecture.md)."""

    def status(self) -> dict[str, Any]: ...
    def grants(self) -> Mapping[str, GrantRecord]: ...
    def set_health(self, minor: int, healthy: bool, reason: str = "") -> None: ...
    def remove_device(self, minor: int) -> None: ...
    def add_device(self, minor: int) -> None: ...
    def restart(self, downtime: float = 0.5, *, schema: str | None = None) -> None: ...
    def set_reflection(self, on: bool) -> None: ...
    def crash(self) -> None: ...
    def revive(self) -> None: ...
    def slow_start(self, seconds: float) -> None: ...
    def set_latency(self, rpc: str, seconds: float) -> None: ...
    def set_drift(self, mode: str | None) -> None: ...
    def set_choice(self, name: str, value: str) -> None: ...
    def set_enabled(self, enabled: bool) -> None: ...
    def set_topology_level(self, name: str, value: str | None, minors: list[int] | None = None) -> None: ...
    def set_exporter_state(self, state: str) -> None: ...
    def close_streams(self) -> None: ...


COMMANDS: dict[str, str] = {
    "status": "summary: cards, health, grants, drift, error mode",
    "grants": "the simulator's allocations (id -> minors, core, memory, slice, time)",
    "health MINOR healthy|unhealthy [REASON]": "flip a card's health (pushed on ListAndWatch)",
    "remove MINOR / add MINOR": "a card disappears / comes back",
    "restart [DOWNTIME] [SCHEMA]": "stop, unlink the sockets, wait DOWNTIME s (default 0.5), re-bind"
    " (serving SCHEMA: builtin, renumbered or foreign)",
    "reflection on|off": "serve gRPC server reflection of the served schema, or not",
    "crash / revive": "stop serving leaving stale socket files / come back",
    "slow-start SECONDS": "every RPC hangs for SECONDS from now",
    "latency RPC SECONDS": "delay RPC ('*' = all) by SECONDS; 'inf' hangs, 0 clears",
    "drift MODE|none": "schema-drift modes, comma separated",
    "error-mode inband|grpc": "refusals as in-band status/message or as gRPC codes",
    "enable / disable": "flip the config-daemon flag (QueryStatus.enabled)",
    "topology LEVEL VALUE|none [MINOR...]": "set a string topology level (leafSwitch, pointOfDelivery, ...) "
    "on every card or the listed ones, or remove it (pushed on ListAndWatch)",
    "duplicate-id reject|idempotent": "what Allocate does with a known id",
    "release-unknown not-found|ok": "what Release does with an unknown id",
    "exporter running|stopped|error": "what ExporterGetStatus reports",
    "close-streams": "end every open stream with UNAVAILABLE",
}


def _minor(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"minor: {text!r} is not a card number") from None


def _seconds(text: str) -> float:
    try:
        return math.inf if text in ("inf", "hang") else float(text)
    except ValueError:
        raise ValueError(f"seconds: {text!r} is not a number") from None


def _one(args: list[str], usage: str, *allowed: str) -> str:
    """The command's single argument (one of ``allowed``, if given)."""
    if len(args) != 1 or (allowed and args[0] not in allowed):
        raise ValueError(f"usage: {usage}")
    return args[0]


def _choice(name: str, usage: str) -> Callable[[ControlTarget, list[str]], None]:
    """A command setting option ``name`` to its one argument."""
    return lambda sim, a: sim.set_choice(name, _one(a, usage))


def _health(sim: ControlTarget, args: list[str]) -> None:
    if len(args) < 2 or args[1].lower() not in ("healthy", "unhealthy"):
        raise ValueError("usage: health MINOR healthy|unhealthy [REASON]")
    sim.set_health(_minor(args[0]), args[1].lower() == "healthy", " ".join(args[2:]))


def _topology(sim: ControlTarget, args: list[str]) -> None:
    if len(args) < 2:
        raise ValueError("usage: topology LEVEL VALUE|none [MINOR...]")
    sim.set_topology_level(args[0], None if args[1] == "none" else args[1], [_minor(m) for m in args[2:]] or None)


def _latency(sim: ControlTarget, args: list[str]) -> None:
    if len(args) != 2:
        raise ValueError("usage: latency RPC SECONDS")
    sim.set_latency(args[0], _seconds(args[1]))


_HANDLERS: dict[str, Callable[[ControlTarget, list[str]], Any]] = {
    "status": lambda sim, a: sim.status(),
    "grants": lambda sim, a: {gid: asdict(g) for gid, g in sim.grants().items()},
    "health": _health,
    "remove": lambda sim, a: sim.remove_device(_minor(_one(a, "remove MINOR"))),
    "add": lambda sim, a: sim.add_device(_minor(_one(a, "add MINOR"))),
    "restart": lambda sim, a: sim.restart(_seconds(a[0]) if a else 0.5, schema=a[1] if len(a) > 1 else None),
    "reflection": lambda sim, a: sim.set_reflection(_one(a, "reflection on|off", "on", "off") == "on"),
    "crash": lambda sim, a: sim.crash(),
    "revive": lambda sim, a: sim.revive(),
    "slow-start": lambda sim, a: sim.slow_start(_seconds(_one(a, "slow-start SECONDS"))),
    "latency": _latency,
    "drift": lambda sim, a: sim.set_drift(_one(a, "drift MODE|none")),
    "error-mode": _choice("error_mode", "error-mode inband|grpc"),
    "topology": _topology,
    "enable": lambda sim, a: sim.set_enabled(True),
    "disable": lambda sim, a: sim.set_enabled(False),
    "duplicate-id": _choice("duplicate_id_mode", "duplicate-id reject|idempotent"),
    "release-unknown": _choice("release_unknown", "release-unknown not-found|ok"),
    "exporter": lambda sim, a: sim.set_exporter_state(_one(a, "exporter running|stopped|error")),
    "close-streams": lambda sim, a: sim.close_streams(),
}


def run_command(sim: ControlTarget, argv: list[str]) -> Any:
    """Apply one command to ``sim`` ("ok" unless it has a result); ValueError for bad input."""
    if not argv:
        raise ValueError("empty command")
    handler = _HANDLERS.get(argv[0])
    if handler is None:
        raise ValueError(f"unknown command {argv[0]!r} (known: {', '.join(_HANDLERS)})")
    result = handler(sim, [str(a) for a in argv[1:]])
    return "ok" if result is None else result


class _Handler(socketserver.StreamRequestHandler):
    server: ControlServer

    def handle(self) -> None:
        for raw in self.rfile:
            try:
                argv = json.loads(raw)["argv"]
                if not isinstance(argv, list):
                    raise ValueError("argv must be a list")
                log.info("control: %s", " ".join(str(a) for a in argv))
                reply = {"ok": True, "result": run_command(self.server.sim, argv)}
            except Exception as exc:
                reply = {"ok": False, "error": str(exc)}
            self.wfile.write(json.dumps(reply, default=str).encode() + b"\n")
            self.wfile.flush()


class ControlServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """Serves ``path`` on a thread of its own from construction until :meth:`stop`."""

    daemon_threads = True
    block_on_close = False

    def __init__(self, sim: ControlTarget, path: Path) -> None:
        self.sim = sim
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
