"""Bind XDM's real schema by meaning, never by number (R1, R2).

The reconstruction in ``proto/lingjun/`` has the API reference's names and guessed numbers.
``xdm_schema`` names XDM's actual schema: ``builtin``, ``reflection``, ``auto`` (reflection when
served, else builtin), or a path (``.proto`` files, compiled by grpcio-tools after the handshake,
or a descriptor set). ``bind`` finds each RPC by method name in any package and each field by
normalised name, then ``xdm_field_aliases``, then ``guesses``' synonyms. A ``Binding`` holds
protobuf's message classes, a reader per field, a report, and the *mismatch* list: what is
required and did not bind.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.resources
import logging
import operator
import os
import re
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor, ServiceDescriptor
from google.protobuf.message import DecodeError, Message

from nomad_plugin._proto.lingjun import api_outer_pb2 as _pb
from nomad_plugin._proto.lingjun import config_service_pb2 as _cpb
from nomad_plugin.model.errors import BackendUnavailable, SchemaMismatch
from nomad_plugin.xdm.guesses import FIELD_ALIASES

log = logging.getLogger(__name__)

MISMATCH_PREFIX = "XDM schema mismatch"
FileSet = descriptor_pb2.FileDescriptorSet
Aliases = Mapping[str, str] | Sequence[tuple[str, str]]
RpcTable = tuple[tuple[str, str, bool], ...]

#: (method, role, server-streaming) of every RPC the plugin may call. Roles: "device" (one
#: service), "exporter" (may live in another service, R13), "config" (config-daemon.sock).
#: Enable and Disable are absent on purpose (R14).
RPCS: RpcTable = (
    ("ListSupportedXPUType", "device", False),
    ("ListAndWatch", "device", True),
    ("Allocate", "device", False),
    ("Release", "device", False),
    ("ListGpuInfo", "exporter", False),
    ("ExporterGetDataList", "exporter", False),
    ("ExporterDataStream", "exporter", True),
    ("ExporterGetConfig", "exporter", False),
    ("ExporterGetStatus", "exporter", False),
    ("QueryStatus", "config", False),
)
#: The Runtime Kit switch, bound only by ``runtime_switch`` for the operator's command.
SWITCH_RPCS: RpcTable = (("QueryStatus", "config", False), ("Enable", "config", False), ("Disable", "config", False))

#: Model fields without which a card or a grant would be wrong ("a|b" = at least one).
REQUIRED_FIELDS = """ListAndWatchResponse.devices Device.minor Device.uuid Device.health Device.totalMemory
AllocateRequest.id AllocateRequest.devices DeviceRequest.minor AllocateResponse.status
AllocateResponse.envs|AllocateResponse.deviceSpecs ReleaseRequest.id""".split()

_TYPE_NAMES = {v: k[5:].lower() for k, v in vars(FieldDescriptor).items() if k.startswith("TYPE_")}
# What a model field of one category may bind to when read (converted); writes need the same category.
_READ_OK = {
    "string": {"string", "enum", "bool", "int", "bytes"},
    "int": {"int", "enum", "string"},
    "float": {"float", "int"},
    "bool": {"bool", "int", "enum"},
}


class SchemaError(ValueError):
    """A schema source that cannot be read (bad path, unparsable file, garbage reflection)."""


def normalise(name: str) -> str:
    """Case- and separator-insensitive form: ``total_memory`` -> ``totalmemory``."""
    return re.sub(r"[^0-9a-z]", "", name.lower())


def _category(fd: FieldDescriptor) -> str:
    if fd.type == FieldDescriptor.TYPE_MESSAGE:
        return "map" if fd.message_type is not None and fd.message_type.GetOptions().map_entry else "message"
    name = _TYPE_NAMES[fd.type]
    if "int" in name or "fixed" in name:
        return "int"
    return {"double": "float", "float": "float", "bool": "bool", "enum": "enum", "bytes": "bytes"}.get(name, "string")


def type_name(fd: FieldDescriptor) -> str:
    """``int64``, ``repeated string``, ``map<string,string>``, ``repeated xdm.Device``."""
    if _category(fd) == "map":
        entry = fd.message_type
        assert entry is not None
        return f"map<{type_name(entry.fields_by_name['key'])},{type_name(entry.fields_by_name['value'])}>"
    named = fd.message_type or fd.enum_type
    base = named.full_name if named is not None else _TYPE_NAMES.get(fd.type, str(fd.type))
    return f"repeated {base}" if fd.is_repeated else base


Reader = Callable[[Message], Any]


@dataclass
class MessageBinding:
    """One reconstruction message bound to one XDM message type: ``read[f](msg)`` gives model field
    ``f`` in the model's type (empty when unbound); ``name``, ``number``, ``child``: the XDM side."""

    model: str
    cls: type[Message]
    read: dict[str, Reader] = field(default_factory=dict)
    name: dict[str, str] = field(default_factory=dict)
    number: dict[str, int] = field(default_factory=dict)
    child: dict[str, MessageBinding] = field(default_factory=dict)

    def new(self) -> Message:
        return self.cls()

    def has(self, model_field: str) -> bool:
        return model_field in self.name

    def set(self, msg: Message, model_field: str, value: Any) -> None:
        """Write a field (a list extends, a dict updates); an unbound field is skipped."""
        name = self.name.get(model_field)
        if name is None:
            return
        if isinstance(value, (list, tuple)):
            getattr(msg, name).extend(value)
        elif isinstance(value, dict):
            getattr(msg, name).update(value)
        else:
            setattr(msg, name, value)

    def add(self, msg: Message, model_field: str) -> Message | None:
        """Append an element to a repeated message field; None when unbound."""
        name = self.name.get(model_field)
        return getattr(msg, name).add() if name is not None else None


