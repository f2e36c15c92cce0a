"""A test client that knows XDM's schema only from descriptors (a descriptor set
file or server reflection), never from the generated builtin code: what a
correct schema-bound client must see when the simulator serves another schema."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import MethodDescriptor, ServiceDescriptor
from google.protobuf.message import Message


def pool_from_descriptor_set(path: Path) -> descriptor_pool.DescriptorPool:
    fds = descriptor_pb2.FileDescriptorSet.FromString(path.read_bytes())
    pool = descriptor_pool.DescriptorPool()
    for fdp in fds.file:
        pool.Add(fdp)
    return pool


def pool_from_reflection(channel: grpc.Channel) -> descriptor_pool.DescriptorPool:
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

    return descriptor_pool.DescriptorPool(ProtoReflectionDescriptorDatabase(channel))


def services_in(pool: descriptor_pool.DescriptorPool, files: list[str]) -> list[ServiceDescriptor]:
    return [s for name in files for s in pool.FindFileByName(name).services_by_name.values()]


class PoolClient:
    """Calls one service by method name; messages built from the service's own descriptors."""

    def __init__(self, channel: grpc.Channel, service: ServiceDescriptor) -> None:
        self.channel = channel
        self.service = service

    def _method(self, name: str) -> tuple[MethodDescriptor, type[Message], type[Message]]:
        method = self.service.methods_by_name[name]
        return (
            method,
            message_factory.GetMessageClass(method.input_type),
            message_factory.GetMessageClass(method.output_type),
        )

    def request(self, name: str, **fields: Any) -> Message:
        _method, req_cls, _resp = self._method(name)
        return req_cls(**fields)

    def call(self, name: str, request: Message | None = None, timeout: float = 10) -> Any:
        method, req_cls, resp_cls = self._method(name)
        path = f"/{self.service.full_name}/{name}"
        if method.server_streaming:
            stream = self.channel.unary_stream(
                path, request_serializer=req_cls.SerializeToString, response_deserializer=resp_cls.FromString
            )(request or req_cls(), timeout=timeout, wait_for_ready=True)
            first = next(iter(stream))
            stream.cancel()
            return first
        return self.channel.unary_unary(
            path, request_serializer=req_cls.SerializeToString, response_deserializer=resp_cls.FromString
        )(request or req_cls(), timeout=timeout, wait_for_ready=True)
