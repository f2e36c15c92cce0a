"""``serve``: what Nomad runs. The go-plugin server side for a Nomad device plugin.

Sequence (nomad-protocol.md §1, §8): check the magic cookie, negotiate the
app protocol (we speak 2), start a gRPC server on a Unix socket inside a
fresh 0700 directory, print ``1|2|unix|<socket>|grpc`` once it listens, then
point fd 1 at stderr so nothing else can ever reach stdout. Shutdown (the
GRPCController RPC, SIGTERM, or the death of the process that launched the
plugin: ``parent.py``) releases every stream, stops the server, removes the
socket directory and exits within go-plugin's 2 s budget.
SIGINT is ignored: a Ctrl-C to the agent's process group is the agent's to
handle, and it then shuts us down.

Nomad launches the plugin three times at every agent start, so the
handshake comes first: this module imports grpc and nothing else heavy,
starts the server with one deferred handler, prints the handshake line, and
only then imports the services (protobuf, the go-plugin services, the
device and base services, the plugin app) and hands them to that handler.
A call that arrives in between waits for them (the first two launches only
ever ask PluginInfo, ConfigSchema and SetConfig; issue 14).

This is the transport only: it knows go-plugin, not Nomad's services. The
composition root (``nomad_plugin.cli.serve``) hands it a factory of a
:class:`ServedPlugin`, called after the handshake, that adds Nomad's
BasePlugin and DevicePlugin servicers.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from types import FrameType
from typing import TYPE_CHECKING, Any, Protocol

import grpc

from nomad_plugin.goplugin import handshake
from nomad_plugin.goplugin import logging as hclog
from nomad_plugin.goplugin.lifecycle import Lifecycle

if TYPE_CHECKING:
    from grpc_health.v1 import health

HEALTH_SERVICE = "plugin"  # go-plugin's GRPCServiceName
SERVICES_WAIT = 60.0  # seconds a call that arrived before the services were imported waits for them
WORKERS = 16  # Fingerprint, Stats, StreamStdio, StartStream stay open; unary calls need room too
STOP_GRACE = 0.5  # seconds the server gives in-flight calls (the Shutdown reply) on stop
CLOSE_BUDGET = 0.8  # seconds PluginApp.close() may take before we exit anyway

USAGE = """\
usage: nomad-device-lingjun serve

Serve the plugin over HashiCorp go-plugin. Nomad runs this itself (with
NOMAD_PLUGIN_MAGIC_COOKIE set); there is no reason to run it by hand.
"""

log = logging.getLogger(__name__)


class ServedPlugin(Protocol):
    """The plugin's own services, built by the composition root; the transport only hosts them."""

    def register(self, server: grpc.Server, lifecycle: Lifecycle) -> None:
        """Add the plugin's servicers to ``server``; streams register with ``lifecycle``."""

    def close(self) -> None:
        """Stop the plugin's engines (bounded by ``CLOSE_BUDGET``: Nomad kills us soon after)."""


def main(argv: list[str], make_plugin: Callable[[], ServedPlugin]) -> int:
    if argv:
        if argv[0] in ("-h", "--help"):
            sys.stderr.write(USAGE)
            return 0
        sys.stderr.write(f"serve takes no arguments (got {' '.join(argv)!r})\n\n{USAGE}")
        return 2
    problem = handshake.cookie_error(os.environ)
    if problem:
        sys.stderr.write(problem)
        return 1
    negotiation = handshake.negotiate(os.environ)
    for warning in negotiation.warnings:
        sys.stderr.write(f"[WARN] {warning}\n")
    if negotiation.version is None:
        sys.stderr.write(f"[ERROR] {negotiation.error}\n")
        return 1
    hclog.configure("info")
    code = PluginServer(negotiation.version, make_plugin).run()
    # Exit without waiting for worker threads: a stream stuck in engine code
    # must not keep the process alive past go-plugin's 2 s kill deadline.
    logging_flush()
    os._exit(code)


def logging_flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


class _Deferred(grpc.GenericRpcHandler):  # type: ignore[type-arg]
    """The server's only handler: answers from the services once they are imported, holding earlier calls."""

    def __init__(self) -> None:
        self._ready = threading.Event()
        self._handlers: list[grpc.GenericRpcHandler[Any, Any]] = []

    def fill(self, handlers: list[grpc.GenericRpcHandler[Any, Any]]) -> None:
        self._handlers = handlers
        self._ready.set()

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler[Any, Any] | None:
        if not self._ready.wait(SERVICES_WAIT):
            return None  # UNIMPLEMENTED: the services never came up (their import failed; see the log)
        for handler in self._handlers:
            found = handler.service(handler_call_details)
            if found is not None:
                return found
        return None


class _Collect:
    """Stands in for a grpc.Server for the generated ``add_*_to_server`` functions: keeps their handlers."""

    def __init__(self) -> None:
        self.handlers: list[grpc.GenericRpcHandler[Any, Any]] = []

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        self.handlers.extend(handlers)

    def add_registered_method_handlers(self, service: str, handlers: Any) -> None:
        """The same methods reach us through the generic handlers above."""


