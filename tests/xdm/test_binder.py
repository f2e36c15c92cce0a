"""The schema binder: by method and field name, never by number.

Schemas are variants of the reconstruction's own descriptors (tests/xdm/schemas.py);
messages are built with the variant's classes and decoded through the binding,
so a wrong binding shows up as wrong model values.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

from nomad_plugin.config.model import ConfigError
from nomad_plugin.model.card import Card
from nomad_plugin.model.errors import SchemaMismatch
from nomad_plugin.model.grant import DeviceAsk, GrantRequest
from nomad_plugin.xdm import adapter, guesses
from nomad_plugin.xdm.adapter import DriftLog
from nomad_plugin.xdm.binder import Binding, SchemaError, bind, builtin_binding, load_path, normalise
from tests.xdm import schemas

UUID = "GPU-402d47c0-8e22-5632-bbb8-558d37b74095"


def push(binding: Binding, **device: object) -> bytes:
    """A one-card ListAndWatch push serialised with ``binding``'s own classes (its numbers)."""
    response = binding.rpc("ListAndWatch").response
    msg = response.new()
    dev_b = response.child["devices"]
    dev = response.add(msg, "devices")
    assert dev is not None
    values = {"minor": 3, "uuid": UUID, "model": "NVIDIA H800", "xpuType": "gpu", "health": "Healthy"}
    values.update({"totalMemory": 81559, "pciBusId": "0000:18:00.0", **device})
    for key, value in values.items():
        dev_b.set(dev, key, value)
    return msg.SerializeToString()


def decode_card(binding: Binding, data: bytes) -> Card:
    msg = binding.rpc("ListAndWatch").response.cls.FromString(data)
    (card,) = adapter.cards_from_list_and_watch(msg, DriftLog(), binding)
    return card


def test_builtin_binds_to_itself_with_a_full_report() -> None:
    b = builtin_binding()
    assert b.ok and not b.missing_rpcs
    assert all(rpc.path is None for rpc in b.rpcs.values()), "the reconstruction's service names are probed"
    lines = b.report_lines()
    assert "  Device.totalMemory -> xdm.Device.totalMemory #6 int64" in lines
    assert "  AllocateRequest.devices -> xdm.AllocateRequest.devices #2 repeated xdm.DeviceRequest" in lines
    assert lines[-1] == "  verdict: ok"
    assert builtin_binding() is b  # computed once


def test_renumbered_schema_decodes_correctly_where_the_builtin_numbers_would_not() -> None:
    renumbered = bind(schemas.renumbered(schemas.base()), "test")
    assert renumbered.ok
    dev = renumbered.rpc("ListAndWatch").response.child["devices"]
    assert dev.number["minor"] != 1 and dev.number["uuid"] != 2
    data = push(renumbered)
    card = decode_card(renumbered, data)
    assert (card.minor, card.uuid, card.memory_mib, card.healthy, card.pci_bus_id) == (
        3,
        UUID,
        81559,
        True,
        "0000:18:00.0",
    )
    wrong = decode_card(builtin_binding(), data)  # the silent trap the guards must catch
    assert adapter.card_problems([wrong])


def test_foreign_package_gives_the_wire_paths() -> None:
    foreign = schemas.repackaged(schemas.renumbered(schemas.base()), "xdm", "ljrk.dp2mgr.v1")
    b = bind(foreign, "test")
    assert b.ok and all(rpc.path is not None for rpc in b.rpcs.values())
    assert b.rpc("Allocate").path == "/ljrk.dp2mgr.v1.XpuDeviceManagerService/Allocate"
    assert b.rpc("QueryStatus").path == "/config.AmpConfigService/QueryStatus"
    assert decode_card(b, push(b)).uuid == UUID


@pytest.mark.parametrize("style", ["snake", "pascal"])
def test_field_spelling_is_case_and_separator_insensitive(style: str) -> None:
    b = bind(schemas.respelled(schemas.base(), style), style)
    assert b.ok, b.mismatch
    dev = b.rpc("ListAndWatch").response.child["devices"]
    assert dev.name["totalMemory"] == ("total_memory" if style == "snake" else "TotalMemory")
    assert decode_card(b, push(b)).memory_mib == 81559
    assert normalise("total_Memory") == normalise("TotalMemory") == "totalmemory"