@dataclass(frozen=True)
class ReportRow:
    model: str  # "Device.totalMemory"
    bound: str  # "xdm.Device.totalMemory #6 int64", or "" when missing
    note: str = ""  # "alias", "xdm_field_aliases", or why it is missing


@dataclass(frozen=True)
class Rpc:  # one bound RPC
    method: str
    role: str
    streaming: bool
    request: MessageBinding
    response: MessageBinding
    path: str | None  # None: the service name is probed (the reconstruction)


@dataclass
class Binding:
    source: str  # "builtin", "reflection", or the path
    digest: str
    rpcs: dict[str, Rpc]
    rows: list[ReportRow]
    unused: list[str]
    missing_rpcs: list[str]
    mismatch: list[str]

    def rpc(self, method: str) -> Rpc:
        rpc = self.rpcs.get(method)
        if rpc is None:
            raise BackendUnavailable(f"XDM {method}: the bound schema ({self.source}) has no such RPC", "unimplemented")
        return rpc

    @property
    def ok(self) -> bool:
        return not self.mismatch

    def mismatch_text(self) -> str:
        return f"{MISMATCH_PREFIX}: " + "; ".join(self.mismatch) if self.mismatch else ""

    def report_lines(self) -> list[str]:
        """The binding report: one line per RPC and per model field, then what is unused."""
        lines = [f"XDM schema binding (source {self.source}, sha256 {self.digest[:12]}):"]
        lines += [f"  rpc {r.method} -> {r.path or '(service name probed at run time)'}" for r in self.rpcs.values()]
        lines += [f"  rpc {method} -> MISSING" for method in self.missing_rpcs]
        lines += [f"  {r.model} -> {r.bound or 'MISSING'}" + (f" ({r.note})" if r.note else "") for r in self.rows]
        if self.unused:
            lines.append("  unused XDM fields: " + ", ".join(self.unused))
        lines.append("  verdict: " + (self.mismatch_text() or "ok"))
        return lines

    def report(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "sha256": self.digest,
            "rpcs": {m: r.path for m, r in self.rpcs.items()},
            "missing_rpcs": list(self.missing_rpcs),
            "fields": {r.model: r.bound for r in self.rows if r.bound},
            "missing_fields": [r.model + (f" ({r.note})" if r.note else "") for r in self.rows if not r.bound],
            "unused": list(self.unused),
            "mismatch": list(self.mismatch),
        }


