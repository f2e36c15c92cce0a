"""Capture bundles (``xdm-probe --capture DIR``): what an operator attaches to a bug report.

A bundle holds XDM's own schema (server reflection descriptors, if served), the
raw wire bytes of every read-only RPC, versions, and the binding report. Raw
bytes need no schema to be captured, so a bundle can be made even when every
field number the plugin guesses is wrong; and a bundle replays offline
(``tests/captures/``) through whatever binds schemas.

Layout of DIR::

    manifest.json              format, versions, sockets, services, one entry per call
    reflection/<socket>.pb     FileDescriptorSet from server reflection (when served)
    raw/<Rpc>.bin              response bytes (streams: the first message)
    raw/<Rpc>.txt              the same, decoded like ``protoc --decode_raw``
    binding-report.json        from :func:`binding_report_hook` (the schema binder's report)

Only the RPCs in :data:`CAPTURED_RPCS` are called, each with an empty request
(the default "all" filters). Allocate, Release, Enable and Disable are never
called (:data:`WRITING_RPCS`; enforced by :func:`_check_read_only`).
"""

from __future__ import annotations

import hashlib
import json
import platform
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import Message

from nomad_plugin import __version__
from nomad_plugin.config.model import PluginConfig
from nomad_plugin.util.protowire import WireError, iter_fields
from nomad_plugin.xdm import adapter

if TYPE_CHECKING:
    from nomad_plugin.xdm.binder import Binding

FORMAT = "xdm-capture/1"
MANIFEST = "manifest.json"
BINDING_REPORT = "binding-report.json"
SOCKETS = ("dp2mgr", "config-daemon")
REFLECTION_PATHS = (
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
    "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
)
# (rpc, socket, role, server-streaming); role picks the service candidates.
CAPTURED_RPCS: tuple[tuple[str, str, str, bool], ...] = (
    ("ListSupportedXPUType", "dp2mgr", "device", False),
    ("ListGpuInfo", "dp2mgr", "exporter", False),
    ("ListAndWatch", "dp2mgr", "device", True),
    ("ExporterGetConfig", "dp2mgr", "exporter", False),
    ("ExporterGetStatus", "dp2mgr", "exporter", False),
    ("ExporterDataStream", "dp2mgr", "exporter", True),
    ("QueryStatus", "config-daemon", "config", False),
)
WRITING_RPCS = frozenset({"Allocate", "Release", "Enable", "Disable"})


@dataclass
class CallRecord:
    rpc: str
    socket: str
    path: str | None = None
    ok: bool = False
    file: str | None = None
    size: int = 0
    sha256: str = ""
    error: str = ""
    tried: int = 0


def _check_read_only(rpcs: Iterable[str]) -> None:
    bad = sorted(set(rpcs) & WRITING_RPCS)
    if bad:
        raise AssertionError(f"capture must never call a writing RPC: {bad}")


_check_read_only(r[0] for r in CAPTURED_RPCS)


# ---------------------------------------------------------------- reflection
def _reflection_call(channel: grpc.Channel, path: str, request: Any, timeout: float) -> Any:
    from grpc_reflection.v1alpha import reflection_pb2

    call = channel.stream_stream(
        path,
        request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
        response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
    )
    stream = call(iter([request]), timeout=timeout)
    try:
        return next(iter(stream))
    finally:
        stream.cancel()  # type: ignore[no-untyped-call]


def reflect(channel: grpc.Channel, timeout: float) -> tuple[descriptor_pb2.FileDescriptorSet | None, str]:
    """XDM's descriptors from server reflection: (set, "") or (None, why not). Never raises for bad answers."""
    from grpc_reflection.v1alpha import reflection_pb2

    req = reflection_pb2.ServerReflectionRequest
    why = "not served"
    for path in REFLECTION_PATHS:
        try:
            listed = _reflection_call(channel, path, req(list_services=""), timeout)
        except grpc.RpcError as exc:
            why = f"{exc.code().name}: {exc.details()}"
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                continue
            return None, why
        except Exception as exc:  # garbage answers must not crash a capture
            return None, f"bad reflection answer: {exc}"
        try:
            files: dict[str, descriptor_pb2.FileDescriptorProto] = {}
            pending = [s.name for s in listed.list_services_response.service if "ServerReflection" not in s.name]
            for symbol in pending:
                answer = _reflection_call(channel, path, req(file_containing_symbol=symbol), timeout)
                _add_files(answer, files)
            missing = _missing_deps(files)
            while missing:
                for name in missing:
                    _add_files(_reflection_call(channel, path, req(file_by_filename=name), timeout), files)
                still = _missing_deps(files)
                if still & missing:
                    return None, f"reflection does not serve {sorted(still & missing)}"
                missing = still
        except (grpc.RpcError, ValueError) as exc:
            return None, f"reflection failed: {exc}"
        return descriptor_pb2.FileDescriptorSet(file=_ordered(files)), ""
    return None, why


