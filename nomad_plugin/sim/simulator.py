"""The simulator's public face: :class:`Simulator`, its lifecycle, its faults and its two gRPC servers.

Methods are looked up per call, so the served schema and reflection take effect at once; every call
first passes the fault gate. The served schema is applied at this edge only (:meth:`Simulator.service_of`,
:meth:`Simulator.serialize`), so the node's logic keeps the builtin classes.
"""

from __future__ import annotations

import functools
import logging
import math
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import asdict
from pathlib import Path
from typing import Any, TypeAlias

import grpc
from google.protobuf import message_factory, text_format
from google.protobuf.message import Message

from nomad_plugin._proto.lingjun import api_outer_pb2 as pb
from nomad_plugin._proto.lingjun import config_service_pb2 as cfg
from nomad_plugin.sim.allocation import Refusal, load_state
from nomad_plugin.sim.control import ControlServer
from nomad_plugin.sim.core import CLOSE, SimCore, SimOptions
from nomad_plugin.sim.profiles import NVML_PROFILE, build_cards, resolve_profile
from nomad_plugin.sim.schema import ServedSchema, builtin_schema

log = logging.getLogger(__name__)

MAX_WORKERS = 256  # every open stream holds one worker thread (created lazily)
REFLECTION_PATHS = (  # v1 has the same wire format as v1alpha
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
    "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
)
DP2MGR = pb.DESCRIPTOR.services_by_name["XpuDeviceManagerService"]
CONFIG = cfg.DESCRIPTOR.services_by_name["AmpConfigService"]
RPC_NAMES = tuple(m.name for service in (DP2MGR, CONFIG) for m in service.methods)
# The SimCore method answering each unary RPC (its message types come from the service descriptors).
UNARY: dict[str, str] = {
    "ListSupportedXPUType": "list_xpu_types", "Allocate": "allocate", "Release": "release",
    "ListGpuInfo": "gpu_info", "ExporterGetDataList": "data_list", "ExporterGetConfig": "exporter_config",
    "ExporterGetStatus": "exporter_status", "Enable": "enable", "Disable": "disable", "QueryStatus": "query_status",
}  # fmt: skip
_CANCELLED = object()
Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"


class _Dispatch(grpc.GenericRpcHandler):  # type: ignore[type-arg]
    def __init__(self, table: Callable[[], dict[str, Handler]]) -> None:
        self._table = table

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> Handler | None:
        method: str = handler_call_details.method
        return self._table().get(method)


