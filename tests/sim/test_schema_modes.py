"""Served schemas: the reconstruction (``xdm-sim``), and the drifted ``renumbered`` and ``foreign`` of
tests/doubles/drifted_schemas.py handed to the same simulator; reflection on/off; ``--emit-schema``.

The trap must be real (a client on the builtin numbers decodes wrong values
without an error) and escapable (a client built from the emitted .proto, the
emitted descriptor set or server reflection decodes every value right).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import grpc
import pytest
from google.protobuf import descriptor_pb2

from nomad_plugin._proto.lingjun import api_outer_pb2 as pb
from nomad_plugin._proto.lingjun import config_service_pb2 as cfg
from nomad_plugin._proto.lingjun import config_service_pb2_grpc as cfg_grpc
from nomad_plugin.sim.control import send_command
from nomad_plugin.sim.schema import CONFIG_FILE, DESCRIPTOR_SET_FILE, DEVICE_FILE, ServedSchema
from tests.doubles.drifted_schemas import FOREIGN_PACKAGES, RENUMBER, SCHEMAS, served_schema
from tests.sim.schema_client import PoolClient, pool_from_descriptor_set, pool_from_reflection, services_in

ROOT = Path(__file__).resolve().parents[2]
CMD = [sys.executable, "-m", "nomad_plugin.cli.main", "xdm-sim"]


def _wait(predicate, what: str, timeout: float = 15.0):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
            if last:
                return last
        except grpc.RpcError as exc:
            last = exc
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


def _clients(pool, sim) -> tuple[PoolClient, PoolClient, grpc.Channel, grpc.Channel]:
    dp = grpc.insecure_channel(f"unix:{sim.dp2mgr_path}")
    cf = grpc.insecure_channel(f"unix:{sim.config_path}")
    (device,) = services_in(pool, [DEVICE_FILE])
    (config,) = services_in(pool, [CONFIG_FILE])
    return PoolClient(dp, device), PoolClient(cf, config), dp, cf


def _check_decodes_right(sim, device: PoolClient, config: PoolClient) -> None:
    """Every value a schema-bound client reads equals the simulator's own truth."""
    cards = {c.minor: c for c in sim.cards}
    listed = device.call("ListAndWatch")
    assert [d.minor for d in listed.devices] == sorted(cards)
    for d in listed.devices:
        card = cards[d.minor]
        assert (d.uuid, d.pciBusId, d.model, d.health) == (card.uuid, card.pci_bus_id, card.model, "Healthy")
        assert d.totalMemory == card.memory_mib and d.totalCore == 100
        json.loads(d.extenderResources["topology"])
    infos = device.call("ListGpuInfo").gpuInfos
    assert [(i.minor, i.uuid, i.totalMemory) for i in infos] == [(c.minor, c.uuid, c.memory_mib) for c in sim.cards]
    assert device.call("ListSupportedXPUType").xpuTypes == ["gpu"]
    req = device.request("Allocate", id="g-schema")
    req.devices.add(minor=2, core=30)
    granted = device.call("Allocate", req)
    assert (granted.status, granted.id, [d.minor for d in granted.devices]) == (0, "g-schema", [2])
    assert granted.devices[0].uuid == cards[2].uuid and granted.devices[0].core == 30
    assert sim.grants()["g-schema"].minors == (2,)
    assert any(s.hostPath == "/dev/nvidia2" for s in granted.deviceSpecs)
    refused = device.call("Allocate", device.request("Allocate", id=""))
    assert refused.status != 0 and refused.message
    assert device.call("Release", device.request("Release", id="g-schema")).status == 0
    assert "g-schema" not in sim.grants()
    assert config.call("QueryStatus").enabled is True
    assert device.call("ExporterGetConfig").collectIntervalMs == sim.options.collect_interval_ms
    assert device.call("ExporterGetStatus").running is True


def field_numbers(schema: ServedSchema) -> dict[str, dict[str, int]]:
    """message -> field -> number in ``schema``, for the messages RENUMBER names."""
    config = ("EnableResponse", "DisableResponse", "QueryStatusResponse")
    return {
        name: {f.name: f.number for f in schema.message_class(name, config=name in config).DESCRIPTOR.fields}
        for name in RENUMBER
    }