class PluginServer:
    def __init__(self, app_version: int, make_plugin: Callable[[], ServedPlugin]) -> None:
        self.app_version = app_version
        self.lifecycle = Lifecycle()
        self._make_plugin = make_plugin
        self.plugin: ServedPlugin | None = None
        self.health: health.HealthServicer | None = None
        self.socket_dir = ""
        self.server: grpc.Server | None = None
        self._deferred = _Deferred()
        self._sigints = 0

    def run(self) -> int:
        self._install_signals()
        try:
            self.socket_dir = handshake.make_socket_dir()
            socket_path = os.path.join(self.socket_dir, handshake.SOCKET_NAME)
            self.server = self._build_server()
            self.server.add_insecure_port(f"unix:{socket_path}")
            self.server.start()
        except Exception as exc:
            log.error("cannot start the gRPC server: %s", exc, exc_info=True)
            self._remove_socket_dir()
            return 1
        announce(handshake.handshake_line(socket_path, self.app_version))
        self._watch_parent()
        try:
            self._deferred.fill(self._services())
        except Exception as exc:
            log.error("cannot load the plugin's services: %s", exc, exc_info=True)
            self.lifecycle.request_stop("services failed to load")
        log.debug("serving", extra={"fields": {"socket": socket_path, "pid": os.getpid()}})
        # No timeout: every stop (SIGTERM, Shutdown, the services failing) sets ``stopping``, and
        # on POSIX a signal interrupts this wait to run its handler, so a periodic wake-up only
        # cost CPU for the plugin's whole life (issue 14).
        self.lifecycle.stopping.wait()
        self._stop()
        return 0

    def _watch_parent(self) -> None:
        """Stop when the agent that launched the plugin dies (a SIGKILLed agent sends no Shutdown)."""
        from nomad_plugin.goplugin.lifecycle import ParentWatch

        try:
            watch = ParentWatch(self.lifecycle.request_stop)
            watch.start()
        except OSError as exc:
            log.warning("cannot watch the process that launched the plugin: %s", exc)
            return
        log.debug("watching the launcher", extra={"fields": {"pid": watch.pid, "mode": watch.mode}})

    def _build_server(self) -> grpc.Server:
        server = grpc.server(ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="grpc"))
        server.add_generic_rpc_handlers((self._deferred,))
        return server

    def _services(self) -> list[grpc.GenericRpcHandler[Any, Any]]:
        """Import and build every service (after the handshake: see the module docstring)."""
        from grpc_health.v1 import health, health_pb2, health_pb2_grpc

        from nomad_plugin._proto.goplugin import grpc_broker_pb2_grpc, grpc_controller_pb2_grpc, grpc_stdio_pb2_grpc
        from nomad_plugin.goplugin.services import Broker, Controller, Stdio

        self.plugin = self._make_plugin()
        self.health = health.HealthServicer()
        self.health.set(HEALTH_SERVICE, health_pb2.HealthCheckResponse.SERVING)
        self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        server: Any = _Collect()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        grpc_controller_pb2_grpc.add_GRPCControllerServicer_to_server(Controller(self.lifecycle), server)
        grpc_stdio_pb2_grpc.add_GRPCStdioServicer_to_server(Stdio(self.lifecycle), server)
        grpc_broker_pb2_grpc.add_GRPCBrokerServicer_to_server(Broker(self.lifecycle), server)
        self.plugin.register(server, self.lifecycle)
        handlers: list[grpc.GenericRpcHandler[Any, Any]] = server.handlers
        return handlers

    def _install_signals(self) -> None:
        signal.signal(signal.SIGINT, self._on_sigint)
        signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigint(self, signum: int, frame: FrameType | None) -> None:
        self._sigints += 1
        log.log(hclog.TRACE, "ignoring SIGINT", extra={"fields": {"count": self._sigints}})

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        self.lifecycle.request_stop("SIGTERM")

    def _stop(self) -> None:
        started = time.monotonic()
        log.debug("stopping", extra={"fields": {"reason": self.lifecycle.stop_reason}})
        if self.health is not None:
            self.health.enter_graceful_shutdown()
        stopped = self.server.stop(STOP_GRACE) if self.server is not None else threading.Event()
        closer = threading.Thread(target=self._close_app, name="app-close", daemon=True)
        closer.start()
        closer.join(CLOSE_BUDGET)
        if closer.is_alive():
            log.warning("PluginApp.close() is still running after %.1fs; exiting anyway", CLOSE_BUDGET)
        stopped.wait(max(0.0, STOP_GRACE + 0.3 - (time.monotonic() - started)))
        self._remove_socket_dir()
        log.debug("stopped", extra={"fields": {"seconds": round(time.monotonic() - started, 3)}})

    def _close_app(self) -> None:
        if self.plugin is None:
            return
        try:
            self.plugin.close()
        except Exception as exc:
            log.error("PluginApp.close() failed: %s", exc, exc_info=True)

    def _remove_socket_dir(self) -> None:
        if self.socket_dir:
            import shutil  # at stop only: not among the imports before the handshake

            shutil.rmtree(self.socket_dir, ignore_errors=True)


def announce(line: str) -> None:
    """Write the handshake line, then make fd 1 a copy of fd 2 for good."""
    sys.stdout.write(line)
    sys.stdout.flush()
    os.dup2(2, 1)
    sys.stdout = sys.stderr
