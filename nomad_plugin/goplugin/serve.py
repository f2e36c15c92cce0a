"""``serve``, what Nomad runs: the go-plugin server hosting the servicers the composition root hands it.

Check the cookie, negotiate the protocol, serve gRPC on a Unix socket in a fresh 0700 directory,
print the handshake line once it listens, then point fd 1 at stderr for good (go-plugin
``server.go`` ``Serve``). Nomad launches the plugin three times at every agent start, so the line
comes first: until it is out only grpc is imported and one deferred handler holds any call.

A stop (Shutdown, SIGTERM, the launcher's death) sets every stream's event, stops the server,
removes the socket directory and exits within go-plugin's 2 s (``client.go`` ``Kill``). SIGINT is
the agent's to handle. go-plugin gives no sign when its host dies by SIGKILL, and a plugin left
running would keep ``plugin.lock`` and its grants, so it watches its launcher: a pidfd, or where
pidfds are missing a poll of the parent pid and the launcher's start time. Not
``PR_SET_PDEATHSIG``: the kernel sends it when the *thread* that forked the plugin exits, and Go
programs end threads while they live on (golang/go#27505).
"""

from __future__ import annotations

import logging
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from types import FrameType
from typing import TYPE_CHECKING, Any, Protocol

import grpc

from nomad_plugin.goplugin import handshake
from nomad_plugin.goplugin import logging as hclog

if TYPE_CHECKING:
    from grpc_health.v1 import health

log = logging.getLogger(__name__)

POLL_S = 1.0
HARD_EXIT_S = 5.0


class Lifecycle:
    def __init__(self, wake: Callable[[], None] = lambda: None) -> None:
        self.stopping = threading.Event()
        self.stop_reason = ""
        self._streams: set[threading.Event] = set()
        self._lock = threading.Lock()
        self._wake = wake  # tells the main thread, which waits for signals, that a stop was requested

    def open_stream(self, context: grpc.ServicerContext) -> threading.Event:
        """An event set when this call ends or the process stops: a ``CancelEvent``, so that an engine
        waiting on something else registers a callback on it instead of polling it."""
        from nomad_plugin.util.threads import CancelEvent  # after the handshake: random is not on the launch path

        cancel = CancelEvent()
        if not context.add_callback(cancel.set):
            cancel.set()  # the call already ended
        with self._lock:
            if self.stopping.is_set():
                cancel.set()
            self._streams.add(cancel)
        return cancel

    def close_stream(self, cancel: threading.Event) -> None:
        with self._lock:
            self._streams.discard(cancel)

    def request_stop(self, reason: str) -> None:
        """Idempotent: the first reason wins; every open stream is released."""
        with self._lock:
            if not self.stopping.is_set():
                self.stop_reason = reason
                self.stopping.set()
            streams = list(self._streams)
        for cancel in streams:
            cancel.set()
        self._wake()


def _stat_fields(pid: int) -> list[str] | None:
    """``/proc/<pid>/stat`` after the command name: [state, ppid, ...] (None when gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read().decode("ascii", "replace")
    except OSError:
        return None
    return data[data.rfind(")") + 2 :].split()


def _identity(pid: int) -> str | None:
    """The process's start time (clock ticks since boot), telling it apart from a later one with its pid."""
    fields = _stat_fields(pid)
    if fields is None or len(fields) < 20 or fields[0] in ("Z", "X"):
        return None
    return fields[19]


def launcher_pid(parent: int | None = None) -> int:
    """The parent, or the parent of a PyInstaller one-file bootloader (a frozen parent running this
    same executable). The shipped file ``exec``s its bundle (tools/build_dist.py): its parent is the agent."""
    parent = os.getppid() if parent is None else parent
    if not getattr(sys, "frozen", False):
        return parent
    try:
        if os.path.samefile(f"/proc/{parent}/exe", "/proc/self/exe"):
            fields = _stat_fields(parent)
            if fields is not None and len(fields) > 1 and fields[1].isdigit():
                return int(fields[1])
    except OSError:
        pass
    return parent