def test_renumber_tables_are_permutations_of_the_builtin_numbers():
    builtin = field_numbers(served_schema("builtin"))
    renumbered = field_numbers(served_schema("renumbered"))
    foreign = field_numbers(served_schema("foreign"))
    for name, table in RENUMBER.items():
        assert table.keys() == builtin[name].keys(), name
        if len(table) > 1:
            assert sorted(table.values()) == sorted(builtin[name].values()), name
        else:  # a one-field message can only move
            assert table != builtin[name], name
        assert renumbered[name] == foreign[name] == table, name
    moved = [n for n in RENUMBER if renumbered[n] != builtin[n]]
    assert len(moved) == len(RENUMBER)  # every listed message really changes


@pytest.mark.parametrize("schema", SCHEMAS)
def test_each_mode_decodes_right_with_its_emitted_descriptor_set(make_sim, schema, tmp_path):
    sim, _ = make_sim(schema=schema, control=False)
    sim.schema.emit(tmp_path)
    pool = pool_from_descriptor_set(tmp_path / DESCRIPTOR_SET_FILE)
    device, config, dp, cf = _clients(pool, sim)
    try:
        expected = FOREIGN_PACKAGES[0] if schema == "foreign" else "xdm"
        assert device.service.full_name == f"{expected}.XpuDeviceManagerService"
        _check_decodes_right(sim, device, config)
    finally:
        dp.close()
        cf.close()


def test_builtin_client_on_renumbered_schema_decodes_wrong_values_silently(make_sim):
    sim, c = make_sim(schema="renumbered", control=False)
    cards = {c.minor: c for c in sim.cards}
    devices = next(iter(c.xdm.ListAndWatch(pb.ListAndWatchRequest(), timeout=5))).devices
    assert len(devices) == len(cards)
    for d in devices:
        assert d.minor == 100  # totalCore
        assert d.uuid.startswith("0000:") and d.pciBusId.startswith("GPU-")  # swapped
        assert d.model == "gpu" and d.xpuType.startswith("NVIDIA")
        assert d.health == "" and d.totalMemory == 0  # wire-type clash: gone to unknown fields
    assert {d.pciBusId for d in devices} == {card.uuid for card in cards.values()}
    info = c.xdm.ListGpuInfo(pb.ListGpuInfoRequest(), timeout=5).gpuInfos[3]
    assert info.totalMemory in (0, 1) and info.migEnabled is True  # migEnabled <-> totalMemory (MiB != 0)
    assert info.uuid == cards[3].pci_bus_id
    assert (
        cfg_grpc.AmpConfigServiceStub(c.config_channel).QueryStatus(cfg.QueryStatusRequest(), timeout=5).enabled
        is False
    )
    assert sim.state.enabled is True
    with pytest.raises(grpc.RpcError) as err:
        c.allocate("trap", {"minor": 1})
    assert err.value.code() == grpc.StatusCode.INTERNAL and "deserializing request" in err.value.details()
    assert sim.grants() == {}


def test_builtin_client_finds_no_service_on_foreign_schema(make_sim):
    sim, c = make_sim(schema="foreign", control=False)
    with pytest.raises(grpc.RpcError) as err:
        c.xdm.ListGpuInfo(pb.ListGpuInfoRequest(), timeout=5)
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert sim.schema.device_service == "ljrk.dp2mgr.v1.XpuDeviceManagerService"


@pytest.mark.parametrize("schema", ["renumbered", "foreign"])
def test_reflection_serves_the_served_schema_on_both_sockets(make_sim, schema):
    sim, c = make_sim(schema=schema, reflection=True, control=False)
    dp_pool, cf_pool = pool_from_reflection(c.channel), pool_from_reflection(c.config_channel)
    device = PoolClient(c.channel, dp_pool.FindServiceByName(sim.schema.device_service))
    config = PoolClient(c.config_channel, cf_pool.FindServiceByName(sim.schema.config_service))
    assert dp_pool.FindMessageTypeByName(f"{sim.schema.device_package}.Device").fields_by_name["uuid"].number == 8
    _check_decodes_right(sim, device, config)


