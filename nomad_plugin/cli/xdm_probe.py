"""``nomad-device-lingjun xdm-probe``: call XDM's read-only RPCs and print what comes back.

Probes both sockets, finds the device service name and prints the decoded answers of
ListSupportedXPUType, ListGpuInfo, one ListAndWatch push, ExporterGetConfig, ExporterGetStatus and
QueryStatus; ``--raw`` adds each answer's bytes decoded like ``protoc --decode_raw`` (to re-derive
the schema on a real node, docs/xdm-risks.md); ``--capture DIR`` writes a bug-report bundle
instead. Never calls Allocate, Release, Enable or Disable.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import struct
import sys
from collections.abc import Callable
from contextlib import closing, suppress
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import empty_pb2
from google.protobuf.message import DecodeError
from google.protobuf.unknown_fields import UnknownFieldSet

from nomad_plugin.cli.common import add_config_options, command_parser, fail, plugin_config
from nomad_plugin.config.model import ConfigError, PluginConfig
from nomad_plugin.launcher.config import LauncherConfigError
from nomad_plugin.launcher.process import socket_overrides
from nomad_plugin.model.errors import BackendUnavailable, PluginError
from nomad_plugin.xdm.capture import capture
from nomad_plugin.xdm.client import XdmClient, socket_problem


def parser() -> argparse.ArgumentParser:
    p = command_parser("xdm-probe", __doc__ or "")
    p.add_argument("--socket-dir", help="directory with dp2mgr.sock and config-daemon.sock (default: from the config)")
    add_config_options(p)
    p.add_argument("--raw", action="store_true", help="also print every response decoded like protoc --decode_raw")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.add_argument(
        "--capture",
        metavar="DIR",
        help="write a bug-report bundle to DIR (reflection descriptors, raw bytes of every read-only RPC, "
        "versions, binding report) instead of printing",
    )
    return p


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {k: _plain(v) for k, v in dataclasses.asdict(value).items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return repr(value)


def _raw_call(socket: str, path: str, timeout: float, streaming: bool) -> bytes:
    """The answer's bytes to an empty request (the read-only RPCs' "all" filters), undecoded."""
    with grpc.insecure_channel(f"unix:{socket}") as channel:
        if not streaming:
            data: bytes = channel.unary_unary(path, None, None)(b"", timeout=timeout)
            return data
        stream = channel.unary_stream(path, None, None)(b"", timeout=timeout)
        try:
            first: bytes = next(iter(stream), b"")
            return first
        finally:
            stream.cancel()  # type: ignore[no-untyped-call]


def probe(config: PluginConfig, raw: bool) -> dict[str, Any]:
    report: dict[str, Any] = {"sockets": {}, "calls": []}
    for label, path in (("dp2mgr", config.xdm_socket), ("config-daemon", config.config_socket)):
        problem = socket_problem(path)
        report["sockets"][label] = {
            "path": path,
            "ok": problem is None,
            "problem": str(problem) if problem else "",
            "kind": problem.kind if problem else "",
        }
    timeout = float(config.xdm_call_timeout)
    with closing(XdmClient(config)) as client:
        with suppress(PluginError):  # reported below; the raw calls still run
            client.binding()
        bound = client.last_binding
        report["binding"] = {
            "error": client.last_bind_error,
            "report": bound.report() if bound is not None else None,
            "lines": bound.report_lines() if bound is not None else [],
        }
        try:
            report["device_service"] = client.device_service()
        except PluginError as exc:
            report["device_service"] = None
            report["device_service_error"] = str(exc)

        def first_push() -> Any:
            sub = client.list_and_watch()
            try:
                return next(iter(sub))
            finally:
                sub.cancel()

        steps: list[tuple[str, Callable[[], Any]]] = [
            ("ListSupportedXPUType", client.list_supported_xpu_types),
            ("ListGpuInfo", client.list_gpu_info),
            ("ListAndWatch (first push)", first_push),
            ("ExporterGetConfig", client.exporter_get_config),
            ("ExporterGetStatus", client.exporter_get_status),
            ("QueryStatus", lambda: _query_status(client, config)),
        ]
        for name, call in steps:
            method = name.split(" ")[0]
            sock = "config-daemon" if method == "QueryStatus" else "dp2mgr"
            entry: dict[str, Any] = {"rpc": name, "socket": sock}
            try:
                entry["response"] = _plain(call())
                entry["ok"] = True
            except PluginError as exc:
                entry.update(ok=False, error=str(exc), kind=getattr(exc, "kind", type(exc).__name__))
            except StopIteration:
                entry.update(ok=False, error="the stream ended without a message")
            owner = client.service_of(method)
            entry["path"] = f"/{owner}/{method}" if owner else None
            if raw and owner:
                target = config.config_socket if sock == "config-daemon" else config.xdm_socket
                try:
                    data = _raw_call(target, f"/{owner}/{method}", timeout, method == "ListAndWatch")
                    entry["raw_hex"], entry["raw"] = data.hex(), raw_text(data)
                except grpc.RpcError as exc:
                    entry["raw_error"] = f"{exc.code().name}: {exc.details()}"
            report["calls"].append(entry)
    report["ok"] = (
        all(s["ok"] for s in report["sockets"].values())
        and all(c["ok"] for c in report["calls"])
        and not report["binding"]["error"]
    )
    return report


def _query_status(client: Any, config: Any) -> Any:
    """QueryStatus, its socket checked first; a failure that came from binding XDM's schema through
    dp2mgr.sock says so."""
    problem = socket_problem(config.config_socket)
    if problem is not None:
        raise problem
    try:
        return client.query_status()
    except PluginError as exc:
        text = str(exc)
        if config.xdm_socket in text and config.config_socket not in text:
            raise BackendUnavailable(
                f"QueryStatus was not sent to {config.config_socket}: it needs XDM's schema, which is bound "
                f"through {config.xdm_socket}, and that failed: {text}",
                kind=getattr(exc, "kind", "unavailable"),
            ) from None
        raise


def _text(report: dict[str, Any]) -> list[str]:
    lines = []
    for label, s in report["sockets"].items():
        lines.append(
            f"socket {label}: {s['path']}: " + ("reachable" if s["ok"] else f"PROBLEM ({s['kind']}): {s['problem']}")
        )
    binding = report.get("binding") or {}
    lines += binding.get("lines") or []
    if binding.get("error"):
        lines.append(f"SCHEMA: {binding['error']}")
    service = report.get("device_service")
    lines.append(
        f"device service: {service}" if service else f"device service: NOT FOUND: {report.get('device_service_error')}"
    )
    for c in report["calls"]:
        lines += ["", f"== {c['rpc']}  [{c.get('path') or '?'} on {c['socket']}]"]
        if c["ok"]:
            lines.append(json.dumps(c["response"], indent=2))
        else:
            lines.append(f"FAILED ({c.get('kind', '')}): {c['error']}")
        if "raw" in c:
            lines.append(f"-- raw ({len(c['raw_hex']) // 2} bytes, protoc --decode_raw style):")
            lines += c["raw"]
        elif "raw_error" in c:
            lines.append(f"-- raw call failed: {c['raw_error']}")
    return lines


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    overrides = [*(socket_overrides(args.socket_dir) if args.socket_dir else []), *args.set]
    try:
        config = plugin_config(args.plugin_config, overrides)
        if args.capture:
            return _capture(args.capture, config)
        report = probe(config, args.raw)
    except (LauncherConfigError, ConfigError, PluginError) as exc:
        return fail("xdm-probe", str(exc))
    if args.json:
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
    else:
        sys.stdout.write("\n".join(_text(report)) + "\n")
    return 0 if report["ok"] else 1


def _capture(directory: str, config: PluginConfig) -> int:
    try:
        manifest = capture(config, Path(directory), render_raw=raw_text)
    except OSError as exc:
        return fail("xdm-probe", f"--capture {directory}: {exc.strerror or exc}")
    lines = [f"capture bundle: {directory}"]
    for sock, entry in manifest["reflection"].items():
        lines.append(f"reflection on {sock}: " + ("served" if entry["served"] else f"none ({entry['why']})"))
    for call in manifest["calls"]:
        state = f"{call['size']} bytes from {call['path']}" if call["ok"] else f"FAILED: {call['error']}"
        lines.append(f"  {call['rpc']:<22} {state}")
    sys.stdout.write("\n".join(lines) + "\n")
    return 0 if manifest["ok"] else 1


WIRE_NAMES = {0: "varint", 1: "fixed64", 2: "len", 3: "group", 5: "fixed32"}
MAX_DEPTH = 12


def _fields(data: bytes) -> list[Any] | None:
    """The fields of ``data`` by protobuf's own parser (all unknown to an Empty message); None if malformed."""
    message = empty_pb2.Empty()
    try:
        message.ParseFromString(data)
    except DecodeError:
        return None
    fields = UnknownFieldSet(message)
    return [fields[i] for i in range(len(fields))]


