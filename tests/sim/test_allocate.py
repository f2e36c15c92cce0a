"""Allocate and Release rules (the XDM API reference's, docs/xdm-risks.md), over a real Unix socket."""

from __future__ import annotations

import grpc
import pytest

from nomad_plugin._proto.lingjun import api_outer_pb2 as pb

INVALID_ARGUMENT = grpc.StatusCode.INVALID_ARGUMENT.value[0]
NOT_FOUND = grpc.StatusCode.NOT_FOUND.value[0]
ALREADY_EXISTS = grpc.StatusCode.ALREADY_EXISTS.value[0]
RESOURCE_EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
FAILED_PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION.value[0]


def refused(resp: pb.AllocateResponse, status: int, *words: str) -> None:
    assert resp.status == status, resp
    assert not resp.devices and not resp.envs and not resp.deviceSpecs
    for word in words:
        assert word in resp.message


def test_whole_cards_seed_example(sim_client):
    sim, c = sim_client
    resp = c.allocate("550e8400-e29b-41d4-a716-446655440000", {"minor": 1}, {"minor": 2})
    assert resp.status == 0 and resp.id == "550e8400-e29b-41d4-a716-446655440000"
    assert [d.minor for d in resp.devices] == [1, 2]
    uuids = [d.uuid for d in resp.devices]
    assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(uuids)
    assert "AMP_VGPU_ENABLE" not in resp.envs
    nodes = [d.hostPath for d in resp.deviceSpecs]
    assert nodes == ["/dev/nvidia1", "/dev/nvidia2", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    assert [m.readOnly for m in resp.mounts] == [True]
    grant = sim.grants()["550e8400-e29b-41d4-a716-446655440000"]
    assert grant.minors == (1, 2) and grant.kind == "whole"


def test_tdm_share_envs_and_capacity_sum(sim_client):
    _sim, c = sim_client
    resp = c.allocate("t1", {"minor": 1, "core": 50, "memory": 4})
    assert resp.status == 0
    assert resp.envs["AMP_VGPU_ENABLE"] == "1"
    assert resp.envs["GPU_MEM_PER_DEVICE"] == str(4 * 1024**3)
    assert resp.envs["GPU_UTIL_PER_DEVICE"] == "50"
    assert c.allocate("t2", {"minor": 1, "core": 50, "memory": 4}).status == 0
    refused(c.allocate("t3", {"minor": 1, "core": 1, "memory": 1}), RESOURCE_EXHAUSTED, "core", "100")


def test_memory_capacity_per_card(sim_client):
    _, c = sim_client  # H800: 81559 MiB -> 79 GiB
    assert c.allocate("m1", {"minor": 0, "core": 10, "memory": 70}).status == 0
    refused(c.allocate("m2", {"minor": 0, "core": 10, "memory": 10}), RESOURCE_EXHAUSTED, "memory", "79 GiB")
    assert c.allocate("m3", {"minor": 0, "core": 10, "memory": 9}).status == 0


@pytest.mark.parametrize("core", [-1, 101])
def test_core_out_of_range(sim_client, core):
    _, c = sim_client
    refused(c.allocate("c", {"minor": 0, "core": core}), INVALID_ARGUMENT, "core", str(core))


@pytest.mark.parametrize("slice_", [5, 6, 8, -1])
def test_slice_not_allowed(sim_client, slice_):
    _, c = sim_client
    refused(c.allocate("s", {"minor": 0, "slice": slice_}), INVALID_ARGUMENT, "slice", str(slice_))


def test_memory_negative_and_over_card(sim_client):
    _, c = sim_client
    refused(c.allocate("n", {"minor": 0, "core": 10, "memory": -1}), INVALID_ARGUMENT, "memory", "negative")
    refused(c.allocate("o", {"minor": 0, "core": 10, "memory": 80}), INVALID_ARGUMENT, "memory", "80 GiB")


def test_memory_over_mig_profile(sim_client):
    _, c = sim_client  # 1-slice profile on 79 GiB card = 9 GiB
    refused(c.allocate("mp", {"minor": 0, "slice": 1, "memory": 10}), INVALID_ARGUMENT, "MIG", "9 GiB")


def test_heterogeneous_request(sim_client):
    _, c = sim_client
    refused(
        c.allocate("h", {"minor": 0, "core": 50, "memory": 4}, {"minor": 1, "core": 40, "memory": 4}),
        INVALID_ARGUMENT,
        "homogeneous",
    )


def test_core_with_slice_in_one_element(sim_client):
    _, c = sim_client
    refused(c.allocate("cs", {"minor": 0, "core": 50, "slice": 3}), INVALID_ARGUMENT, "mixed")


def test_mig_seed_example_slice_plus_memory_is_valid(sim_client):
    sim, c = sim_client
    resp = c.allocate("550e8400-e29b-41d4-a716-446655440004", {"minor": 1, "slice": 3, "memory": 4})
    assert resp.status == 0
    dev = resp.devices[0]
    assert (dev.minor, dev.slice, dev.memory) == (1, 3, 4) and dev.migUuid.startswith("MIG-")
    assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == dev.migUuid
    assert sim.grants()[resp.id].kind == "mig"


def test_tdm_then_mig_on_same_card(sim_client):
    _, c = sim_client
    assert c.allocate("t", {"minor": 2, "core": 30}).status == 0
    refused(c.allocate("m", {"minor": 2, "slice": 1}), FAILED_PRECONDITION, "TDM and MIG")


def test_mig_then_tdm_on_same_card(sim_client):
    _, c = sim_client
    assert c.allocate("m", {"minor": 2, "slice": 2}).status == 0
    refused(c.allocate("t", {"minor": 2, "core": 30}), FAILED_PRECONDITION, "TDM and MIG")


def test_mig_on_non_mig_model(make_sim):
    _, c = make_sim("l20-8")
    refused(c.allocate("m", {"minor": 0, "slice": 1}), FAILED_PRECONDITION, "NVIDIA L20", "MIG")


def test_mig_on_ppu_refused(make_sim):
    _, c = make_sim("m890p-8")
    refused(c.allocate("m", {"minor": 0, "slice": 7}), FAILED_PRECONDITION, "MIG")


def test_whole_card_blocks_everything(sim_client):
    _, c = sim_client
    assert c.allocate("w", {"minor": 3}).status == 0
    refused(c.allocate("t", {"minor": 3, "core": 10}), RESOURCE_EXHAUSTED, "held whole", "w")
    refused(c.allocate("w2", {"minor": 3}), RESOURCE_EXHAUSTED, "held whole")


def test_whole_card_refused_when_card_has_a_share(sim_client):
    _, c = sim_client
    assert c.allocate("t", {"minor": 3, "core": 10}).status == 0
    refused(c.allocate("w", {"minor": 3}), RESOURCE_EXHAUSTED, "whole card needs it free")


def test_slices_sum_to_seven(make_sim):
    _, c = make_sim("a100-8", mig_placement=False)
    assert c.allocate("a", {"minor": 0, "slice": 4}).status == 0
    assert c.allocate("b", {"minor": 0, "slice": 3}).status == 0
    refused(c.allocate("c", {"minor": 0, "slice": 1}), RESOURCE_EXHAUSTED, "slices")


def test_mig_placement_rules(make_sim):
    _, c = make_sim("a100-8")  # two 3g take all memory eighths: a 1g no longer fits
    assert c.allocate("a", {"minor": 0, "slice": 3}).status == 0
    assert c.allocate("b", {"minor": 0, "slice": 3}).status == 0
    refused(c.allocate("c", {"minor": 0, "slice": 1}), RESOURCE_EXHAUSTED, "placement")


def test_unknown_minor(sim_client):
    _, c = sim_client
    refused(c.allocate("u", {"minor": 8}), NOT_FOUND, "no card 8")


def test_duplicate_minor(sim_client):
    _, c = sim_client
    refused(c.allocate("d", {"minor": 1}, {"minor": 1}), INVALID_ARGUMENT, "more than once")


def test_unhealthy_card(sim_client):
    sim, c = sim_client
    sim.set_health(4, False, "XID 79")
    refused(c.allocate("h", {"minor": 4, "core": 10}), FAILED_PRECONDITION, "unhealthy")


def test_duplicate_id_rejected_by_default(sim_client):
    _, c = sim_client
    assert c.allocate("dup", {"minor": 0, "core": 10}).status == 0
    refused(c.allocate("dup", {"minor": 0, "core": 10}), ALREADY_EXISTS, "dup")


def test_duplicate_id_idempotent(make_sim):
    sim, c = make_sim(duplicate_id_mode="idempotent")
    first = c.allocate("dup", {"core": 10})
    again = c.allocate("dup", {"core": 10})
    assert again.status == 0 and again.devices[0].minor == first.devices[0].minor
    assert len(sim.grants()) == 1
    refused(c.allocate("dup", {"core": 20}), ALREADY_EXISTS)


def test_empty_id(sim_client):
    _, c = sim_client
    refused(c.allocate("", {"minor": 0}), INVALID_ARGUMENT, "id")


def test_auto_assign_lowest_healthy_fitting_card(sim_client):
    sim, c = sim_client
    assert c.allocate("w0", {"minor": 0}).status == 0
    sim.set_health(1, False, "")
    resp = c.allocate("auto", {"core": 20, "memory": 2}, {"core": 20, "memory": 2})
    assert resp.status == 0 and [d.minor for d in resp.devices] == [2, 3]
    assert sim.grants()["auto"].minors == (2, 3)


def test_auto_assign_nothing_fits(make_sim):
    _, c = make_sim("l20-8")
    refused(c.allocate("a", {"slice": 1}), FAILED_PRECONDITION, "auto-assign")


@pytest.mark.parametrize("devices", [(), ({},)])
def test_cpu_container(sim_client, devices):
    sim, c = sim_client
    resp = c.allocate("cpu", *devices, annotations={"job": "x"})
    assert resp.status == 0 and resp.id == "cpu"
    assert not resp.devices and not resp.envs and not resp.deviceSpecs
    assert dict(resp.annotations) == {"job": "x"}
    assert sim.grants()["cpu"].kind == "cpu"


def test_atomic_failure_grants_nothing(sim_client):
    sim, c = sim_client
    assert c.allocate("w5", {"minor": 5}).status == 0
    refused(c.allocate("pair", {"minor": 4}, {"minor": 5}), RESOURCE_EXHAUSTED)
    assert set(sim.grants()) == {"w5"}
    assert c.allocate("w4", {"minor": 4}).status == 0  # card 4 was not taken by the failed request


def test_annotations_echoed_and_style_annotations(make_sim):
    _, c = make_sim(style="annotations")
    resp = c.allocate("an", {"minor": 1, "core": 25, "memory": 8}, annotations={"nomad/alloc": "abc"})
    assert resp.status == 0 and not resp.envs and not resp.deviceSpecs and not resp.mounts
    ann = dict(resp.annotations)
    assert ann["nomad/alloc"] == "abc"
    assert ann["xdm.amp.com/allocation-id"] == "an"
    assert ann["xdm.amp.com/devices"] == resp.devices[0].uuid
    assert (ann["xdm.amp.com/core"], ann["xdm.amp.com/memory"]) == ("25", "8")
    assert all(k.startswith("xdm.amp.com/") for k in ann if k != "nomad/alloc")


def test_style_both(make_sim):
    _, c = make_sim(style="both")
    resp = c.allocate("b", {"minor": 1})
    assert resp.envs["NVIDIA_VISIBLE_DEVICES"] and resp.annotations["xdm.amp.com/allocation-id"] == "b"


def test_ppu_device_nodes(make_sim):
    _, c = make_sim("810e-16")
    resp = c.allocate("p", {"minor": 3})
    assert [d.hostPath for d in resp.deviceSpecs] == ["/dev/alixpu", "/dev/alixpu_ctl"]
    assert resp.devices[0].uuid.startswith("PPU-")


def test_error_mode_grpc(make_sim):
    sim, c = make_sim(error_mode="grpc")
    with pytest.raises(grpc.RpcError) as err:
        c.allocate("g", {"minor": 99})
    assert err.value.code() == grpc.StatusCode.NOT_FOUND and "no card 99" in err.value.details()
    sim.set_choice("error_mode", "inband")
    refused(c.allocate("g", {"minor": 99}), NOT_FOUND)


def test_disabled_refuses_allocate(sim_client):
    sim, c = sim_client
    sim.set_enabled(False)
    refused(c.allocate("x", {"minor": 0}), FAILED_PRECONDITION, "disabled")
    sim.set_enabled(True)
    assert c.allocate("x", {"minor": 0}).status == 0


def test_disabled_effect_none(make_sim):
    sim, c = make_sim(disabled_effect="none")
    sim.set_enabled(False)
    assert c.allocate("x", {"minor": 0}).status == 0


# ---------------------------------------------------------------- Release


def test_release_frees_capacity(sim_client):
    sim, c = sim_client
    assert c.allocate("r", {"minor": 0}).status == 0
    resp = c.xdm.Release(pb.ReleaseRequest(id="r"), timeout=5)
    assert resp.status == 0 and resp.SerializeToString() == b""  # the seed's {"status": 0, "message": ""}
    assert "r" not in sim.grants()
    assert c.allocate("r2", {"minor": 0}).status == 0


def test_release_unknown_not_found_by_default(sim_client):
    sim, c = sim_client
    resp = c.xdm.Release(pb.ReleaseRequest(id="nope"), timeout=5)
    assert resp.status == NOT_FOUND and "nope" in resp.message
    sim.set_choice("release_unknown", "ok")
    assert c.xdm.Release(pb.ReleaseRequest(id="nope"), timeout=5).status == 0


def test_release_after_card_went_unhealthy(sim_client):
    sim, c = sim_client
    assert c.allocate("u", {"minor": 6, "core": 10}).status == 0
    sim.set_health(6, False, "XID 48")
    assert c.xdm.Release(pb.ReleaseRequest(id="u"), timeout=5).status == 0
    assert sim.grants() == {}


def test_release_after_card_removed(sim_client):
    sim, c = sim_client
    assert c.allocate("g", {"minor": 7}).status == 0
    sim.remove_device(7)
    assert c.xdm.Release(pb.ReleaseRequest(id="g"), timeout=5).status == 0


def _release(c, gid: str) -> None:
    assert c.xdm.Release(pb.ReleaseRequest(id=gid), timeout=5).status == 0


def test_each_release_gives_back_exactly_its_part_of_the_card(make_sim):
    """Every kind of grant, released, gives back exactly what it held on the card."""
    _, c = make_sim("a100-8")
    # tdm: two shares; releasing one frees its core and memory only.
    assert c.allocate("t1", {"minor": 1, "core": 60, "memory": 10}).status == 0
    assert c.allocate("t2", {"minor": 1, "core": 40, "memory": 10}).status == 0
    refused(c.allocate("t3", {"minor": 1, "core": 1, "memory": 1}), RESOURCE_EXHAUSTED, "core 100%")
    _release(c, "t1")
    refused(c.allocate("t3", {"minor": 1, "core": 61}), RESOURCE_EXHAUSTED, "core 40%")
    assert c.allocate("t3", {"minor": 1, "core": 60, "memory": 10}).status == 0
    refused(c.allocate("m", {"minor": 1, "slice": 1}), FAILED_PRECONDITION, "time-division")
    _release(c, "t2")
    _release(c, "t3")
    # Empty again: MIG is allowed; two 3g fill the eighths, releasing one frees its slices and eighths.
    assert c.allocate("m1", {"minor": 1, "slice": 3}).status == 0
    assert c.allocate("m2", {"minor": 1, "slice": 3}).status == 0
    refused(c.allocate("m3", {"minor": 1, "slice": 1}), RESOURCE_EXHAUSTED, "placement")
    _release(c, "m1")
    assert c.allocate("m3", {"minor": 1, "slice": 4}).status == 0  # fits only in what m1 gave back
    refused(c.allocate("m4", {"minor": 1, "slice": 1}), RESOURCE_EXHAUSTED, "7 of 7 MIG slices used")
    refused(c.allocate("t", {"minor": 1, "core": 10}), FAILED_PRECONDITION, "MIG grants")
    _release(c, "m2")
    _release(c, "m3")
    # Empty again: a whole card, and after its release a share.
    assert c.allocate("w", {"minor": 1}).status == 0
    refused(c.allocate("t", {"minor": 1, "core": 10}), RESOURCE_EXHAUSTED, "held whole by allocation w")
    _release(c, "w")
    assert c.allocate("t", {"minor": 1, "core": 10}).status == 0
    refused(c.allocate("w", {"minor": 1}), RESOURCE_EXHAUSTED, "1 allocation(s)")