def test_reflection_off_answers_unimplemented_and_toggles_live(make_sim):
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

    sim, c = make_sim(schema="renumbered", control=False)
    with pytest.raises(grpc.RpcError) as err:
        ProtoReflectionDescriptorDatabase(c.channel).get_services()
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    sim.set_reflection(True)
    services = ProtoReflectionDescriptorDatabase(c.channel).get_services()
    assert services == ["grpc.reflection.v1alpha.ServerReflection", "xdm.XpuDeviceManagerService"]
    assert ProtoReflectionDescriptorDatabase(c.config_channel).get_services() == [
        "config.AmpConfigService",
        "grpc.reflection.v1alpha.ServerReflection",
    ]
    # the v1 path answers too (same wire format), which the plugin's reflection probe tries second
    v1 = c.channel.stream_stream("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo")
    from grpc_reflection.v1alpha import reflection_pb2

    req = reflection_pb2.ServerReflectionRequest(list_services="").SerializeToString()
    reply = reflection_pb2.ServerReflectionResponse.FromString(next(iter(v1(iter([req]), timeout=5))))
    assert "xdm.XpuDeviceManagerService" in [s.name for s in reply.list_services_response.service]
    sim.set_reflection(False)
    with pytest.raises(grpc.RpcError):
        ProtoReflectionDescriptorDatabase(c.channel).get_services()


def test_restart_comes_back_with_another_schema_and_keeps_grants(make_sim):
    sim, c = make_sim(schema="builtin", control=True)
    assert c.allocate("kept", {"minor": 4}).status == 0
    sim.restart(0.1, schema=served_schema("foreign"), reflection=True)
    with pytest.raises(grpc.RpcError) as err:
        c.xdm.ListGpuInfo(pb.ListGpuInfoRequest(), timeout=5, wait_for_ready=True)
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    channel = grpc.insecure_channel(f"unix:{sim.dp2mgr_path}")
    try:
        pool = _wait(lambda: pool_from_reflection(channel), "reflection after the restart")
        device = PoolClient(channel, pool.FindServiceByName("ljrk.dp2mgr.v1.XpuDeviceManagerService"))
        assert device.call("ListGpuInfo").gpuInfos[4].uuid == sim.cards[4].uuid
        assert "kept" in sim.grants()
        # the control socket does the same for a simulator in another process
        assert send_command(sim.control_path, ["restart", "0.1", "builtin"]) == "ok"
        assert send_command(sim.control_path, ["status"])["schema"] == "builtin"
        assert c.xdm.ListGpuInfo(pb.ListGpuInfoRequest(), timeout=5, wait_for_ready=True).gpuInfos[4].uuid == (
            sim.cards[4].uuid
        )
        with pytest.raises(RuntimeError, match="schema: 'nope'"):
            send_command(sim.control_path, ["restart", "0.1", "nope"])
    finally:
        channel.close()


def test_the_products_control_socket_restarts_into_the_schema_it_serves(make_sim):
    sim, _ = make_sim(control=True)
    with pytest.raises(RuntimeError, match=re.escape("usage: restart [DOWNTIME]")):
        send_command(sim.control_path, ["restart", "0.1", "foreign"])
    assert send_command(sim.control_path, ["restart", "0.1"]) == "ok"
    assert send_command(sim.control_path, ["status"])["schema"] == "builtin"