def test_alias_table_binds_a_plausible_synonym() -> None:
    b = bind(schemas.field_renamed(schemas.base(), "Device", "totalMemory", "memory_mib"), "test")
    assert b.ok
    row = next(r for r in b.rows if r.model == "Device.totalMemory")
    assert row.bound.startswith("xdm.Device.memory_mib #6") and row.note == "alias"
    assert decode_card(b, push(b)).memory_mib == 81559


def test_unknown_name_is_a_mismatch_until_xdm_field_aliases_names_it() -> None:
    fds = schemas.field_renamed(schemas.base(), "Device", "totalMemory", "vram_size")
    plain = bind(fds, "test")
    assert not plain.ok
    assert "Device.totalMemory" in plain.mismatch_text() and plain.mismatch_text().startswith("XDM schema mismatch: ")
    assert "xdm.Device.vram_size" in plain.unused
    aliased = bind(fds, "test", {"Device.totalMemory": "vram_size"})
    assert aliased.ok
    assert next(r for r in aliased.rows if r.model == "Device.totalMemory").note == "xdm_field_aliases"
    assert decode_card(aliased, push(aliased)).memory_mib == 81559


@pytest.mark.parametrize(
    ("message", "field", "named"),
    [
        ("Device", "uuid", "Device.uuid"),
        ("Device", "health", "Device.health"),
        ("AllocateRequest", "devices", "AllocateRequest.devices"),
        ("AllocateResponse", "status", "AllocateResponse.status"),
        ("ReleaseRequest", "id", "ReleaseRequest.id"),
    ],
)
def test_missing_required_field_is_a_mismatch(message: str, field: str, named: str) -> None:
    b = bind(schemas.field_removed(schemas.base(), message, field), "test")
    assert not b.ok and named in b.mismatch_text()
    assert any(r.model == named and not r.bound for r in b.rows)


def test_envs_or_device_nodes_one_is_enough() -> None:
    one = bind(schemas.field_removed(schemas.base(), "AllocateResponse", "envs"), "test")
    assert one.ok
    both = bind(schemas.field_removed(schemas.field_removed(schemas.base(), "AllocateResponse", "envs"),
                                      "AllocateResponse", "deviceSpecs"), "test")  # fmt: skip
    assert "AllocateResponse.envs or AllocateResponse.deviceSpecs" in both.mismatch_text()


def test_incompatible_type_is_not_bound() -> None:
    fds = schemas.base()
    for f in fds.file:
        for m in f.message_type:
            if m.name == "Device":
                next(x for x in m.field if x.name == "uuid").type = descriptor_pb2.FieldDescriptorProto.TYPE_DOUBLE
    b = bind(fds, "test")
    assert not b.ok
    assert "xdm.Device.uuid is double" in b.mismatch_text()


def test_descriptor_without_the_methods_is_a_mismatch_not_a_crash() -> None:
    b = bind(schemas.without_methods(schemas.base(), "Allocate", "Release"), "test")
    assert not b.ok
    assert "no service has the Allocate RPC" in b.mismatch_text()
    assert "no service has the Release RPC" in b.mismatch_text()
    assert b.missing_rpcs == ["Allocate", "Release"]


def test_streaming_shape_must_match() -> None:
    fds = schemas.base()
    for f in fds.file:
        for s in f.service:
            for m in s.method:
                if m.name == "ListAndWatch":
                    m.server_streaming = False
    assert "the plugin needs server-streaming" in bind(fds, "test").mismatch_text()


def test_binding_is_cached_per_schema_bytes_and_aliases() -> None:
    fds = schemas.renumbered(schemas.base())
    assert bind(fds, "x") is bind(schemas.renumbered(schemas.base()), "x")
    assert bind(fds, "x") is not bind(fds, "x", {"Device.uuid": "uuid"})