class Simulator(SimCore):
    """A simulated XDM node serving ``dp2mgr.sock`` and ``config-daemon.sock`` in ``socket_dir``;
    ``options`` are :class:`~nomad_plugin.sim.core.SimOptions` fields. It serves ``schema``, the
    reconstruction unless a caller hands it another."""

    def __init__(
        self,
        socket_dir: Path | str,
        profile: str = "h800-8",
        state_file: Path | str | None = None,
        schema: ServedSchema | None = None,
        **options: Any,
    ) -> None:
        opts = SimOptions.from_kwargs(options)
        reader = None
        if profile == NVML_PROFILE or opts.nvml_mirror:
            from nomad_plugin.sim import nvml_mirror

            cards, handles = nvml_mirror.load_cards(opts.topology_variant)
            profile, reader = NVML_PROFILE, nvml_mirror.make_reader(handles)
        else:
            spec = resolve_profile(profile)
            profile, cards = spec.name, build_cards(spec, opts.topology_variant)
        super().__init__(profile, cards, opts, Path(state_file) if state_file is not None else None, reader)
        self.socket_dir = Path(socket_dir)
        self.schema: ServedSchema = schema or builtin_schema()
        self.dp2mgr_path = self.socket_dir / "dp2mgr.sock"
        self.config_path = self.socket_dir / "config-daemon.sock"
        self.control_path = self.socket_dir / "xdm-sim-control.sock"
        self.crashed = False
        self._lifecycle = threading.RLock()
        self._servers: list[grpc.Server] = []
        self._stopping = threading.Event()  # set while the servers stop: gated calls end UNAVAILABLE
        self._collector_stop = threading.Event()
        self._collector: threading.Thread | None = None
        self._control: ControlServer | None = None

    # ------------------------------------------------------------ lifecycle
    def start(self) -> Simulator:
        with self._lifecycle:
            self._serve()
            if self._collector is None:
                self._collector_stop.clear()
                self._collector = threading.Thread(target=self._collect_loop, name="xdm-sim-collector", daemon=True)
                self._collector.start()
            if self.options.control and self._control is None:
                self._control = ControlServer(self.command, self.control_path)
        log.info("xdm-sim %s: %d x %s on %s", self.profile, len(self.cards), self.cards[0].model, self.socket_dir)
        return self

    def stop(self) -> None:
        with self._lifecycle:
            if self._control is not None:
                self._control.stop()
                self._control = None
            self._collector_stop.set()
            if self._collector is not None:
                self._collector.join(5.0)
                self._collector = None
            self._unserve()

    def __enter__(self) -> Simulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _collect_loop(self) -> None:
        while not self._collector_stop.wait(self.options.collect_interval_ms / 1000.0):
            try:
                self.collect()
            except Exception:  # the collector must not die silently
                log.exception("metrics collection failed")

    def _serve(self) -> None:
        self._stopping.clear()
        for path, config in ((self.dp2mgr_path, False), (self.config_path, True)):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.unlink(missing_ok=True)  # a stale socket from a crash
            server = grpc.server(
                futures.ThreadPoolExecutor(max_workers=MAX_WORKERS, thread_name_prefix="xdm-sim"),
                handlers=[_Dispatch(functools.partial(self._table, config))],
                maximum_concurrent_rpcs=None,
            )
            server.add_insecure_port(f"unix:{path}")
            server.start()
            self._servers.append(server)

    def _unserve(self, grace: float = 0.1) -> None:
        """End the streams with UNAVAILABLE, stop serving, remove the socket files."""
        self.close_streams()
        self._stopping.set()
        servers, self._servers = self._servers, []
        for event in [s.stop(grace) for s in servers]:
            event.wait(5.0)
        self.dp2mgr_path.unlink(missing_ok=True)
        self.config_path.unlink(missing_ok=True)

    # ------------------------------------------------------------ faults
    def restart(
        self,
        downtime: float = 0.5,
        remove_dir: bool = False,
        schema: ServedSchema | None = None,
        reflection: bool | None = None,
    ) -> None:
        """Stop both servers (streams end UNAVAILABLE), unlink the sockets, wait, bind again; grants survive.

        ``remove_dir`` also removes the (otherwise empty) socket directory while down; ``schema`` and
        ``reflection``: come back as an upgraded XDM serving another schema, with or without reflection.
        """
        with self._lifecycle:
            log.info("restart: down for %.2fs", downtime)
            self._unserve()
            if schema is not None:
                self.schema = schema
            if reflection is not None:
                self.set_reflection(reflection)
            control_was_up = self._control is not None
            if remove_dir:
                if self._control is not None:
                    self._control.stop()
                    self._control = None
                leftovers = sorted(p.name for p in self.socket_dir.iterdir()) if self.socket_dir.exists() else []
                if leftovers:
                    raise RuntimeError(f"restart(remove_dir=True): {self.socket_dir} still holds {leftovers}")
                if self.socket_dir.exists():
                    self.socket_dir.rmdir()
            time.sleep(downtime)
            self.revive()
            if remove_dir and control_was_up:
                self._control = ControlServer(self.command, self.control_path)
            log.info("restart: serving again (schema %s, reflection %s)", self.schema.name, self.options.reflection)

    def crash(self) -> None:
        """Stop serving and leave socket files nobody listens on (connects get ECONNREFUSED)."""
        with self._lifecycle:
            self._unserve(grace=0.0)
            for path in (self.dp2mgr_path, self.config_path):
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as stale:
                    stale.bind(str(path))
            self.crashed = True
            log.info("crash: sockets left stale")

    def revive(self) -> None:
        """Come back after :meth:`crash`; grants are read back as after a restart."""
        with self._lifecycle:
            if self._servers:
                return
            if self.state_file is not None:  # grants read back, as a restarted XDM does
                with self.lock:
                    self.state = load_state(self.state_file, self.options.enabled)
                    self._samples_stale = True
            self._serve()
            self.crashed = False
            log.info("revive: serving again")

    def slow_start(self, seconds: float) -> None:
        """Every RPC hangs for ``seconds`` from now (the servers start if they are down)."""
        with self.lock:
            self.hang_until = time.monotonic() + seconds
        self.revive()

    def set_latency(self, rpc: str, seconds: float) -> None:
        """Delay every call of ``rpc`` ("*" = all) by ``seconds``; ``math.inf`` hangs; 0 clears."""
        if rpc != "*" and rpc not in RPC_NAMES:
            raise ValueError(f"rpc: unknown RPC {rpc!r} (known: *, {', '.join(RPC_NAMES)})")
        if seconds < 0 or math.isnan(seconds):
            raise ValueError(f"seconds: {seconds} must be >= 0")
        with self.lock:
            if seconds == 0:
                self.latency.pop(rpc, None)
            else:
                self.latency[rpc] = seconds

    def set_reflection(self, on: bool) -> None:
        """Serve gRPC server reflection of the served schema from the next call on."""
        self.options.reflection = on
        log.info("reflection: %s", "on" if on else "off")

    def command(self, argv: list[str]) -> Any:
        """Apply one control command (:data:`~nomad_plugin.sim.control.COMMANDS`); ValueError for bad input."""
        return run_command(self, argv)

    def status(self) -> dict[str, Any]:
        """A summary for the control channel and logs."""
        with self.lock:
            return {
                "profile": self.profile,
                "socket_dir": str(self.socket_dir),
                "serving": bool(self._servers),
                "crashed": self.crashed,
                "enabled": self.state.enabled,
                "schema": self.schema.name,
                "reflection": self.options.reflection,
                "services": [self.schema.device_service, self.schema.config_service],
                "error_mode": self.options.error_mode,
                "exporter": self.exporter_state,
                "latency": dict(self.latency),
                "cards": [
                    dict(
                        minor=c.minor, uuid=c.uuid, model=c.model, present=c.minor in self.present, healthy=h, reason=r
                    )
                    for c in self.cards
                    for h, r in [self.health[c.minor]]
                ],
                "grants": len(self.state.grants),
                "calls": self.calls(),
                "subscribers": self.subscriber_count(),
            }

    # ------------------------------------------------------------ gRPC
    def _table(self, config: bool) -> dict[str, Handler]:
        """Method path -> handler, as served right now."""
        schema = self.schema
        streams: dict[str, Callable[[Any, grpc.ServicerContext], Iterator[Message]]] = {
            "ListAndWatch": self._list_and_watch, "ExporterDataStream": self._data_stream,
        }  # fmt: skip
        table: dict[str, Handler] = {}
        for method in (CONFIG if config else DP2MGR).methods:
            name = method.name
            service = self.service_of(name, config)
            decoder = schema.decoder(message_factory.GetMessageClass(method.input_type))
            if method.server_streaming:
                handler = grpc.unary_stream_rpc_method_handler(streams[name], decoder, self.serialize)
            else:
                answer = self._unary(
                    name, message_factory.GetMessageClass(method.output_type), getattr(self, UNARY[name])
                )
                handler = grpc.unary_unary_rpc_method_handler(answer, decoder, self.serialize)
            table[f"/{service}/{name}"] = handler
        if self.options.reflection:
            from grpc_reflection.v1alpha import reflection, reflection_pb2

            services = sorted({path.split("/")[1] for path in table})
            servicer = reflection.ReflectionServicer([*services, reflection.SERVICE_NAME], pool=schema.pool)
            handler = grpc.stream_stream_rpc_method_handler(
                servicer.ServerReflectionInfo,
                reflection_pb2.ServerReflectionRequest.FromString,
                reflection_pb2.ServerReflectionResponse.SerializeToString,
            )
            table.update(dict.fromkeys(REFLECTION_PATHS, handler))
        return table

    def service_of(self, rpc: str, config: bool) -> str:
        """The full name of the service that serves ``rpc`` (on config-daemon's socket if ``config``)."""
        return self.schema.config_service if config else self.schema.device_service

    def serialize(self, msg: Message) -> bytes:
        """A response (a builtin message) on the wire, in the served schema."""
        return self.schema.to_served(msg).SerializeToString()

    def _gate(self, rpc: str, context: grpc.ServicerContext) -> None:
        """Count the call, then hold it during slow start and injected latency (inf: until the client gives up)."""
        with self.lock:
            self.call_counts[rpc] += 1
            delay = self.latency.get(rpc, self.latency.get("*", 0.0))
            until = math.inf if math.isinf(delay) else max(self.hang_until, time.monotonic() + delay)
        while time.monotonic() < until:
            if self._stopping.is_set():
                context.abort(grpc.StatusCode.UNAVAILABLE, "xdm-sim: service stopping")
            if not context.is_active():
                context.abort(grpc.StatusCode.CANCELLED, "client went away")
            self._stopping.wait(min(0.05, max(0.0, until - time.monotonic())))

    def _unary(
        self, rpc: str, resp_cls: Callable[..., Message], fn: Callable[[Any], Message]
    ) -> Callable[[Any, grpc.ServicerContext], Message]:
        def handler(request: Any, context: grpc.ServicerContext) -> Message:
            self._gate(rpc, context)
            try:
                response = fn(request)
            except Refusal as why:
                code = grpc.StatusCode[why.code]
                log.info("%s %s -> refused %s: %s", rpc, _summary(request), why.code, why.message)
                if self.options.error_mode == "grpc":
                    context.abort(code, why.message)
                return resp_cls(status=code.value[0], message=why.message)
            log.info("%s %s -> ok%s", rpc, _summary(request), _summary(response))
            return response

        return handler

    def _list_and_watch(self, request: pb.ListAndWatchRequest, context: grpc.ServicerContext) -> Iterator[Message]:
        self._gate("ListAndWatch", context)
        q: queue.Queue[Any] = queue.Queue()
        with self.lock:
            self.subscribers.add(q)
        context.add_callback(lambda: q.put(_CANCELLED))
        log.info("ListAndWatch subscribed (%d subscribers)", self.subscriber_count())
        try:
            if self.options.initial_push:
                yield self.device_list()
            while context.is_active():
                repush = self.options.repush_interval  # the list again after this long without a push
                try:
                    item = q.get(timeout=repush or 0.5)
                except queue.Empty:
                    if repush:
                        yield self.device_list()
                    continue
                if item is _CANCELLED:
                    return
                if item is CLOSE:
                    context.abort(grpc.StatusCode.UNAVAILABLE, "xdm-sim: stream closed (service restart or stop)")
                yield item
        finally:
            with self.lock:
                self.subscribers.discard(q)
            log.info("ListAndWatch stream ended")

    def _data_stream(self, request: pb.ExporterDataRequest, context: grpc.ServicerContext) -> Iterator[Message]:
        self._gate("ExporterDataStream", context)
        epoch = self.stream_epoch
        gen, samples = self.snapshot()
        try:
            first = self.filter_metrics(request, samples)
        except Refusal as why:
            context.abort(grpc.StatusCode[why.code], why.message)
        log.info(
            "ExporterDataStream subscribed (devices=%s metricIds=%s)", list(request.devices), list(request.metricIds)
        )
        yield first
        while True:
            with self.metrics_cond:
                while self.stream_epoch == epoch and self.samples_gen == gen and context.is_active():
                    self.metrics_cond.wait(0.25)
                closed = self.stream_epoch != epoch
                gen, samples = self.samples_gen, self.samples
            if closed:
                context.abort(grpc.StatusCode.UNAVAILABLE, "xdm-sim: stream closed (service restart or stop)")
            if not context.is_active():
                return
            yield self.filter_metrics(request, samples)


