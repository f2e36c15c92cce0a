"""Where XDM's schema comes from: a ``FileDescriptorSet`` for ``binder.bind``.

``xdm_schema`` picks the source:

- ``"builtin"``: the reconstruction compiled into the plugin;
- ``"reflection"``: gRPC server reflection on XDM's sockets (v1, then v1alpha);
- ``"auto"`` (default): reflection when XDM serves it, else the reconstruction;
- a path: a ``.proto`` file, a directory of ``.proto`` files (compiled at run
  time with grpcio-tools' bundled protoc, imported lazily so nothing of it
  touches the launch path before the go-plugin handshake), or a
  FileDescriptorSet (``protoc --include_imports --descriptor_set_out``).

Everything that goes wrong raises ``SchemaError`` naming the file and the
parser's message.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import descriptor_pb2
from google.protobuf.message import DecodeError

from nomad_plugin.xdm.binder import SchemaError, pool_from_set

KEYWORDS = ("auto", "reflection", "builtin")
REFLECTION_SERVICES = ("grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection")
MAX_SCHEMA_BYTES = 16 << 20
MAX_PROTO_FILES = 256


def is_path(value: str) -> bool:
    return value.strip() not in KEYWORDS


# ------------------------------------------------------------------ files
def load_path(path: str) -> descriptor_pb2.FileDescriptorSet:
    """A ``.proto`` file, a directory of them, or a descriptor set file -> FileDescriptorSet."""
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


def read_descriptor_set(path: Path) -> descriptor_pb2.FileDescriptorSet:
    try:
        size = path.stat().st_size
        if size > MAX_SCHEMA_BYTES:
            raise SchemaError(f"{path}: {size} bytes (at most {MAX_SCHEMA_BYTES})")
        data = path.read_bytes()
    except OSError as exc:
        raise SchemaError(f"{path}: cannot read: {exc.strerror or exc}") from None
    fds = descriptor_pb2.FileDescriptorSet()
    try:
        fds.ParseFromString(data)
    except DecodeError as exc:
        raise SchemaError(f"{path}: not a FileDescriptorSet (nor a .proto file or directory): {exc}") from None
    if not fds.file or any(not f.name for f in fds.file):
        raise SchemaError(f"{path}: not a FileDescriptorSet (no named file descriptors in it)")
    return fds


def compile_protos(root: Path, files: list[Path]) -> descriptor_pb2.FileDescriptorSet:
    """Run protoc in-process (grpcio-tools) with the bundled well-known types."""
    try:
        from grpc_tools import protoc  # lazy: a few MB of code only a path schema needs
    except ImportError as exc:  # pragma: no cover - it is a runtime dependency
        raise SchemaError(f"compiling .proto files needs grpcio-tools: {exc}") from None
    import importlib.resources

    well_known = str(importlib.resources.files("grpc_tools") / "_proto")
    with tempfile.TemporaryDirectory(prefix="xdm-schema-") as tmp:
        out = Path(tmp) / "schema.pb"
        errors = Path(tmp) / "errors.txt"
        args = [
            "protoc",
            f"-I{root}",
            f"-I{well_known}",
            "--include_imports",
            f"--descriptor_set_out={out}",
            *(str(f) for f in files),
        ]
        with _stderr_to(errors):
            code = protoc.main(args)
        if code != 0 or not out.exists():
            message = errors.read_text(errors="replace").strip() or f"protoc exited with {code}"
            shown = message if len(message) <= 2000 else message[:2000] + " ..."
            raise SchemaError(f"{root / files[0] if len(files) == 1 else root}: {shown}")
        return read_descriptor_set(out)


class _stderr_to:
    """Send fd 2 to a file while protoc runs (it writes its errors there, never to stdout)."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._saved = -1

    def __enter__(self) -> None:
        self._saved = os.dup(2)
        fd = os.open(self._path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(fd, 2)
        os.close(fd)

    def __exit__(self, *exc: object) -> None:
        os.dup2(self._saved, 2)
        os.close(self._saved)


# ------------------------------------------------------------------ reflection
def reflect(channel: grpc.Channel, timeout: float) -> descriptor_pb2.FileDescriptorSet | None:
    """XDM's schema through server reflection; None when XDM does not serve it.

    Lists the services, asks for the file defining each, and follows imports
    (transitively) by file name. Garbage answers raise ``SchemaError``; a
    transport failure raises ``grpc.RpcError`` for the caller to classify.
    """
    from grpc_reflection.v1alpha import reflection_pb2 as rpb  # v1 messages are wire-identical

    for service in REFLECTION_SERVICES:
        path = f"/{service}/ServerReflectionInfo"
        call = channel.stream_stream(
            path, request_serializer=rpb.ServerReflectionRequest.SerializeToString, response_deserializer=_raw
        )
        try:
            return _Reflector(call, timeout, rpb).run()
        except grpc.RpcError as exc:
            code = exc.code() if callable(getattr(exc, "code", None)) else None
            if code == grpc.StatusCode.UNIMPLEMENTED:
                continue
            raise
    return None


def _raw(data: bytes) -> bytes:
    return data


class _Reflector:
    """One reflection conversation: requests go out one at a time over one stream."""

    def __init__(self, call: Any, timeout: float, rpb: Any) -> None:
        import queue

        self._rpb = rpb
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=4)  # one request in flight at a time
        self._responses: Iterator[bytes] = call(iter(self._queue.get, None), timeout=timeout, wait_for_ready=True)

    def _ask(self, **kwargs: Any) -> Any:
        self._queue.put(self._rpb.ServerReflectionRequest(**kwargs))
        try:
            raw = next(self._responses)
        except StopIteration:
            raise SchemaError("server reflection closed the stream before answering") from None
        answer = self._rpb.ServerReflectionResponse()
        try:
            answer.ParseFromString(raw)
        except DecodeError as exc:
            raise SchemaError(f"server reflection answered garbage ({len(raw)} bytes): {exc}") from None
        if answer.HasField("error_response"):
            err = answer.error_response
            raise SchemaError(f"server reflection error {err.error_code}: {err.error_message}")
        return answer

    def run(self) -> descriptor_pb2.FileDescriptorSet:
        try:
            listed = self._ask(list_services="")
            if not listed.HasField("list_services_response"):
                raise SchemaError("server reflection did not answer list_services")
            names = [s.name for s in listed.list_services_response.service]
            files: dict[str, descriptor_pb2.FileDescriptorProto] = {}
            for name in names:
                if name.startswith("grpc.reflection.") or name.startswith("grpc.health."):
                    continue
                self._add(self._ask(file_containing_symbol=name), files)
            pending = [dep for f in list(files.values()) for dep in f.dependency]
            while pending:
                dep = pending.pop()
                if dep in files:
                    continue
                try:
                    answer = self._ask(file_by_filename=dep)
                except SchemaError:
                    continue  # e.g. a well-known type the pool supplies itself
                for new in self._add(answer, files):
                    pending.extend(new.dependency)
            fds = descriptor_pb2.FileDescriptorSet(file=list(files.values()))
            pool_from_set(fds)
            return fds
        finally:
            self._queue.put(None)

    def _add(
        self, answer: Any, files: dict[str, descriptor_pb2.FileDescriptorProto]
    ) -> list[descriptor_pb2.FileDescriptorProto]:
        if not answer.HasField("file_descriptor_response"):
            raise SchemaError("server reflection did not answer with file descriptors")
        added = []
        for raw in answer.file_descriptor_response.file_descriptor_proto:
            proto = descriptor_pb2.FileDescriptorProto()
            try:
                proto.ParseFromString(raw)
            except DecodeError as exc:
                raise SchemaError(f"server reflection sent an unparsable file descriptor: {exc}") from None
            if not proto.name:
                raise SchemaError("server reflection sent a file descriptor without a name")
            if proto.name not in files:
                files[proto.name] = proto
                added.append(proto)
        return added