def test_requests_are_written_by_name() -> None:
    b = bind(schemas.respelled(schemas.renumbered(schemas.base()), "snake"), "test")
    req = GrantRequest(grant_id="550e8400-e29b-41d4-a716-446655440000", asks=(DeviceAsk(minor=0, core=50),))
    msg = adapter.allocate_request(req, "explicit", b)
    assert msg.id == req.grant_id  # type: ignore[attr-defined]
    (dev,) = msg.devices  # type: ignore[attr-defined]
    assert dev.HasField("minor") and dev.minor == 0 and dev.core == 50


def test_unresolvable_import_is_a_schema_error() -> None:
    fds = schemas.base()
    fds.file[0].dependency.append("vendor/missing.proto")
    with pytest.raises(SchemaError, match=r"vendor/missing\.proto"):
        bind(fds, "test")


# ------------------------------------------------------------------ paths (xdm_schema = "<path>")
def test_proto_file_directory_and_descriptor_set_load(tmp_path: Path) -> None:
    from tests.doubles.drifted_schemas import served_schema

    served_schema("foreign").emit(tmp_path)
    from_dir = bind(load_path(str(tmp_path)), "dir")
    from_set = bind(load_path(str(tmp_path / "descriptor_set.pb")), "set")
    from_file = bind(load_path(str(tmp_path / "api_outer.proto")), "file")
    assert from_dir.ok and from_set.ok and from_file.ok
    assert from_dir.rpc("ListAndWatch").path == from_set.rpc("ListAndWatch").path
    assert from_dir.rpc("ListAndWatch").path.startswith("/ljrk.")  # type: ignore[union-attr]
    assert "QueryStatus" not in from_file.rpcs  # only api_outer.proto: QueryStatus falls back to the reconstruction


def test_bad_paths_name_the_file_and_the_parser_message(tmp_path: Path) -> None:
    from nomad_plugin.backend_select import validate_config
    from nomad_plugin.config.model import PluginConfig

    broken = tmp_path / "api_outer.proto"
    broken.write_text('syntax = "proto3";\nmessage Device { int32 minor = 1 }\n')
    with pytest.raises(ConfigError) as info:
        validate_config(PluginConfig(xdm_schema=str(broken)))
    text = str(info.value)
    assert text.startswith('config option "xdm_schema": ') and str(broken) in text and 'Expected ";"' in text
    with pytest.raises(ConfigError, match="no such file or directory"):
        validate_config(PluginConfig(xdm_schema=str(tmp_path / "nope.proto")))
    junk = tmp_path / "schema.pb"
    junk.write_bytes(b"\xff\x00garbage")
    with pytest.raises(ConfigError, match=r"schema\.pb: not a FileDescriptorSet"):
        validate_config(PluginConfig(xdm_schema=str(junk)))
    validate_config(PluginConfig(xdm_schema="auto"))  # keywords need no file


# ------------------------------------------------------------------ guards
def test_unknown_health_word_is_never_healthy() -> None:
    b = builtin_binding()
    c = decode_card(b, push(b, health="PPU M890P"))
    assert not c.healthy and c.health_reason.startswith(guesses.HEALTH_UNREADABLE)
    assert decode_card(b, push(b, health="HEALTH_OK")).healthy  # an enum-style name still reads


# ------------------------------------------------------------------ the client over a real socket
def test_reflection_binds_a_renumbered_foreign_schema(make_fake, make_client) -> None:
    served = schemas.repackaged(schemas.renumbered(schemas.base()), "xdm", "vendor.private")
    fake = make_fake(package="vendor.private", reflection=["vendor.private.XpuDeviceManagerService"])
    fake.reflection_schema = served
    fake.stop()
    fake.start()
    client = make_client()
    b = client.binding()
    assert (
        b.source == "reflection"
        and b.rpc("ListAndWatch").path == "/vendor.private.XpuDeviceManagerService/ListAndWatch"
    )
    assert b.rpc("ListAndWatch").response.child["devices"].number["minor"] != 1


def test_garbage_reflection_is_a_mismatch_finding_not_a_crash(make_fake, make_client) -> None:
    make_fake(reflection=["xdm.XpuDeviceManagerService"], reflection_garbage=True)
    client = make_client()
    with pytest.raises(SchemaMismatch, match="XDM schema mismatch: server reflection answered garbage"):
        client.list_and_watch()
    with pytest.raises(SchemaMismatch):
        client.allocate(GrantRequest(grant_id="g", asks=(DeviceAsk(minor=0),)))
    assert client.schema_finding().startswith("XDM schema mismatch: ")