def builtin_set() -> FileSet:
    """The reconstruction as a FileDescriptorSet: what ``xdm_schema = "builtin"`` binds."""
    out = FileSet()
    for module in (_pb, _cpb):
        module.DESCRIPTOR.CopyToProto(out.file.add())
    return out


def pool_from_set(fds: FileSet) -> descriptor_pool.DescriptorPool:
    """A fresh pool with every file of ``fds`` in any order; missing well-known imports from the default pool."""
    pool = descriptor_pool.DescriptorPool()
    by_name = {f.name: f for f in fds.file}
    added: set[str] = set()

    def add(name: str, trail: tuple[str, ...]) -> None:
        if name in added:
            return
        if name in trail:
            raise SchemaError(f"import cycle through {name}")
        proto = by_name.get(name)
        if proto is None:
            try:
                known = descriptor_pool.Default().FindFileByName(name)
            except KeyError:
                raise SchemaError(f"{trail[-1]} imports {name}, which the schema does not hold") from None
            proto = descriptor_pb2.FileDescriptorProto()
            known.CopyToProto(proto)
        for dep in proto.dependency:
            add(dep, (*trail, name))
        try:
            pool.Add(proto)
        except Exception as exc:  # protobuf raises TypeError/ValueError/KeyError for bad descriptors
            raise SchemaError(f"descriptor {name} is invalid: {exc}") from None
        added.add(name)

    for proto in fds.file:
        add(proto.name, ())
    return pool


def services_with(fds: FileSet, method: str) -> list[str]:
    """Fully-qualified names of the services in ``fds`` that have ``method``."""
    return [
        f"{f.package}.{s.name}" if f.package else s.name
        for f in fds.file
        for s in f.service
        if any(m.name == method for m in s.method)
    ]


def bind(fds: FileSet, source: str, aliases: Aliases = (), rpcs: RpcTable = RPCS) -> Binding:
    """Bind ``fds``; ``SchemaError`` only when it cannot form a descriptor pool. Cached per schema
    bytes and aliases: re-binding to an unchanged XDM after a reconnect makes no new pool or classes.
    Under the reconstruction (source ``builtin``) the package is a guess too: service names are probed (R1)."""
    return _bind(fds.SerializeToString(deterministic=True), source, tuple(sorted(dict(aliases).items())), rpcs)


@functools.lru_cache(maxsize=16)
def _bind(data: bytes, source: str, pairs: tuple[tuple[str, str], ...], rpcs: RpcTable) -> Binding:
    fds = FileSet.FromString(data)
    return _Binder(pool_from_set(fds), fds, dict(pairs)).run(source, hashlib.sha256(data).hexdigest(), rpcs)


def builtin_binding(aliases: Aliases = (), rpcs: RpcTable = RPCS) -> Binding:
    return bind(builtin_set(), "builtin", aliases, rpcs)


def choose(
    schema: str,
    aliases: Aliases,
    reflect: Callable[[], FileSet | None],
    unserved: str,
    *,
    rpcs: RpcTable = RPCS,
    needs: tuple[str, ...] = ("ListAndWatch", "Allocate"),
    label: str = "reflection",
) -> Binding:
    """The binding ``xdm_schema`` asks for (``SchemaMismatch``: unreadable). ``reflect()`` asks the daemon
    (None: not served; ``unserved`` says so); under ``auto``, reflection lacking ``needs`` gives the builtin."""
    try:
        if schema == "builtin":
            return builtin_binding(aliases, rpcs)
        if is_path(schema):
            return bind(load_path(schema), schema, aliases, rpcs=rpcs)
        fds = reflect()
        if fds is None:
            if schema == "reflection":
                raise SchemaMismatch(f'{MISMATCH_PREFIX}: xdm_schema is "reflection" but {unserved}')
            return builtin_binding(aliases, rpcs)
        found = bind(fds, label, aliases, rpcs=rpcs)
    except SchemaError as exc:
        raise SchemaMismatch(f"{MISMATCH_PREFIX}: {exc}") from None
    if schema == "auto" and not any(m in found.rpcs for m in needs):
        log.info("XDM reflection describes none of %s; using the built-in reconstruction", ", ".join(needs))
        return builtin_binding(aliases, rpcs)
    return found