class ParentWatch:
    """Calls ``on_gone(reason)`` once, from its own thread, when the launcher has died; then exits the
    process if it still runs ``hard_exit`` seconds later."""

    def __init__(
        self,
        on_gone: Callable[[str], None],
        *,
        pid: int | None = None,
        poll: float = POLL_S,
        hard_exit: float = HARD_EXIT_S,
        exit_process: Callable[[int], None] = os._exit,
    ) -> None:
        self._on_gone = on_gone
        self._parent = os.getppid()
        self.pid = launcher_pid(self._parent) if pid is None else pid
        self._identity = _identity(self.pid)
        self._poll = poll
        self._hard_exit = hard_exit
        self._exit = exit_process
        self.mode = ""  # "pidfd" or "poll", once started

    def start(self) -> None:
        try:
            pidfd = os.pidfd_open(self.pid)
            self.mode = "pidfd"
        except (AttributeError, OSError):
            pidfd = -1
            self.mode = "poll"
        threading.Thread(target=self._run, args=(pidfd,), name="parent-watch", daemon=True).start()

    def gone(self) -> bool:
        """The launcher has exited (checked now, without waiting)."""
        if self.pid == self._parent and os.getppid() != self._parent:
            return True  # re-parented: the parent died
        return self._identity is None or _identity(self.pid) != self._identity

    def _run(self, pidfd: int) -> None:
        if pidfd >= 0:
            select.select([pidfd], [], [])
            os.close(pidfd)
        else:
            while not self.gone():
                time.sleep(self._poll)
        reason = f"the process that launched the plugin (pid {self.pid}, the Nomad agent) exited"
        log.warning("%s; stopping", reason)
        self._on_gone(reason)
        time.sleep(self._hard_exit)  # the stop ends the process well before this, unless something holds it up
        log.error("still running %.0fs after the launcher exited; exiting now", self._hard_exit)
        self._exit(1)


HEALTH_SERVICE = "plugin"  # go-plugin's GRPCServiceName
SERVICES_WAIT = 60.0  # seconds a call that arrived before the services were imported waits for them
WORKERS = 16  # Fingerprint, Stats, StreamStdio, StartStream stay open; unary calls need room too
STOP_GRACE = 0.5  # seconds the server gives in-flight calls (the Shutdown reply) on stop
CLOSE_BUDGET = 0.8  # seconds ServedPlugin.close() may take before the process exits anyway

USAGE = """\
usage: nomad-device-lingjun serve

Serve the plugin over HashiCorp go-plugin. Nomad runs this itself (with
NOMAD_PLUGIN_MAGIC_COOKIE set); there is no reason to run it by hand.
"""


class ServedPlugin(Protocol):
    """The plugin's own services, built by the composition root."""

    def register(self, server: grpc.Server, lifecycle: Lifecycle) -> None:
        """Add the plugin's servicers to ``server``; streams register with ``lifecycle``."""

    def close(self) -> None:
        """Stop the plugin's engines (bounded by ``CLOSE_BUDGET``: Nomad kills the plugin soon after)."""


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
    try:
        sys.stderr.flush()  # stdout is stderr by now
    except (OSError, ValueError):
        pass
    os._exit(code)  # not waiting for worker threads: one stuck in engine code must not outlive the kill deadline


class _Deferred(grpc.GenericRpcHandler):  # type: ignore[type-arg]
    """The server's one handler: it collects the services' handlers, standing in for a grpc.Server for
    the generated ``add_*_to_server`` functions, and answers from them once ``ready``; earlier calls wait."""

    def __init__(self) -> None:
        self._ready = threading.Event()
        self._handlers: list[grpc.GenericRpcHandler[Any, Any]] = []

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        self._handlers.extend(handlers)

    def add_registered_method_handlers(self, service: str, handlers: Any) -> None:
        """The same methods come through ``add_generic_rpc_handlers``."""

    def ready(self) -> None:
        self._ready.set()

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler[Any, Any] | None:
        if not self._ready.wait(SERVICES_WAIT):
            return None  # UNIMPLEMENTED: the services never came up (their import failed; see the log)
        for handler in self._handlers:
            found = handler.service(handler_call_details)
            if found is not None:
                return found
        return None