def test_reflection_without_the_methods_is_a_mismatch(make_fake, make_client) -> None:
    fake = make_fake(start=False, reflection=["xdm.XpuDeviceManagerService"])
    fake.reflection_schema = schemas.without_methods(schemas.base(), "ListAndWatch")
    fake.start()
    for mode in ("reflection", "auto"):  # a device service without ListAndWatch is XDM's, and wrong
        with pytest.raises(SchemaMismatch, match="no service has the ListAndWatch RPC"):
            make_client(xdm_schema=mode).list_and_watch()


def test_auto_falls_back_when_reflection_describes_no_device_service(make_fake, make_client) -> None:
    make_fake(reflection=["grpc.health.v1.Health"])
    assert make_client().binding().source == "builtin"
    with pytest.raises(SchemaMismatch, match="no service has the ListAndWatch RPC"):
        make_client(xdm_schema="reflection").binding()


def test_reflection_mode_requires_reflection(make_fake, make_client) -> None:
    fake = make_fake()
    with pytest.raises(SchemaMismatch, match="does not serve gRPC server reflection"):
        make_client(xdm_schema="reflection").list_gpu_info()
    assert make_client().binding().source == "builtin"
    assert "Allocate" not in fake.calls


def test_guard_failure_refuses_allocate_before_sending(make_fake, make_client) -> None:
    fake = make_fake()
    fake.devices = [replace_uuid(d, "0000:18:00.0") for d in fake.devices]
    client = make_client()
    sub = client.list_and_watch()
    cards = next(iter(sub))
    sub.cancel()
    assert cards and not any(c.healthy for c in cards)
    assert all(c.health_reason.startswith("XDM schema mismatch: ListAndWatch: ") for c in cards)
    with pytest.raises(SchemaMismatch, match="do not look like UUIDs"):
        client.allocate(GrantRequest(grant_id="g", asks=(DeviceAsk(minor=0),)))
    client.invalidate_binding("connection lost")  # re-bound to the same schema: the finding stands
    with pytest.raises(SchemaMismatch, match="do not look like UUIDs"):
        client.allocate(GrantRequest(grant_id="g", asks=(DeviceAsk(minor=0),)))
    assert "Allocate" not in fake.calls


def replace_uuid(dev, uuid: str):
    out = type(dev)()
    out.CopyFrom(dev)
    out.uuid = uuid
    return out


def test_config_dataclass_keeps_aliases_hashable() -> None:
    from nomad_plugin.config.decode import decode_config
    from nomad_plugin.launcher.config import msgpack_config

    config = decode_config(
        msgpack_config({"xdm_field_aliases": {"Device.totalMemory": "vram"}, "xdm_schema": "builtin"})
    )
    assert config.xdm_field_aliases == (("Device.totalMemory", "vram"),)
    assert hash(replace(config)) == hash(config)
    with pytest.raises(ConfigError, match="xdm_field_aliases"):
        decode_config(msgpack_config({"xdm_field_aliases": {"Device.totalMemory": 3}}))


def test_the_device_service_is_the_one_with_most_device_rpcs() -> None:
    """A kubelet-style DevicePlugin (ListAndWatch + Allocate only) next to XDM's service is not chosen."""
    fds = schemas.base()
    kubelet = fds.file.add()
    kubelet.name = "k8s/deviceplugin.proto"
    kubelet.package = "v1beta1"
    kubelet.syntax = "proto3"
    empty = kubelet.message_type.add()
    empty.name = "Empty"
    svc = kubelet.service.add()
    svc.name = "DevicePlugin"
    for name in ("ListAndWatch", "Allocate"):
        m = svc.method.add()
        m.name, m.input_type, m.output_type = name, ".v1beta1.Empty", ".v1beta1.Empty"
        m.server_streaming = name == "ListAndWatch"
    fds.file.insert(0, fds.file.pop())  # listed first
    b = bind(fds, "test")
    assert b.ok, b.mismatch
    assert b.rpc("ListAndWatch").path == "/xdm.XpuDeviceManagerService/ListAndWatch"