class _Binder:
    def __init__(self, pool: descriptor_pool.DescriptorPool, fds: FileSet, aliases: dict[str, str]) -> None:
        self.aliases = aliases
        self.services: list[ServiceDescriptor] = [
            s for proto in fds.file for s in pool.FindFileByName(proto.name).services_by_name.values()
        ]
        self.rows: list[ReportRow] = []
        self.bound: dict[tuple[str, str, bool], MessageBinding] = {}
        self.used: dict[str, set[str]] = {}  # XDM message full name -> bound field names
        self.targets: dict[str, Descriptor] = {}
        self.mismatch: list[str] = []

    def run(self, source: str, digest: str, table: RpcTable) -> Binding:
        model = {m.name: m for mod in (_pb, _cpb) for s in mod.DESCRIPTOR.services_by_name.values() for m in s.methods}
        rpcs: dict[str, Rpc] = {}
        missing: list[str] = []
        device_service = self._device_service()
        for method, role, streaming in table:
            found = self._find_method(method, role, device_service)
            if found is None:
                missing.append(method)
                continue
            service, target = found
            if bool(target.server_streaming) != streaming or target.client_streaming:
                shape = ["server-streaming" if target.server_streaming else "unary"]
                shape += ["client-streaming"] if target.client_streaming else []
                needs = "server-streaming" if streaming else "unary"
                self.mismatch.append(
                    f"rpc {service.full_name}.{target.name} is {', '.join(shape)}; the plugin needs {needs}"
                )
                continue
            spec: MethodDescriptor = model[method]
            request = self._message(spec.input_type, target.input_type, write=True)
            response = self._message(spec.output_type, target.output_type, write=False)
            path = None if source == "builtin" else f"/{service.full_name}/{target.name}"
            rpcs[method] = Rpc(method, role, streaming, request, response, path)
        if table is RPCS:
            self.mismatch += [
                f"no service has the {m} RPC" for m in ("ListAndWatch", "Allocate", "Release") if m in missing
            ]
        self._check_required()
        unused = [
            f"{name}.{fname}"
            for name, desc in self.targets.items()
            for fname in desc.fields_by_name
            if fname not in self.used.get(name, set())
        ]
        return Binding(source, digest, rpcs, self.rows, unused, missing, self.mismatch)

    def _device_service(self) -> ServiceDescriptor | None:
        """The service with most device RPCs: a kubelet-style ``DevicePlugin`` loses to XDM's own."""
        wanted = {normalise(m) for m, role, _ in RPCS if role == "device"}
        scored = [(sum(normalise(m.name) in wanted for m in s.methods), -i, s) for i, s in enumerate(self.services)]
        best = max(scored, default=None, key=lambda t: t[:2])
        return best[2] if best is not None and best[0] else None

    def _find_method(
        self, method: str, role: str, device: ServiceDescriptor | None
    ) -> tuple[ServiceDescriptor, MethodDescriptor] | None:
        found = [(s, m) for s in self.services for m in s.methods if normalise(m.name) == normalise(method)]
        if found and role != "config" and device is not None:
            same = [(s, m) for s, m in found if s.full_name == device.full_name]
            if same or role == "device":  # a device RPC beside another service's ListAndWatch is not ours
                return same[0] if same else None
        return found[0] if found else None

    def _message(self, model: Descriptor, target: Descriptor, write: bool) -> MessageBinding:
        key = (model.full_name, target.full_name, write)
        if key in self.bound:
            return self.bound[key]
        binding = self.bound[key] = MessageBinding(model.name, message_factory.GetMessageClass(target))
        self.targets.setdefault(target.full_name, target)
        used = self.used.setdefault(target.full_name, set())
        by_norm = {normalise(f.name): f for f in reversed(target.fields)}  # the first of a spelling wins
        # exact names and the operator's aliases first, then the guessed synonyms for fields still free
        matches = {f.name: self._match(model.name, f, target, by_norm) for f in model.fields}
        taken = {t.name for t, _ in matches.values() if t is not None}
        own = {normalise(f.name) for f in model.fields}
        for mfield in model.fields:
            synonyms = [by_norm.get(normalise(alias)) for alias in FIELD_ALIASES.get(mfield.name, ())]
            free = [s for s in synonyms if s is not None and s.name not in taken and normalise(s.name) not in own]
            if matches[mfield.name] == (None, "") and free:
                taken.add(free[0].name)
                matches[mfield.name] = (free[0], "alias")
        for mfield in model.fields:
            label = f"{model.name}.{mfield.name}"
            tfield, how = matches[mfield.name]
            problem = _incompatible(mfield, tfield, write) if tfield is not None else ""
            if tfield is None or problem:
                where = f"{target.full_name}.{tfield.name} is {type_name(tfield)}: " if tfield is not None else ""
                self._row(label, "", where + (problem or how or "no field of that name"))
                binding.read[mfield.name] = _empty_reader(mfield)
                continue
            used.add(tfield.name)
            binding.name[mfield.name] = tfield.name
            binding.number[mfield.name] = tfield.number
            self._row(label, f"{target.full_name}.{tfield.name} #{tfield.number} {type_name(tfield)}", how)
            if _category(mfield) == "message":
                assert mfield.message_type is not None and tfield.message_type is not None
                binding.child[mfield.name] = self._message(mfield.message_type, tfield.message_type, write)
            binding.read[mfield.name] = _reader(mfield, tfield)
        return binding

    def _row(self, label: str, bound: str, note: str) -> None:
        if all(r.model != label for r in self.rows):
            self.rows.append(ReportRow(label, bound, note))

    def _match(
        self, message: str, mfield: FieldDescriptor, target: Descriptor, by_norm: dict[str, FieldDescriptor]
    ) -> tuple[FieldDescriptor | None, str]:
        configured = self.aliases.get(f"{message}.{mfield.name}") or self.aliases.get(mfield.name)
        if not configured:
            return by_norm.get(normalise(mfield.name)), ""
        hit = target.fields_by_name.get(configured) or by_norm.get(normalise(configured))
        if hit is not None:
            return hit, "xdm_field_aliases"
        return None, f"xdm_field_aliases names {configured!r}, which {target.full_name} lacks"

    def _check_required(self) -> None:
        rows = {r.model: r for r in self.rows}
        for spec in REQUIRED_FIELDS:
            options = spec.split("|")
            seen = [rows[o] for o in options if o in rows]
            if not seen or any(r.bound for r in seen):
                continue  # bound, or never reached (its RPC or parent is missing, reported on its own)
            why = "; ".join(f"{r.model}: {r.note}" for r in seen if r.note)
            self.mismatch.append(f"required {' or '.join(options)} not bound" + (f" ({why})" if why else ""))