def _summary(msg: Message) -> str:
    """What the log says of a request, or of a successful answer."""
    if isinstance(msg, pb.AllocateResponse):
        return f" minors={[d.minor for d in msg.devices]}"
    if isinstance(msg, pb.ExporterDataResponse):
        return f" samples={len(msg.dataList)}"
    return "" if msg.DESCRIPTOR.name.endswith("Response") else text_format.MessageToString(msg, as_one_line=True)


# ---------------------------------------------------------------- control commands (control.COMMANDS)


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


def _choice(name: str, usage: str) -> Callable[[Simulator, list[str]], None]:
    """A command setting option ``name`` to its one argument."""
    return lambda sim, a: sim.set_choice(name, _one(a, usage))


def _health(sim: Simulator, args: list[str]) -> None:
    if len(args) < 2 or args[1].lower() not in ("healthy", "unhealthy"):
        raise ValueError("usage: health MINOR healthy|unhealthy [REASON]")
    sim.set_health(_minor(args[0]), args[1].lower() == "healthy", " ".join(args[2:]))


def _topology(sim: Simulator, args: list[str]) -> None:
    if len(args) < 2:
        raise ValueError("usage: topology LEVEL VALUE|none [MINOR...]")
    sim.set_topology_level(args[0], None if args[1] == "none" else args[1], [_minor(m) for m in args[2:]] or None)