class _GoPluginServices:
    """go-plugin's own services (the generated ``add_*_to_server`` functions find them by method name).

    Nomad calls GRPCController.Shutdown when it kills the plugin, opens GRPCStdio.StreamStdio once
    and GRPCBroker.StartStream in the background; it never syncs stdio or dials the broker, so both
    streams stay open, sending nothing, until their call ends or the plugin stops.
    """

    def __init__(self, lifecycle: Lifecycle) -> None:
        self._lifecycle = lifecycle

    def Shutdown(self, request: Any, context: grpc.ServicerContext) -> Any:
        log.debug("shutdown requested by the host")
        self._lifecycle.request_stop("GRPCController.Shutdown")
        return request  # Empty in, Empty out; the main thread stops the server with a grace that lets it go

    def StreamStdio(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        cancel = self._lifecycle.open_stream(context)
        try:
            cancel.wait()
        finally:
            self._lifecycle.close_stream(cancel)
        yield from ()

    StartStream = StreamStdio  # the broker's stream: its requests are never read


class PluginServer:
    """Signals reach the main thread as bytes on a pipe (``signal.set_wakeup_fd``), and its handlers do
    nothing: a Python handler runs on the main thread between any two bytecodes, so one that set an
    Event or took a lock could find that very lock held by the code it interrupted and wait forever."""

    def __init__(self, app_version: int, make_plugin: Callable[[], ServedPlugin]) -> None:
        self.app_version = app_version
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self.lifecycle = Lifecycle(wake=self._poke)
        self._make_plugin = make_plugin
        self.plugin: ServedPlugin | None = None
        self.health: health.HealthServicer | None = None
        self.socket_dir = ""
        self.server: grpc.Server | None = None
        self._deferred = _Deferred()
        self._sigints = 0

    def run(self) -> int:
        self._take_signals()
        try:
            self.socket_dir = handshake.make_socket_dir()
            socket_path = os.path.join(self.socket_dir, handshake.SOCKET_NAME)
            self.server = grpc.server(ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="grpc"))
            self.server.add_generic_rpc_handlers((self._deferred,))
            self.server.add_insecure_port(f"unix:{socket_path}")
            self.server.start()
        except Exception as exc:
            log.error("cannot start the gRPC server: %s", exc, exc_info=True)
            self._remove_socket_dir()
            return 1
        announce(handshake.handshake_line(socket_path, self.app_version))
        watch = ParentWatch(self.lifecycle.request_stop)
        watch.start()
        log.debug("watching the launcher", extra={"fields": {"pid": watch.pid, "mode": watch.mode}})
        try:
            self._add_services()
            self._deferred.ready()
        except Exception as exc:
            log.error("cannot load the plugin's services: %s", exc, exc_info=True)
            self.lifecycle.request_stop("services failed to load")
        log.debug("serving", extra={"fields": {"socket": socket_path, "pid": os.getpid()}})
        self._wait_for_stop()
        self._stop()
        return 0

    def _take_signals(self) -> None:
        signal.set_wakeup_fd(self._wake_w)
        for number in (signal.SIGINT, signal.SIGTERM):
            signal.signal(number, _noted)

    def _wait_for_stop(self) -> None:
        """Block until a stop: SIGTERM read from the pipe here, or a request from another thread (which
        writes to the pipe after setting ``stopping``, so no request is missed). SIGINT is the agent's."""
        while not self.lifecycle.stopping.is_set():
            for number in os.read(self._wake_r, 64):
                if number == signal.SIGTERM:
                    self.lifecycle.request_stop("SIGTERM")
                elif number == signal.SIGINT:
                    self._sigints += 1
                    log.log(hclog.TRACE, "ignoring SIGINT", extra={"fields": {"count": self._sigints}})

    def _poke(self) -> None:
        try:
            os.write(self._wake_w, b"\0")
        except BlockingIOError:
            pass  # the pipe is full: the main thread has wake-ups enough to read

    def _add_services(self) -> None:
        from grpc_health.v1 import health, health_pb2, health_pb2_grpc

        from nomad_plugin._proto.goplugin import grpc_broker_pb2_grpc, grpc_controller_pb2_grpc, grpc_stdio_pb2_grpc

        self.plugin = self._make_plugin()
        self.health = health.HealthServicer()
        self.health.set(HEALTH_SERVICE, health_pb2.HealthCheckResponse.SERVING)
        self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        server: Any = self._deferred
        goplugin: Any = _GoPluginServices(self.lifecycle)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        grpc_controller_pb2_grpc.add_GRPCControllerServicer_to_server(goplugin, server)
        grpc_stdio_pb2_grpc.add_GRPCStdioServicer_to_server(goplugin, server)
        grpc_broker_pb2_grpc.add_GRPCBrokerServicer_to_server(goplugin, server)
        self.plugin.register(server, self.lifecycle)

    def _stop(self) -> None:
        started = time.monotonic()
        log.debug("stopping", extra={"fields": {"reason": self.lifecycle.stop_reason}})
        if self.health is not None:
            self.health.enter_graceful_shutdown()
        stopped = self.server.stop(STOP_GRACE) if self.server is not None else threading.Event()
        closer = threading.Thread(target=self._close_plugin, name="plugin-close", daemon=True)
        closer.start()
        closer.join(CLOSE_BUDGET)
        if closer.is_alive():
            log.warning("the plugin's close() is still running after %.1fs; exiting anyway", CLOSE_BUDGET)
        stopped.wait(max(0.0, STOP_GRACE + 0.3 - (time.monotonic() - started)))
        self._remove_socket_dir()
        log.debug("stopped", extra={"fields": {"seconds": round(time.monotonic() - started, 3)}})

    def _close_plugin(self) -> None:
        if self.plugin is None:
            return
        try:
            self.plugin.close()
        except Exception as exc:
            log.error("the plugin's close() failed: %s", exc, exc_info=True)

    def _remove_socket_dir(self) -> None:
        if self.socket_dir:
            import shutil  # at stop only: not on the launch path

            shutil.rmtree(self.socket_dir, ignore_errors=True)


def _noted(signum: int, frame: FrameType | None) -> None:
    """SIGINT and SIGTERM: the wakeup pipe already carries the signal's number to the main thread."""


def announce(line: str) -> None:
    """Write the handshake line, then make fd 1 a copy of fd 2 for good."""
    sys.stdout.write(line)
    sys.stdout.flush()
    os.dup2(2, 1)
    sys.stdout = sys.stderr