def _add_files(answer: Any, files: dict[str, descriptor_pb2.FileDescriptorProto]) -> None:
    if answer.HasField("error_response"):
        raise ValueError(f"reflection error {answer.error_response.error_code}: {answer.error_response.error_message}")
    for raw in answer.file_descriptor_response.file_descriptor_proto:
        fdp = descriptor_pb2.FileDescriptorProto.FromString(raw)
        files[fdp.name] = fdp


def _missing_deps(files: dict[str, descriptor_pb2.FileDescriptorProto]) -> set[str]:
    return {dep for f in files.values() for dep in f.dependency if dep not in files}


def _ordered(files: dict[str, descriptor_pb2.FileDescriptorProto]) -> list[descriptor_pb2.FileDescriptorProto]:
    """Dependencies first (what ``protoc --include_imports`` writes)."""
    out: list[descriptor_pb2.FileDescriptorProto] = []
    seen: set[str] = set()

    def visit(name: str) -> None:
        if name in seen or name not in files:
            return
        seen.add(name)
        for dep in files[name].dependency:
            visit(dep)
        out.append(files[name])

    for name in sorted(files):
        visit(name)
    return out


def pool_of(fds: descriptor_pb2.FileDescriptorSet) -> descriptor_pool.DescriptorPool:
    pool = descriptor_pool.DescriptorPool()
    for fdp in fds.file:
        pool.Add(fdp)
    return pool


def services_with(fds: descriptor_pb2.FileDescriptorSet, method: str) -> list[str]:
    """Fully-qualified names of the services in ``fds`` that have ``method`` (any package)."""
    return [
        f"{f.package}.{s.name}" if f.package else s.name
        for f in fds.file
        for s in f.service
        if any(m.name == method for m in s.method)
    ]


# ---------------------------------------------------------------- raw calls
def _candidates(
    role: str, rpc: str, config: PluginConfig, reflected: descriptor_pb2.FileDescriptorSet | None
) -> list[str]:
    names = services_with(reflected, rpc) if reflected is not None else []
    if role == "config":
        names += [adapter.qualified(p, adapter.CONFIG_SERVICE) for p in adapter.CONFIG_PACKAGE_CANDIDATES]
    else:
        device = [config.xdm_service] if config.xdm_service else []
        device += [adapter.qualified(p, adapter.DEVICE_SERVICE) for p in adapter.DEVICE_PACKAGE_CANDIDATES]
        names += device
        if role == "exporter":
            packages = [d.rsplit(".", 1)[0] if "." in d else "" for d in device]
            names += [adapter.qualified(p, s) for p in packages for s in adapter.EXPORTER_SERVICE_CANDIDATES]
    return list(dict.fromkeys(names))


def _raw(channel: grpc.Channel, path: str, streaming: bool, timeout: float) -> bytes:
    if not streaming:
        data: bytes = channel.unary_unary(path, request_serializer=None, response_deserializer=None)(
            b"", timeout=timeout
        )
        return data
    stream = channel.unary_stream(path, request_serializer=None, response_deserializer=None)(b"", timeout=timeout)
    try:
        for item in stream:
            first: bytes = item
            return first
    finally:
        stream.cancel()  # type: ignore[no-untyped-call]
    raise ValueError("the stream ended without a message")


def _capture_call(
    channel: grpc.Channel, rpc: str, streaming: bool, candidates: list[str], timeout: float, record: CallRecord
) -> bytes | None:
    for service in candidates:
        path = f"/{service}/{rpc}"
        record.tried += 1
        try:
            data = _raw(channel, path, streaming, timeout)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                record.error = f"UNIMPLEMENTED under every candidate service ({len(candidates)} tried)"
                continue
            record.path, record.error = path, f"{exc.code().name}: {exc.details()}"
            return None
        except ValueError as exc:
            record.path, record.error = path, str(exc)
            return None
        record.path, record.ok, record.error = path, True, ""
        return data
    return None