def _latency(sim: Simulator, args: list[str]) -> None:
    if len(args) != 2:
        raise ValueError("usage: latency RPC SECONDS")
    sim.set_latency(args[0], _seconds(args[1]))


_HANDLERS: dict[str, Callable[[Simulator, list[str]], Any]] = {
    "status": lambda sim, a: sim.status(),
    "grants": lambda sim, a: {gid: asdict(g) for gid, g in sim.grants().items()},
    "health": _health,
    "remove": lambda sim, a: sim.remove_device(_minor(_one(a, "remove MINOR"))),
    "add": lambda sim, a: sim.add_device(_minor(_one(a, "add MINOR"))),
    "restart": lambda sim, a: sim.restart(_seconds(_one(a, "restart [DOWNTIME]")) if a else 0.5),
    "reflection": lambda sim, a: sim.set_reflection(_one(a, "reflection on|off", "on", "off") == "on"),
    "crash": lambda sim, a: sim.crash(),
    "revive": lambda sim, a: sim.revive(),
    "slow-start": lambda sim, a: sim.slow_start(_seconds(_one(a, "slow-start SECONDS"))),
    "latency": _latency,
    "error-mode": _choice("error_mode", "error-mode inband|grpc"),
    "topology": _topology,
    "enable": lambda sim, a: sim.set_enabled(True),
    "disable": lambda sim, a: sim.set_enabled(False),
    "duplicate-id": _choice("duplicate_id_mode", "duplicate-id reject|idempotent"),
    "release-unknown": _choice("release_unknown", "release-unknown not-found|ok"),
    "exporter": lambda sim, a: sim.set_exporter_state(_one(a, "exporter running|stopped|error")),
    "close-streams": lambda sim, a: sim.close_streams(),
}


def run_command(sim: Simulator, argv: list[str]) -> Any:
    """Apply one command to ``sim`` ("ok" unless it has a result); ValueError for bad input."""
    if not argv:
        raise ValueError("empty command")
    handler = _HANDLERS.get(argv[0])
    if handler is None:
        raise ValueError(f"unknown command {argv[0]!r} (known: {', '.join(_HANDLERS)})")
    result = handler(sim, [str(a) for a in argv[1:]])
    return "ok" if result is None else result
