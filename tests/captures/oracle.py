"""A bundle's answers decoded with the bundle's own reflected schema: the oracle the binder's replay
is compared with (it binds nothing, so it cannot share the binder's mistakes)."""

from __future__ import annotations

from google.protobuf import message_factory
from google.protobuf.message import Message

from nomad_plugin.xdm.binder import pool_from_set
from nomad_plugin.xdm.capture import CaptureBundle


def decode(bundle: CaptureBundle, rpc: str) -> Message | None:
    """``rpc``'s response decoded with the reflected schema of its socket (None without reflection)."""
    entry = bundle.call(rpc)
    fds = bundle.descriptor_set(entry["socket"])
    data = bundle.raw(rpc)
    if fds is None or data is None or not entry.get("path"):
        return None
    method = pool_from_set(fds).FindServiceByName(entry["path"].split("/")[1]).methods_by_name[rpc]
    return message_factory.GetMessageClass(method.output_type).FromString(data)