@pytest.mark.parametrize("schema", SCHEMAS)
def test_emitted_proto_compiles_with_protoc_and_its_generated_client_decodes_right(make_sim, schema, tmp_path):
    """The reconstruction through ``xdm-sim --emit-schema``; a drifted schema through the same ``emit``."""
    emit = tmp_path / "emit"
    if schema == "builtin":
        out = subprocess.run([*CMD, "--emit-schema", str(emit)], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert out.stdout == ""
    else:
        served_schema(schema).emit(emit)
    assert sorted(p.name for p in emit.iterdir()) == sorted([DEVICE_FILE, CONFIG_FILE, DESCRIPTOR_SET_FILE])
    gen = tmp_path / "gen"
    gen.mkdir()
    from grpc_tools import protoc

    args = ["protoc", f"-I{emit}", f"--python_out={gen}", f"--grpc_python_out={gen}",
            f"--descriptor_set_out={tmp_path / 'protoc.pb'}", "--include_imports", DEVICE_FILE, CONFIG_FILE]  # fmt: skip
    assert protoc.main(args) == 0
    # protoc's view of the rendered text equals the emitted descriptor set, field for field
    ours = descriptor_pb2.FileDescriptorSet.FromString((emit / DESCRIPTOR_SET_FILE).read_bytes())
    theirs = descriptor_pb2.FileDescriptorSet.FromString((tmp_path / "protoc.pb").read_bytes())
    assert _numbers(ours) == _numbers(theirs)
    sim, _ = make_sim(schema=schema, control=False)
    script = textwrap.dedent(f"""
        import json, sys, grpc
        sys.path.insert(0, {str(gen)!r})
        import api_outer_pb2 as pb, api_outer_pb2_grpc as pbg, config_service_pb2 as cfg, config_service_pb2_grpc as cfgg
        ch = grpc.insecure_channel("unix:{sim.dp2mgr_path}")
        stub = pbg.XpuDeviceManagerServiceStub(ch)
        devs = next(iter(stub.ListAndWatch(pb.ListAndWatchRequest(), timeout=10))).devices
        g = stub.Allocate(pb.AllocateRequest(id="gen", devices=[pb.DeviceRequest(minor=5, memory=8)]), timeout=10)
        en = cfgg.AmpConfigServiceStub(grpc.insecure_channel("unix:{sim.config_path}")).QueryStatus(
            cfg.QueryStatusRequest(), timeout=10).enabled
        print(json.dumps({{"devices": [[d.minor, d.uuid, d.pciBusId, d.health, d.totalMemory] for d in devs],
                          "granted": [[d.minor, d.memory] for d in g.devices], "status": g.status, "enabled": en}}))
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout)
    assert got["devices"] == [[c.minor, c.uuid, c.pci_bus_id, "Healthy", c.memory_mib] for c in sim.cards]
    assert (got["granted"], got["status"], got["enabled"]) == ([[5, 8]], 0, True)
    assert sim.grants()["gen"].minors == (5,)


def _numbers(fds: descriptor_pb2.FileDescriptorSet) -> dict[tuple[str, str, str], tuple[int, int, int]]:
    return {
        (f.package, m.name, x.name): (x.number, x.type, x.label)
        for f in fds.file
        for m in f.message_type
        for x in m.field
    }


def test_cli_help_and_the_product_serves_the_reconstruction_only(tmp_path):
    out = subprocess.run([*CMD, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    for word in ("--reflection", "--emit-schema", "descriptor_set.pb"):
        assert word in out.stdout, word
    for word in ("--schema", "renumbered", "foreign"):
        assert word not in out.stdout.replace("--emit-schema", ""), word
    bad = subprocess.run([*CMD, "--schema", "renumbered", "--emit-schema", str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert bad.returncode == 2 and "unrecognized arguments: --schema renumbered" in bad.stderr
    assert list(tmp_path.iterdir()) == []


def test_drift_modes_apply_on_top_of_the_served_schema(make_sim):
    """extra-fields / status-shift act on the served message, so the defences can be tested per schema."""
    sim, c = make_sim(schema="renumbered", reflection=True, drift="extra-fields,status-shift", control=False)
    pool = pool_from_reflection(c.channel)
    device = PoolClient(c.channel, pool.FindServiceByName("xdm.XpuDeviceManagerService"))
    from google.protobuf.unknown_fields import UnknownFieldSet

    listed = device.call("ListAndWatch")
    assert listed.devices[1].uuid == sim.cards[1].uuid
    assert {f.field_number for f in UnknownFieldSet(listed.devices[1])} == {1000, 1001}
    refused = device.call("Allocate", device.request("Allocate", id=""))
    assert refused.status == 0 and refused.message == ""  # moved to 15/16: looks like success
    assert {f.field_number for f in UnknownFieldSet(refused)} >= {15, 16}