# ---------------------------------------------------------------- the bundle
def versions() -> dict[str, str]:
    out = {"plugin": __version__, "python": sys.version.split()[0], "platform": platform.platform()}
    for dist in ("grpcio", "protobuf", "grpcio-reflection"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def capture(config: PluginConfig, out: Path, render_raw: Callable[[bytes], list[str]] | None = None) -> dict[str, Any]:
    """Call every read-only RPC on both sockets and write a bundle to ``out``; returns the manifest."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "raw").mkdir(exist_ok=True)
    timeout = float(config.xdm_call_timeout)
    paths = {"dp2mgr": config.xdm_socket, "config-daemon": config.config_socket}
    manifest: dict[str, Any] = {
        "format": FORMAT,
        "created_unix": int(time.time()),
        "versions": versions(),
        "sockets": paths,
        "reflection": {},
        "services": {},
        "calls": [],
    }
    channels = {name: grpc.insecure_channel(f"unix:{path}") for name, path in paths.items()}
    try:
        reflected: dict[str, descriptor_pb2.FileDescriptorSet | None] = {}
        for name, channel in channels.items():
            fds, why = reflect(channel, timeout)
            reflected[name] = fds
            entry: dict[str, Any] = {"served": fds is not None}
            if fds is not None:
                rel = f"reflection/{name}.pb"
                (out / "reflection").mkdir(exist_ok=True)
                (out / rel).write_bytes(fds.SerializeToString())
                entry.update(file=rel, files=[f.name for f in fds.file])
            else:
                entry["why"] = why
            manifest["reflection"][name] = entry
        for rpc, sock, role, streaming in CAPTURED_RPCS:
            record = CallRecord(rpc=rpc, socket=sock)
            candidates = _candidates(role, rpc, config, reflected[sock])
            data = _capture_call(channels[sock], rpc, streaming, candidates, timeout, record)
            if data is not None:
                record.file, record.size = f"raw/{rpc}.bin", len(data)
                record.sha256 = hashlib.sha256(data).hexdigest()
                (out / record.file).write_bytes(data)
                lines = render_raw(data) if render_raw is not None else _decode_raw_brief(data)
                (out / f"raw/{rpc}.txt").write_text("\n".join(lines) + "\n")
                if record.path:
                    manifest["services"][rpc] = record.path.split("/")[1]
            manifest["calls"].append(asdict(record))
    finally:
        for channel in channels.values():
            channel.close()
    manifest["ok"] = all(c["ok"] for c in manifest["calls"])
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    bundle = load_bundle(out)
    report = binding_report_hook(bundle, config)
    (out / BINDING_REPORT).write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    return manifest


def _decode_raw_brief(data: bytes) -> list[str]:
    try:
        return [f"{n} (wire {w}): {v.hex() if isinstance(v, bytes) else v}" for n, w, v in iter_fields(data)]
    except WireError as exc:
        return [f"<not a protobuf message: {exc}>"]


def bind_bundle(bundle: CaptureBundle, config: PluginConfig | None = None) -> Binding:
    """The binding a plugin with ``config`` would use for the bundle's XDM.

    As the client chooses: the bundle's reflection descriptors unless
    ``xdm_schema`` says otherwise (``builtin`` or a path), else a path's
    schema, else the builtin reconstruction. Raises ``SchemaError`` for a path
    that cannot be read.
    """
    from nomad_plugin.xdm import binder

    aliases = config.xdm_field_aliases if config is not None else ()
    choice = config.xdm_schema if config is not None else "auto"
    reflected = bundle.reflected_schema()
    if reflected is not None and choice in ("auto", "reflection"):
        return binder.bind(reflected, "reflection", aliases)
    if binder.is_path(choice):
        return binder.bind(binder.load_path(choice), choice, aliases)
    return binder.builtin_binding(aliases)


def replay(bundle: CaptureBundle, binding: Binding) -> dict[str, Any]:
    """Decode the bundle's answers through ``binding``: the inventory (``expected-inventory.json``'s
    shape) and ``problems`` = the binding's mismatch list plus every failed plausibility guard."""
    from nomad_plugin.xdm import guards
    from nomad_plugin.xdm.adapter import DriftLog

    problems = list(binding.mismatch)

    def decode(rpc: str) -> Message | None:
        data = bundle.raw(rpc)
        if data is None or rpc not in binding.rpcs:
            return None
        return binding.rpc(rpc).response.cls.FromString(data)

    law, infos = decode("ListAndWatch"), decode("ListGpuInfo")
    cards = adapter.cards_from_list_and_watch(law, DriftLog(), binding) if law is not None else []
    facts = {f.minor: f for f in (adapter.gpu_facts(infos, binding) if infos is not None else [])}
    problems += guards.card_problems(cards) + guards.facts_problems(list(facts.values()))
    xpu = decode("ListSupportedXPUType")
    status = decode("QueryStatus")
    return {
        "cards": [
            {
                "minor": c.minor,
                "uuid": c.uuid,
                "model": c.model,
                "xpu_type": c.xpu_type,
                "memory_mib": c.memory_mib,
                "total_core": c.total_core,
                "pci_bus_id": c.pci_bus_id,
                "healthy": c.healthy,
                "vendor": facts[c.minor].vendor if c.minor in facts else c.vendor,
                "driver_version": facts[c.minor].driver_version if c.minor in facts else "",
            }
            for c in cards
        ],
        "xpu_types": sorted(adapter.xpu_types(xpu, binding)) if xpu is not None else [],
        "runtime_kit_enabled": adapter.runtime_kit_status(status, binding).enabled if status is not None else None,
        "problems": problems,
    }


