"""Nomad device IDs -> one GrantRequest: every mapping and every rejection."""

from __future__ import annotations

import pytest

from nomad_plugin.model.errors import ReservationRejected
from nomad_plugin.model.grant import DeviceAsk
from nomad_plugin.model.instances import Instance, InstanceGroup, Kind, mig_unit_id, share_id
from nomad_plugin.nomad.reserve import plan_request
from tests.doubles.reserve_fakes import card_uuid, catalog, mig_group, share_group, whole_group

CAT = catalog(whole_group(4), share_group([4, 5]), mig_group([6, 7]))


def test_whole_cards_one_ask_per_card_in_minor_order():
    plan = plan_request([card_uuid(2), card_uuid(0)], CAT)
    assert plan.kind is Kind.WHOLE
    assert plan.asks == (DeviceAsk(minor=0), DeviceAsk(minor=2))
    assert [i.id for i in plan.instances] == [card_uuid(2), card_uuid(0)]
    assert str(plan.group) == "alibaba/ppu/PPU 810E"


def test_k_shares_of_one_card_make_one_ask_with_summed_core_and_memory():
    ids = [share_id(card_uuid(4), i) for i in (0, 3, 7)]
    plan = plan_request(ids, CAT)
    assert plan.asks == (DeviceAsk(minor=4, core=30, memory_gib=27),)
    assert plan.card_uuids == (card_uuid(4),)


def test_equal_shares_on_two_cards():
    ids = [share_id(card_uuid(4), 0), share_id(card_uuid(5), 1)]
    plan = plan_request(ids, CAT)
    assert plan.asks == (DeviceAsk(4, 10, 9), DeviceAsk(5, 10, 9))


def test_all_shares_of_a_card_cap_core_at_100():
    g = InstanceGroup(
        share_group([0]).key,
        tuple(Instance(share_id("C", i), Kind.SHARE, "C", 0, i, 34, 1) for i in range(3)),
    )
    assert plan_request([share_id("C", i) for i in range(3)], catalog(g)).asks == (DeviceAsk(0, 100, 3),)


@pytest.mark.parametrize("k", [1, 2, 3, 4, 7])
def test_k_mig_units_become_k_slices(k):
    ids = [mig_unit_id(card_uuid(6, "GPU"), i) for i in range(k)]
    assert plan_request(ids, CAT).asks == (DeviceAsk(minor=6, slices=k, memory_gib=10 * k),)


@pytest.mark.parametrize("k", [5, 6])
def test_mig_slice_count_outside_xdm_set_is_rejected(k):
    ids = [mig_unit_id(card_uuid(6, "GPU"), i) for i in range(k)]
    with pytest.raises(ReservationRejected, match=rf"{k} MIG units .* 1, 2, 3, 4 or 7"):
        plan_request(ids, CAT)


def test_unknown_ids_are_named():
    with pytest.raises(ReservationRejected, match="nope-1, nope-2 are not in this node's last fingerprint"):
        plan_request([card_uuid(0), "nope-1", "nope-2"], CAT)


def test_ids_from_several_groups_rejected():
    with pytest.raises(ReservationRejected, match="several device groups"):
        plan_request([card_uuid(0), share_id(card_uuid(4), 0)], CAT)


def test_heterogeneous_shares_rejected_with_per_card_amounts():
    ids = [share_id(card_uuid(4), 0), share_id(card_uuid(4), 1), share_id(card_uuid(5), 0)]
    with pytest.raises(ReservationRejected, match=r"heterogeneous .*card 4: 20% compute.*card 5: 10% compute"):
        plan_request(ids, CAT)


def test_heterogeneous_mig_rejected():
    ids = [
        mig_unit_id(card_uuid(6, "GPU"), 0),
        mig_unit_id(card_uuid(6, "GPU"), 1),
        mig_unit_id(card_uuid(7, "GPU"), 0),
    ]
    with pytest.raises(ReservationRejected, match="heterogeneous"):
        plan_request(ids, CAT)


def test_mixed_kinds_in_one_group_rejected():
    whole = whole_group(1)
    g = InstanceGroup(whole.key, (*whole.instances, Instance("S", Kind.SHARE, "X", 9, 0, 10, 1)))
    with pytest.raises(ReservationRejected, match="mixes instance kinds"):
        plan_request([card_uuid(0), "S"], catalog(g))


def test_duplicate_id_rejected():
    with pytest.raises(ReservationRejected, match="more than once"):
        plan_request([card_uuid(0), card_uuid(0)], CAT)