def _incompatible(mfield: FieldDescriptor, tfield: FieldDescriptor, write: bool) -> str:
    """Why ``tfield`` cannot stand for ``mfield`` (empty when it can). Reads convert; writes need the same kind."""
    mcat, tcat = _category(mfield), _category(tfield)
    if mcat != "map" and bool(mfield.is_repeated) != bool(tfield.is_repeated):
        return "repeated" if tfield.is_repeated else "not repeated"
    if tcat != mcat and (write or tcat not in _READ_OK.get(mcat, ())):
        return f"the plugin needs {type_name(mfield)}"
    if mcat == "map":
        assert mfield.message_type is not None and tfield.message_type is not None
        for part in ("key", "value"):
            sub = _incompatible(
                mfield.message_type.fields_by_name[part], tfield.message_type.fields_by_name[part], write
            )
            if sub:
                return f"map {part}: {sub}"
    return ""


def _empty_reader(mfield: FieldDescriptor) -> Reader:
    if mfield.is_repeated:
        return (lambda _m: {}) if _category(mfield) == "map" else (lambda _m: [])
    default = mfield.default_value  # "", 0, 0.0, False, b"", or None for a message
    return lambda _m: default


def _reader(mfield: FieldDescriptor, tfield: FieldDescriptor) -> Reader:
    """A reader of ``tfield`` converted to ``mfield``'s model type."""
    name = tfield.name
    mcat, tcat = _category(mfield), _category(tfield)
    if mcat == "map":
        return lambda m: dict(getattr(m, name))
    if mcat == "message":
        if mfield.is_repeated:
            return lambda m: list(getattr(m, name))
        return lambda m: getattr(m, name) if m.HasField(name) else None
    if mcat == tcat or (mcat == "int" and tcat == "enum"):
        return (lambda m: list(getattr(m, name))) if mfield.is_repeated else operator.attrgetter(name)
    convert = _converter(mcat, tcat, tfield)
    if mfield.is_repeated:
        return lambda m: [convert(v) for v in getattr(m, name)]
    return lambda m: convert(getattr(m, name))


