"""Schema variants for binder tests, made from the reconstruction's descriptors.

Each function returns a new FileDescriptorSet; none touches the originals.
They model what a real XDM may serve: another package, other field numbers,
other spellings of the same names.
"""

from __future__ import annotations

import re

from google.protobuf import descriptor_pb2

from nomad_plugin.xdm.binder import builtin_set


def base() -> descriptor_pb2.FileDescriptorSet:
    return builtin_set()


def _messages(fds: descriptor_pb2.FileDescriptorSet):
    for f in fds.file:
        stack = list(f.message_type)
        while stack:
            m = stack.pop()
            yield f, m
            stack.extend(m.nested_type)


def repackaged(fds: descriptor_pb2.FileDescriptorSet, old: str, new: str) -> descriptor_pb2.FileDescriptorSet:
    """Move package ``old`` to ``new`` (type references follow)."""
    out = descriptor_pb2.FileDescriptorSet()
    out.CopyFrom(fds)
    for f in out.file:
        if f.package == old:
            f.package = new
            f.name = f"{new.replace('.', '/')}/{f.name.rsplit('/', 1)[-1]}"
    names = {f.name for f in fds.file}
    for f, m in _messages(out):
        for fld in m.field:
            if fld.type_name.startswith(f".{old}."):
                fld.type_name = f".{new}." + fld.type_name[len(old) + 2 :]
    for f in out.file:
        for s in f.service:
            for meth in s.method:
                for attr in ("input_type", "output_type"):
                    value = getattr(meth, attr)
                    if value.startswith(f".{old}."):
                        setattr(meth, attr, f".{new}." + value[len(old) + 2 :])
    assert names  # keep dependency names consistent (none cross files here)
    return out


def renumbered(fds: descriptor_pb2.FileDescriptorSet, offset: int = 0) -> descriptor_pb2.FileDescriptorSet:
    """Reverse every message's field numbers (1..n -> n..1), plus ``offset``: wire-compatible
    where types agree, silently wrong when decoded with the original numbers."""
    out = descriptor_pb2.FileDescriptorSet()
    out.CopyFrom(fds)
    for _f, m in _messages(out):
        if m.options.map_entry:
            continue
        numbers = [fld.number for fld in m.field]
        for fld, number in zip(m.field, reversed(numbers), strict=True):
            fld.number = number + offset
    return out


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def respelled(fds: descriptor_pb2.FileDescriptorSet, style: str) -> descriptor_pb2.FileDescriptorSet:
    """Field names as snake_case or PascalCase (json_name left to protoc's rules)."""
    out = descriptor_pb2.FileDescriptorSet()
    out.CopyFrom(fds)
    for _f, m in _messages(out):
        if m.options.map_entry:
            continue
        for fld in m.field:
            fld.name = _snake(fld.name) if style == "snake" else fld.name[0].upper() + fld.name[1:]
            fld.ClearField("json_name")
    return out


def field_renamed(
    fds: descriptor_pb2.FileDescriptorSet, message: str, old: str, new: str
) -> descriptor_pb2.FileDescriptorSet:
    out = descriptor_pb2.FileDescriptorSet()
    out.CopyFrom(fds)
    for _f, m in _messages(out):
        if m.name == message:
            for fld in m.field:
                if fld.name == old:
                    fld.name = new
                    fld.ClearField("json_name")
    return out


def field_removed(fds: descriptor_pb2.FileDescriptorSet, message: str, name: str) -> descriptor_pb2.FileDescriptorSet:
    out = descriptor_pb2.FileDescriptorSet()
    out.CopyFrom(fds)
    for _f, m in _messages(out):
        if m.name == message:
            keep = [fld for fld in m.field if fld.name != name]
            del m.field[:]
            m.field.extend(keep)
    return out


def without_methods(fds: descriptor_pb2.FileDescriptorSet, *methods: str) -> descriptor_pb2.FileDescriptorSet:
    out = descriptor_pb2.FileDescriptorSet()
    out.CopyFrom(fds)
    for f in out.file:
        for s in f.service:
            keep = [m for m in s.method if m.name not in methods]
            del s.method[:]
            s.method.extend(keep)
    return out
