"""Capture bundles (``xdm-probe --capture DIR``): what an operator attaches to a bug report.

Raw answers need no schema, so a bundle can be made even when every guessed field number is wrong,
and replays offline (``tests/captures/``). DIR holds::

    manifest.json              format, versions, sockets, services, one entry per call
    reflection/<socket>.pb     FileDescriptorSet from server reflection (when served)
    raw/<Rpc>.bin              response bytes (streams: the first message)
    raw/<Rpc>.txt              the same, as ``protoc --decode_raw`` shows it
    binding-report.json        the binding the plugin would use, and its findings

Only :data:`CAPTURED_RPCS` are called, each with an empty request (the "all" filters);
Allocate, Release, Enable and Disable never are.
"""

from __future__ import annotations

import hashlib
import json
import platform
import sys
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import descriptor_pb2
from google.protobuf.message import Message

from nomad_plugin import __version__
from nomad_plugin.config.model import PluginConfig
from nomad_plugin.model.errors import SchemaMismatch
from nomad_plugin.xdm import adapter, binder, guesses
from nomad_plugin.xdm.binder import Binding, FileSet

FORMAT = "xdm-capture/1"
MANIFEST = "manifest.json"
BINDING_REPORT = "binding-report.json"
#: In this order; role and shape come from ``binder.RPCS`` (the role picks the service candidates).
CAPTURED_RPCS = tuple(
    "ListSupportedXPUType ListGpuInfo ListAndWatch ExporterGetConfig ExporterGetStatus ExporterDataStream "
    "QueryStatus".split()
)
WRITING_RPCS = frozenset({"Allocate", "Release", "Enable", "Disable"})  # never captured (tests/captures)


def _candidates(role: str, rpc: str, config: PluginConfig, reflected: FileSet | None) -> list[str]:
    found = binder.services_with(reflected, rpc) if reflected is not None else []
    if role == "config":
        return guesses.config_services(found)
    devices = guesses.device_services(config.xdm_service.strip(), found)
    return guesses.exporter_services(devices) if role == "exporter" else devices


def _raw(channel: grpc.Channel, path: str, streaming: bool, timeout: float) -> bytes:
    if not streaming:
        data: bytes = channel.unary_unary(path, None, None)(b"", timeout=timeout)
        return data
    stream = channel.unary_stream(path, None, None)(b"", timeout=timeout)
    try:
        for first in stream:
            return bytes(first)
    finally:
        stream.cancel()  # type: ignore[no-untyped-call]
    raise ValueError("the stream ended without a message")


def _capture_call(
    channel: grpc.Channel, rpc: str, streaming: bool, candidates: list[str], timeout: float
) -> dict[str, Any]:
    """The manifest entry of one RPC, tried under each candidate service; its bytes under "data"."""
    record: dict[str, Any] = {"path": None, "ok": False, "file": None, "size": 0, "sha256": "", "error": "", "tried": 0}
    for service in candidates:
        record["tried"] += 1
        record["path"] = f"/{service}/{rpc}"
        try:
            return record | {"ok": True, "error": "", "data": _raw(channel, record["path"], streaming, timeout)}
        except grpc.RpcError as exc:
            record["error"] = f"{exc.code().name}: {exc.details()}"
            if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
                return record
        except ValueError as exc:
            return record | {"error": str(exc)}
    return record | {"path": None, "error": f"UNIMPLEMENTED under every candidate service ({len(candidates)} tried)"}