def _converter(mcat: str, tcat: str, tfield: FieldDescriptor) -> Callable[[Any], Any]:
    if mcat == "string" and tcat == "enum":
        values = {v.number: v.name for v in tfield.enum_type.values} if tfield.enum_type is not None else {}
        return lambda v: values.get(v, str(v))
    if mcat == "string" and tcat == "bool":
        return lambda v: "true" if v else "false"
    if mcat == "string" and tcat == "bytes":
        return lambda v: bytes(v).decode("utf-8", "replace")
    if mcat == "int" and tcat == "string":
        return lambda v: int(v) if v.strip().isdigit() else 0
    return {"string": str, "float": float, "bool": bool}.get(mcat, lambda v: v)


KEYWORDS = ("auto", "reflection", "builtin")
MAX_SCHEMA_BYTES = 16 << 20
MAX_PROTO_FILES = 256


def is_path(value: str) -> bool:
    return value.strip() not in KEYWORDS


def load_path(path: str) -> FileSet:
    """A ``.proto`` file, a directory of them, or a descriptor set file; ``SchemaError`` names the file."""
    target = Path(path).expanduser()
    if not target.exists():
        raise SchemaError(f"{path}: no such file or directory")
    if target.is_dir():
        files = sorted(p for p in target.rglob("*.proto") if p.is_file())
        if not files:
            raise SchemaError(f"{path}: the directory holds no .proto file")
        if len(files) > MAX_PROTO_FILES:
            raise SchemaError(f"{path}: {len(files)} .proto files (at most {MAX_PROTO_FILES})")
        fds = compile_protos(target, [p.relative_to(target) for p in files])
    elif target.suffix == ".proto":
        fds = compile_protos(target.parent, [Path(target.name)])
    else:
        fds = read_descriptor_set(target)
    try:
        pool_from_set(fds)
    except SchemaError as exc:
        raise SchemaError(f"{path}: {exc}") from None
    return fds


def read_descriptor_set(path: Path) -> FileSet:
    try:
        size = path.stat().st_size
        if size > MAX_SCHEMA_BYTES:
            raise SchemaError(f"{path}: {size} bytes (at most {MAX_SCHEMA_BYTES})")
        fds = FileSet.FromString(path.read_bytes())
    except OSError as exc:
        raise SchemaError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except DecodeError as exc:
        raise SchemaError(f"{path}: not a FileDescriptorSet (nor a .proto file or directory): {exc}") from None
    if not fds.file or any(not f.name for f in fds.file):
        raise SchemaError(f"{path}: not a FileDescriptorSet (no named file descriptors in it)")
    return fds