def _printable(data: bytes) -> str | None:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return text if all(ch.isprintable() or ch in "\n\t" for ch in text) else None


def raw_text(data: bytes) -> list[str]:
    """Bytes of a message we have no schema for, as ``protoc --decode_raw`` shows them: lines like
    ``3 (len) {`` / ``  1 (varint): 7`` / ``}``; one line saying so for bytes that are not a message."""
    fields = _fields(data)
    if fields is None:
        return [f"<not a protobuf message (the wire format is corrupt); {len(data)} bytes: {data[:32].hex()}>"]
    return _lines(fields, "", 0)


def _lines(fields: list[Any], indent: str, depth: int) -> list[str]:
    lines: list[str] = []
    for field in fields:
        head, value = f"{indent}{field.field_number} ({WIRE_NAMES.get(field.wire_type, field.wire_type)})", field.data
        if field.wire_type == 0:
            signed = value - (1 << 64) if value >= 1 << 63 else value
            lines.append(f"{head}: {value}" + (f"  (int64 {signed})" if signed != value else ""))
        elif field.wire_type in (1, 5):
            size, ints, real = (8, "q", "d") if field.wire_type == 1 else (4, "i", "f")
            raw = value.to_bytes(size, "little")
            (number,), (double,) = struct.unpack("<" + ints, raw), struct.unpack("<" + real, raw)
            kind = ("fixed64", "double") if size == 8 else ("fixed32", "float")
            lines.append(f"{head}: 0x{raw.hex()}  ({kind[0]} {number}, {kind[1]} {double!r})")
        elif field.wire_type == 3:
            lines += [
                f"{head} {{",
                *_lines([value[i] for i in range(len(value))], indent + "  ", depth + 1),
                f"{indent}}}",
            ]
        else:
            text = _printable(value)
            nested = _fields(value) if depth < MAX_DEPTH and value else None
            if nested and (text is None or len(text) < 2 or not text.isprintable()):
                lines += [f"{head} {{", *_lines(nested, indent + "  ", depth + 1), f"{indent}}}"]
            elif text is not None:
                lines.append(f"{head}: {text!r}")
            else:
                lines.append(f"{head}: <{len(value)} bytes> {value[:64].hex()}")
    return lines