def capture(config: PluginConfig, out: Path, render_raw: Callable[[bytes], list[str]]) -> dict[str, Any]:
    """Call every read-only RPC on both sockets and write a bundle to ``out``; returns the manifest.
    ``render_raw`` writes the bytes as ``protoc --decode_raw`` would (``raw/<Rpc>.txt``)."""
    (out / "raw").mkdir(parents=True, exist_ok=True)
    timeout = float(config.xdm_call_timeout)
    paths = {"dp2mgr": config.xdm_socket, "config-daemon": config.config_socket}
    versions = {"plugin": __version__, "python": sys.version.split()[0], "platform": platform.platform()}
    for dist in ("grpcio", "protobuf", "grpcio-reflection"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = "not installed"
    manifest: dict[str, Any] = {"format": FORMAT, "created_unix": int(time.time()), "versions": versions}
    manifest.update(sockets=paths, reflection={}, services={}, calls=[])
    channels = {name: grpc.insecure_channel(f"unix:{path}") for name, path in paths.items()}
    try:
        reflected: dict[str, FileSet | None] = {}
        for name, channel in channels.items():
            try:  # a bad answer is recorded, never raised
                fds, why = binder.reflect(channel, timeout), "UNIMPLEMENTED: no reflection service"
            except grpc.RpcError as exc:
                fds, why = None, f"{exc.code().name}: {exc.details()}"
            except binder.SchemaError as exc:
                fds, why = None, f"bad reflection answer: {exc}"
            reflected[name] = fds
            entry: dict[str, Any] = {"served": fds is not None}
            if fds is not None:
                (out / "reflection").mkdir(exist_ok=True)
                (out / f"reflection/{name}.pb").write_bytes(fds.SerializeToString())
                entry.update(file=f"reflection/{name}.pb", files=[f.name for f in fds.file])
            manifest["reflection"][name] = entry if fds is not None else entry | {"why": why}
        shapes = {method: (role, streaming) for method, role, streaming in binder.RPCS}
        for rpc in CAPTURED_RPCS:
            role, streaming = shapes[rpc]
            sock = "config-daemon" if role == "config" else "dp2mgr"
            candidates = _candidates(role, rpc, config, reflected[sock])
            record = {"rpc": rpc, "socket": sock} | _capture_call(channels[sock], rpc, streaming, candidates, timeout)
            data = record.pop("data", None)
            if data is not None:
                record.update(file=f"raw/{rpc}.bin", size=len(data), sha256=hashlib.sha256(data).hexdigest())
                (out / record["file"]).write_bytes(data)
                (out / f"raw/{rpc}.txt").write_text("\n".join(render_raw(data)) + "\n")
                manifest["services"][rpc] = record["path"].split("/")[1]
            manifest["calls"].append(record)
    finally:
        for channel in channels.values():
            channel.close()
    manifest["ok"] = all(c["ok"] for c in manifest["calls"])
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    report = binding_report(CaptureBundle(out), config)
    (out / BINDING_REPORT).write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    return manifest


def bind_bundle(bundle: CaptureBundle, config: PluginConfig) -> Binding:
    """The binding a plugin with ``config`` would use for the bundle's XDM (``SchemaMismatch``
    when its schema cannot be read)."""
    schema = config.xdm_schema.strip() or "auto"
    return binder.choose(schema, config.xdm_field_aliases, bundle.reflected_schema, "the bundle holds no reflection")


def replay(bundle: CaptureBundle, binding: Binding) -> dict[str, Any]:
    """The bundle's answers decoded through ``binding``: the inventory (``expected-inventory.json``'s
    shape) and ``problems``, the binding's mismatch list plus every failed plausibility guard."""

    def decode(rpc: str) -> Message | None:
        data = bundle.raw(rpc)
        return binding.rpc(rpc).response.cls.FromString(data) if data is not None and rpc in binding.rpcs else None

    law, infos = decode("ListAndWatch"), decode("ListGpuInfo")
    cards = adapter.cards_from_list_and_watch(law, adapter.DriftLog(), binding) if law is not None else []
    facts = {f.minor: f for f in (adapter.gpu_facts(infos, binding) if infos is not None else [])}
    xpu, status = decode("ListSupportedXPUType"), decode("QueryStatus")
    shown = ("minor", "uuid", "model", "xpu_type", "memory_mib", "total_core", "pci_bus_id", "healthy")
    return {
        "cards": [
            {k: getattr(c, k) for k in shown}
            | {
                "vendor": facts[c.minor].vendor if c.minor in facts else c.vendor,
                "driver_version": facts[c.minor].driver_version if c.minor in facts else "",
            }
            for c in cards
        ],
        "xpu_types": sorted(adapter.xpu_types(xpu, binding)) if xpu is not None else [],
        "runtime_kit_enabled": adapter.runtime_kit_status(status, binding).enabled if status is not None else None,
        "problems": [*binding.mismatch, *adapter.card_problems(cards), *adapter.facts_problems(list(facts.values()))],
    }


def binding_report(bundle: CaptureBundle, config: PluginConfig) -> dict[str, Any]:
    """The binding report stored in a bundle, with the findings of its answers; never raises."""
    try:
        binding = bind_bundle(bundle, config)
    except SchemaMismatch as exc:
        return {"available": False, "why": str(exc)}
    report = binding.report()
    report.update(available=True, lines=binding.report_lines())
    try:
        report["findings"] = replay(bundle, binding)["problems"]
    except Exception as exc:  # a bug report must still be written
        report["findings"] = [f"replay failed: {type(exc).__name__}: {exc}"]
    return report


class CaptureBundle:
    """A bundle on disk: manifest, raw bytes per RPC, reflected descriptors per socket."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.manifest: dict[str, Any] = json.loads((root / MANIFEST).read_text())
        if self.manifest.get("format") != FORMAT:
            raise ValueError(f"{root / MANIFEST}: format {self.manifest.get('format')!r} is not {FORMAT!r}")

    def call(self, rpc: str) -> dict[str, Any]:
        found = [dict(entry) for entry in self.manifest["calls"] if entry["rpc"] == rpc]
        if not found:
            raise KeyError(f"{self.root}: no call {rpc!r} in the bundle")
        return found[0]

    def raw(self, rpc: str) -> bytes | None:
        """The captured response bytes of ``rpc`` (None when the call failed)."""
        entry = self.call(rpc)
        return (self.root / entry["file"]).read_bytes() if entry.get("file") else None

    def descriptor_set(self, socket: str) -> FileSet | None:
        entry = self.manifest["reflection"].get(socket, {})
        return FileSet.FromString((self.root / entry["file"]).read_bytes()) if entry.get("file") else None

    def reflected_schema(self) -> FileSet | None:
        """Both sockets' reflected descriptors as one set (files deduplicated by name)."""
        files: dict[str, descriptor_pb2.FileDescriptorProto] = {}
        for socket in ("dp2mgr", "config-daemon"):
            fds = self.descriptor_set(socket)
            for fdp in fds.file if fds is not None else ():
                files.setdefault(fdp.name, fdp)
        return FileSet(file=list(files.values())) if files else None