def compile_protos(root: Path, files: list[Path]) -> FileSet:
    """protoc in-process (grpcio-tools) with its bundled well-known types; errors name the file."""
    from grpc_tools import protoc  # several MB that only a path schema needs

    well_known = str(importlib.resources.files("grpc_tools") / "_proto")
    with tempfile.TemporaryDirectory(prefix="xdm-schema-") as tmp:
        out, errors = Path(tmp) / "schema.pb", Path(tmp) / "errors.txt"
        args = ["protoc", f"-I{root}", f"-I{well_known}", "--include_imports", f"--descriptor_set_out={out}"]
        saved = os.dup(2)  # protoc writes its errors to fd 2, never to stdout
        fd = os.open(errors, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(fd, 2)
        os.close(fd)
        try:
            code = protoc.main([*args, *(str(f) for f in files)])
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        if code != 0 or not out.exists():
            message = errors.read_text(errors="replace").strip() or f"protoc exited with {code}"
            shown = message if len(message) <= 2000 else message[:2000] + " ..."
            raise SchemaError(f"{root / files[0] if len(files) == 1 else root}: {shown}")
        return read_descriptor_set(out)


REFLECTION_SERVICES = ("grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection")


def reflect(channel: grpc.Channel, timeout: float) -> FileSet | None:
    """XDM's schema through server reflection (v1, then v1alpha), within ``timeout``; None when it
    serves neither. Garbage answers raise ``SchemaError``; a transport failure ``grpc.RpcError``."""
    from grpc_reflection.v1alpha import reflection_pb2 as rpb  # v1's messages are wire-identical

    deadline = time.monotonic() + timeout
    for service in REFLECTION_SERVICES:
        call = channel.stream_stream(
            f"/{service}/ServerReflectionInfo",
            request_serializer=rpb.ServerReflectionRequest.SerializeToString,
            response_deserializer=lambda data: data,
        )

        def ask(call: Any = call, **request: Any) -> Any:
            left = max(0.01, deadline - time.monotonic())
            stream = call(iter([rpb.ServerReflectionRequest(**request)]), timeout=left, wait_for_ready=True)
            try:
                raw = next(stream, None)
            finally:
                stream.cancel()
            if raw is None:
                raise SchemaError("server reflection closed the stream before answering")
            try:
                answer = rpb.ServerReflectionResponse.FromString(raw)
            except DecodeError as exc:
                raise SchemaError(f"server reflection answered garbage ({len(raw)} bytes): {exc}") from None
            if answer.HasField("error_response"):
                err = answer.error_response
                raise SchemaError(f"server reflection error {err.error_code}: {err.error_message}")
            return answer

        try:
            return _reflected_files(ask)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
                raise
    return None


def _reflected_files(ask: Callable[..., Any]) -> FileSet:
    """Lists the services, asks for the file defining each, then for their imports by file name."""
    listed = ask(list_services="")
    if not listed.HasField("list_services_response"):
        raise SchemaError("server reflection did not answer list_services")
    files: dict[str, descriptor_pb2.FileDescriptorProto] = {}

    def add(answer: Any) -> None:
        if not answer.HasField("file_descriptor_response"):
            raise SchemaError("server reflection did not answer with file descriptors")
        for raw in answer.file_descriptor_response.file_descriptor_proto:
            try:
                proto = descriptor_pb2.FileDescriptorProto.FromString(raw)
            except DecodeError as exc:
                raise SchemaError(f"server reflection sent an unparsable file descriptor: {exc}") from None
            if not proto.name:
                raise SchemaError("server reflection sent a file descriptor without a name")
            if proto.name not in files and len(files) >= MAX_PROTO_FILES:
                raise SchemaError(f"server reflection sent more than {MAX_PROTO_FILES} files")
            files.setdefault(proto.name, proto)

    for s in listed.list_services_response.service:
        if not s.name.startswith(("grpc.reflection.", "grpc.health.")):
            add(ask(file_containing_symbol=s.name))
    asked: set[str] = set()
    while missing := {d for f in files.values() for d in f.dependency} - set(files) - asked:
        for dep in sorted(missing):
            asked.add(dep)
            try:
                add(ask(file_by_filename=dep))
            except SchemaError:
                pass  # e.g. a well-known type the pool supplies itself
    fds = FileSet(file=list(files.values()))
    pool_from_set(fds)
    return fds
