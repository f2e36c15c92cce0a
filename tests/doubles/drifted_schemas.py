"""Drifted schemas for the simulator: the reconstruction's names with other field numbers.

Every field number of the reconstructed proto (``proto/lingjun/``) is a guess (docs/xdm-risks.md): an
XDM that keeps the names but numbers the fields otherwise decodes silently wrong in a client that trusts
the guess. These schemas, built from the reconstruction's descriptors and handed to the product's
``Simulator(..., schema=...)``, make that trap reproducible for the binder's tests:

- ``renumbered``: same packages and names, each listed message's numbers permuted (:data:`RENUMBER`);
- ``foreign``: the same renumbering under packages the plugin does not probe (:data:`FOREIGN_PACKAGES`).
"""

from __future__ import annotations

import functools

from google.protobuf import descriptor_pb2

from nomad_plugin.sim.schema import BUILTIN, ServedSchema, builtin_files, builtin_schema

DRIFTED = ("renumbered", "foreign")
SCHEMAS = (BUILTIN, *DRIFTED)
FOREIGN_PACKAGES = ("ljrk.dp2mgr.v1", "ljrk.controller.v1")  # not among the plugin's probed package names

# message -> field -> served number. Each row is a permutation of that message's
# builtin numbers (one-field messages move instead) (tests/sim/test_schema_modes.py checks it). Comments: what a
# client using the builtin numbers then sees.
# fmt: off
RENUMBER: dict[str, dict[str, int]] = {
    # xpuTypes read as `message` (last type only); xpuTypes empty
    "XPUTypeResponse": {"xpuTypes": 3, "status": 2, "message": 1},
    # minor <- totalCore (100 on every card), uuid <-> pciBusId, model <-> xpuType,
    # health (string) / totalMemory (int64) swap numbers: both clash and vanish
    "Device": {
        "minor": 7, "uuid": 8, "model": 4, "xpuType": 3, "health": 6,
        "totalMemory": 5, "totalCore": 1, "pciBusId": 2, "extenderResources": 9,
    },
    # id (string) lands on devices (message): "Exception deserializing request"
    "AllocateRequest": {"id": 2, "devices": 1, "featureGates": 3, "annotations": 4},
    "DeviceRequest": {"minor": 2, "core": 1, "memory": 4, "slice": 3, "extender": 5},
    # status/message clash (a refusal reads as status 0), envs <-> annotations,
    # devices parsed as Mounts and mounts as AllocatedDevices
    "AllocateResponse": {
        "status": 2, "message": 1, "id": 3, "devices": 6, "envs": 8,
        "mounts": 4, "deviceSpecs": 7, "annotations": 5, "cdiDevices": 9,
    },
    "AllocatedDevice": {"minor": 3, "uuid": 6, "core": 1, "memory": 5, "slice": 4, "migUuid": 2, "extender": 7},
    "Mount": {"containerPath": 2, "hostPath": 1, "readOnly": 3},
    "DeviceSpec": {"containerPath": 2, "hostPath": 1, "permissions": 3},
    # a builtin Release names no id (unknown field 1 is dropped): "empty id"
    "ReleaseRequest": {"id": 2},
    "ReleaseResponse": {"status": 2, "message": 1},
    "ListGpuInfoRequest": {"minors": 2},
    "ListGpuInfoResponse": {"status": 2, "message": 1, "gpuInfos": 3},
    # minor <-> numaNode, uuid <-> pciBusId, model <-> driverVersion,
    # vendor <-> sdkVersion, totalMemory <-> migEnabled (both varints)
    "GpuInfo": {
        "minor": 9, "uuid": 8, "model": 4, "driverVersion": 3, "vendor": 11, "xpuType": 6, "totalMemory": 13,
        "pciBusId": 2, "numaNode": 1, "firmwareVersion": 12, "sdkVersion": 5, "serialNumber": 10, "migEnabled": 7,
    },
    "ExporterDataRequest": {"devices": 2, "metricIds": 1},
    "ExporterDataResponse": {"status": 2, "message": 1, "dataList": 3},
    # device <-> metricName, metricId <-> timestamp (both varints)
    "MetricData": {"device": 5, "metricId": 4, "value": 3, "timestamp": 2, "metricName": 1, "labels": 6},
    # status <- collectIntervalMs: a healthy exporter reads as failing
    "ExporterGetConfigResponse": {"status": 3, "message": 2, "collectIntervalMs": 1, "metricIds": 4, "config": 5},
    "ExporterGetStatusResponse": {
        "status": 1, "message": 6, "running": 3, "state": 2, "lastCollectTimestamp": 5, "version": 4,
    },
    # success/enabled (bool) and message (string) clash: "Runtime Kit disabled"
    "EnableResponse": {"success": 2, "message": 1},
    "DisableResponse": {"success": 2, "message": 1},
    "QueryStatusResponse": {"enabled": 2, "message": 1},
}
# fmt: on


def _drifted(fdp: descriptor_pb2.FileDescriptorProto, package: str) -> descriptor_pb2.FileDescriptorProto:
    """``fdp`` renumbered by :data:`RENUMBER` and moved to ``package`` (type references follow)."""
    out = descriptor_pb2.FileDescriptorProto()
    out.CopyFrom(fdp)
    out.package = package
    old, new = f".{fdp.package}.", f".{package}."

    def retype(name: str) -> str:
        return new + name[len(old) :] if name.startswith(old) else name

    for msg in out.message_type:
        table = RENUMBER.get(msg.name, {})
        for fd in msg.field:
            fd.number = table.get(fd.name, fd.number)
        msg.field.sort(key=lambda f: f.number)  # declared in number order, as protoc would list them
        for fd in [*msg.field, *(f for nested in msg.nested_type for f in nested.field)]:
            if fd.type_name:
                fd.type_name = retype(fd.type_name)
    for method in (m for service in out.service for m in service.method):
        method.input_type, method.output_type = retype(method.input_type), retype(method.output_type)
    return out


@functools.cache
def served_schema(name: str) -> ServedSchema:
    """The (immutable, shared) schema called ``name`` (one of :data:`SCHEMAS`); ValueError if unknown."""
    if name == BUILTIN:
        return builtin_schema()
    if name not in DRIFTED:
        raise ValueError(f"schema: {name!r} is not one of {', '.join(SCHEMAS)}")
    device, config = builtin_files()
    packages = FOREIGN_PACKAGES if name == "foreign" else (device.package, config.package)
    return ServedSchema(name, (_drifted(device, packages[0]), _drifted(config, packages[1])))