def test_existing_mig_instances_one_ask_each():
    g = InstanceGroup(
        mig_group([0]).key,
        (
            Instance("MIG-a", Kind.MIG_INSTANCE, "G0", 0, 0, 0, 20, 2, mig_uuid="MIG-a"),
            Instance("MIG-b", Kind.MIG_INSTANCE, "G1", 1, 0, 0, 20, 2, mig_uuid="MIG-b"),
        ),
    )
    assert plan_request(["MIG-a", "MIG-b"], catalog(g)).asks == (
        DeviceAsk(0, 0, 20, 2, mig_uuid="MIG-a"),
        DeviceAsk(1, 0, 20, 2, mig_uuid="MIG-b"),
    )


@pytest.mark.parametrize(
    ("ids", "message"),
    [
        (
            [card_uuid(0), "nope-1"],
            "device ID(s) nope-1 are not in this node's last fingerprint "
            "(the devices changed since the job was placed; Nomad will reschedule it)",
        ),
        (
            [card_uuid(0), share_id(card_uuid(4), 0)],
            "device IDs come from several device groups (alibaba/ppu/PPU 810E, alibaba/ppu/PPU 810E share); "
            "one device block is always filled from one group",
        ),
        (
            [mig_unit_id(card_uuid(6, "GPU"), i) for i in range(5)],
            "5 MIG units on card GPU-0006-aaaa-bbbb (minor 6): XDM accepts 1, 2, 3, 4 or 7 slices per card; "
            "use a device count of 1, 2, 3, 4 or 7",
        ),
        (
            [share_id(card_uuid(4), 0), share_id(card_uuid(4), 1), share_id(card_uuid(5), 0)],
            "heterogeneous request in alibaba/ppu/PPU 810E share: card 4: 20% compute, 18 GiB, "
            "card 5: 10% compute, 9 GiB. XDM grants only equal amounts on every card; "
            "ask for a count that fits on one card, or whole cards",
        ),
        (
            [
                mig_unit_id(card_uuid(6, "GPU"), 0),
                mig_unit_id(card_uuid(6, "GPU"), 1),
                mig_unit_id(card_uuid(7, "GPU"), 0),
            ],
            "heterogeneous request in nvidia/gpu/H800 mig: card 6: 2 slices, card 7: 1 slices. "
            "XDM grants only equal amounts on every card; ask for a count that fits on one card, or whole cards",
        ),
    ],
)
def test_rejections_in_full(ids, message):
    with pytest.raises(ReservationRejected) as err:
        plan_request(ids, CAT)
    assert str(err.value) == message


def test_mixed_kinds_message_in_full():
    whole = whole_group(1)
    g = InstanceGroup(
        whole.key,
        (*whole.instances, Instance("S", Kind.SHARE, "X", 9, 0, 10, 1), Instance("M", Kind.MIG, "X", 8, 0, 0, 1, 1)),
    )
    with pytest.raises(ReservationRejected) as err:
        plan_request([card_uuid(0), "S", "M"], catalog(g))
    assert str(err.value) == (
        "device group alibaba/ppu/PPU 810E mixes instance kinds (mig, share, whole); a request must be one kind"
    )


def test_existing_mig_instance_without_a_uuid_is_asked_by_its_id_as_nvml_made_it():
    key = mig_group([0]).key
    g = catalog(InstanceGroup(key, (Instance("MIG-x", Kind.MIG_INSTANCE, "G0", 0, 0, 0, 20, 2),)))
    assert plan_request(["MIG-x"], g).asks == (DeviceAsk(0, 0, 20, 2, mig_uuid="MIG-x"),)
    # An existing instance is not an XDM slice request: its slice count is a fact, not a size to check.
    odd = catalog(InstanceGroup(key, (Instance("MIG-y", Kind.MIG_INSTANCE, "G0", 0, 0, 0, 20, 5),)))
    assert plan_request(["MIG-y"], odd).asks == (DeviceAsk(0, 0, 20, 5, mig_uuid="MIG-y"),)


def test_find_answers_every_instance_with_its_group_and_nothing_else():
    for group in CAT.groups:
        for inst in group.instances:
            assert CAT.find(inst.id) == (group, inst)
    assert CAT.find("GPU-not-there") is None
    assert CAT.find("") is None
    smaller = catalog(whole_group(2))
    assert smaller.find(card_uuid(0)) == (smaller.groups[0], smaller.groups[0].instances[0])
    assert smaller.find(card_uuid(3)) is None, "an instance of another catalog was found"