def binding_report_hook(bundle: CaptureBundle, config: PluginConfig | None) -> dict[str, Any]:
    """The binding report stored in a bundle: the binding the plugin would use
    (:func:`bind_bundle`), its report lines, and the plausibility findings of
    the captured answers decoded through it. Never raises."""
    from nomad_plugin.xdm.binder import SchemaError

    try:
        binding = bind_bundle(bundle, config)
    except SchemaError as exc:
        return {"available": False, "why": str(exc)}
    report = binding.report()
    report["available"] = True
    report["lines"] = binding.report_lines()
    try:
        report["findings"] = replay(bundle, binding)["problems"]
    except Exception as exc:  # a bug report must still be written
        report["findings"] = [f"replay failed: {type(exc).__name__}: {exc}"]
    return report


# ---------------------------------------------------------------- reading bundles
class CaptureBundle:
    """A bundle on disk: manifest, raw bytes per RPC, reflected descriptors per socket."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.manifest: dict[str, Any] = json.loads((root / MANIFEST).read_text())
        if self.manifest.get("format") != FORMAT:
            raise ValueError(f"{root / MANIFEST}: format {self.manifest.get('format')!r} is not {FORMAT!r}")

    def call(self, rpc: str) -> dict[str, Any]:
        for entry in self.manifest["calls"]:
            if entry["rpc"] == rpc:
                return dict(entry)
        raise KeyError(f"{self.root}: no call {rpc!r} in the bundle")

    def raw(self, rpc: str) -> bytes | None:
        """The captured response bytes of ``rpc`` (None when the call failed)."""
        entry = self.call(rpc)
        return (self.root / entry["file"]).read_bytes() if entry.get("file") else None

    def descriptor_set(self, socket: str) -> descriptor_pb2.FileDescriptorSet | None:
        entry = self.manifest["reflection"].get(socket, {})
        if not entry.get("file"):
            return None
        return descriptor_pb2.FileDescriptorSet.FromString((self.root / entry["file"]).read_bytes())

    def reflected_schema(self) -> descriptor_pb2.FileDescriptorSet | None:
        """Both sockets' reflected descriptors as one set (files deduplicated by name)."""
        files: dict[str, descriptor_pb2.FileDescriptorProto] = {}
        for socket in SOCKETS:
            fds = self.descriptor_set(socket)
            for fdp in fds.file if fds is not None else ():
                files.setdefault(fdp.name, fdp)
        return descriptor_pb2.FileDescriptorSet(file=_ordered(files)) if files else None

    def decode(self, rpc: str) -> Message | None:
        """``rpc``'s response decoded with the bundle's own reflected schema (None without reflection)."""
        entry = self.call(rpc)
        fds = self.descriptor_set(entry["socket"])
        data = self.raw(rpc)
        if fds is None or data is None or not entry.get("path"):
            return None
        service = entry["path"].split("/")[1]
        pool = pool_of(fds)
        method = pool.FindServiceByName(service).methods_by_name[rpc]
        return message_factory.GetMessageClass(method.output_type).FromString(data)


def load_bundle(root: Path) -> CaptureBundle:
    return CaptureBundle(root)
