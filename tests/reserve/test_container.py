"""Grant -> ContainerReservation: env mapping and validation of everything XDM returns."""

from __future__ import annotations

import pytest

from nomad_plugin.model.grant import DeviceNode, Grant, GrantedDevice, MountSpec
from nomad_plugin.model.instances import GroupKey, Instance, Kind
from nomad_plugin.nomad.container import GrantRejected, annotation_env_name, build_container, check_path

PPU = GroupKey("alibaba", "ppu", "PPU 810E")
NV = GroupKey("nvidia", "gpu", "H800")
WHOLE = [Instance("U1", Kind.WHOLE, "U1", 1), Instance("U2", Kind.WHOLE, "U2", 2)]
NODES = (DeviceNode("/dev/alixpu1", "/dev/alixpu1"),)


def grant(**kw):
    base = {"grant_id": "g-1", "devices": (GrantedDevice(1, "U1"), GrantedDevice(2, "U2")), "device_nodes": NODES}
    base.update(kw)
    return Grant(**base)


def nv_grant(**kw):
    """A grant on NVIDIA cards: no PPU device nodes (the family rule would refuse them)."""
    return grant(**{"device_nodes": (), **kw})


def never(_path: str) -> bool:
    return False


def test_ppu_whole_cards_env():
    spec = build_container(grant(), WHOLE, PPU, path_exists=never)
    assert spec.envs["LINGJUN_GRANT_ID"] == "g-1"
    assert spec.envs["LINGJUN_DEVICE_IDS"] == "U1,U2"
    assert spec.envs["LINGJUN_DEVICE_MINORS"] == "1,2"
    assert spec.envs["LINGJUN_CARD_UUIDS"] == "U1,U2"
    assert spec.envs["LINGJUN_MODE"] == "whole"
    assert spec.envs["LINGJUN_CORE_LIMIT_PERCENT"] == "100"
    assert spec.envs["LINGJUN_MEMORY_LIMIT_GIB"] == "0"
    assert spec.envs["PPU_VISIBLE_DEVICES"] == "1,2"
    assert "NVIDIA_VISIBLE_DEVICES" not in spec.envs  # would switch docker to the nvidia runtime
    assert spec.devices == NODES


def test_nvidia_uses_nvidia_visible_devices_and_mig_uuids():
    insts = [Instance(f"G-mig-{i}", Kind.MIG, "G", 3, i, 0, 10, 1) for i in range(3)]
    g = grant(devices=(GrantedDevice(3, "G", 0, 30, 3, "MIG-xyz"),), device_nodes=())
    spec = build_container(g, insts, NV, path_exists=never)
    assert spec.envs["NVIDIA_VISIBLE_DEVICES"] == "MIG-xyz"
    assert spec.envs["LINGJUN_MIG_SLICES"] == "3"
    assert spec.envs["LINGJUN_MEMORY_LIMIT_GIB"] == "30"
    assert "PPU_VISIBLE_DEVICES" not in spec.envs


def test_share_limits_from_grant():
    insts = [Instance(f"U1-share-{i}", Kind.SHARE, "U1", 1, i, 10, 9) for i in range(3)]
    g = grant(devices=(GrantedDevice(1, "U1", 30, 27),))
    spec = build_container(g, insts, PPU, path_exists=never)
    assert (spec.envs["LINGJUN_CORE_LIMIT_PERCENT"], spec.envs["LINGJUN_MEMORY_LIMIT_GIB"]) == ("30", "27")
    assert spec.envs["LINGJUN_MODE"] == "tdm"


def test_xdm_envs_pass_through_but_cannot_override_plugin_envs():
    g = grant(envs={"AMP_VGPU_ENABLE": "1", "PPU_VISIBLE_DEVICES": "U2,U1", "LINGJUN_GRANT_ID": "evil"})
    spec = build_container(g, WHOLE, PPU, path_exists=never)
    assert spec.envs["AMP_VGPU_ENABLE"] == "1"
    assert spec.envs["PPU_VISIBLE_DEVICES"] == "U2,U1"  # XDM knows its runtime's format best (UUIDs or minors)
    assert spec.envs["LINGJUN_GRANT_ID"] == "g-1"


# --- the Reserve content policy (docs/reserve.md, "What XDM may hand a task") ----------------------
def rejected_rule(g, group=PPU, policy=None, instances=WHOLE) -> str:
    from nomad_plugin.nomad.container import ReservePolicy

    with pytest.raises(GrantRejected) as err:
        build_container(g, instances, group, path_exists=never, policy=policy or ReservePolicy(data_dir="/var/lib/x"))
    assert len(str(err.value)) < 600, "an error text stays short whatever XDM sent"
    return err.value.rule


@pytest.mark.parametrize(
    "envs",
    [
        {"LD_PRELOAD": "/tmp/evil.so"},
        {"LD_LIBRARY_PATH": "/opt/x"},
        {"PATH": "/tmp/bin"},
        {"NOMAD_ALLOC_DIR": "/etc"},
        {"NOMAD_TOKEN": "x"},
    ],
)
def test_protected_env_is_a_violation(envs):
    assert rejected_rule(grant(envs=envs)) == "env"


@pytest.mark.parametrize("key", ["LD_PRELOAD", "PATH", "nomad.alloc/dir"])
def test_protected_env_through_an_annotation_is_a_violation(key):
    assert rejected_rule(grant(annotations={key: "/etc"})) == "env"


def test_the_operator_may_allow_a_protected_name():
    from nomad_plugin.nomad.container import ReservePolicy

    policy = ReservePolicy(env_allow=frozenset({"LD_LIBRARY_PATH"}))
    spec = build_container(grant(envs={"LD_LIBRARY_PATH": "/usr/local/PPU_SDK/lib"}), WHOLE, PPU, policy=policy)
    assert spec.envs["LD_LIBRARY_PATH"] == "/usr/local/PPU_SDK/lib"
    assert rejected_rule(grant(envs={"LD_PRELOAD": "x"}), policy=policy) == "env"


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("NVIDIA_VISIBLE_DEVICES", "all"),
        ("NVIDIA_VISIBLE_DEVICES", "U1"),  # one of two granted cards
        ("NVIDIA_VISIBLE_DEVICES", "U1,U2,U3"),
        ("NVIDIA_VISIBLE_DEVICES", "none"),
        ("PPU_VISIBLE_DEVICES", "1,2,3"),
        ("NVIDIA_MIG_CONFIG_DEVICES", "all"),
    ],
)
def test_visibility_variables_name_exactly_the_granted_cards(key, value):
    assert rejected_rule(nv_grant(envs={key: value}), NV) == "visibility"


def test_visibility_by_minor_uuid_or_mig_uuid_passes():
    for value in ("U1,U2", "1,2", "2,U1"):
        assert build_container(nv_grant(envs={"NVIDIA_VISIBLE_DEVICES": value}), WHOLE, NV, path_exists=never)
    mig = nv_grant(devices=(GrantedDevice(1, "U1", 0, 10, 1, "MIG-a"),), device_nodes=())
    insts = [Instance("U1-mig-0", Kind.MIG, "U1", 1, 0, 0, 10, 1)]
    spec = build_container(mig, insts, NV, path_exists=never)
    assert spec.envs["NVIDIA_VISIBLE_DEVICES"] == "MIG-a"
    assert rejected_rule(nv_grant(devices=mig.devices, envs={"NVIDIA_VISIBLE_DEVICES": "MIG-b"}), NV, None, insts)


@pytest.mark.parametrize(
    "node",
    [
        DeviceNode("/dev/sda", "/dev/sda"),
        DeviceNode("/dev/mem", "/dev/mem"),
        DeviceNode("/dev/alixpu3", "/dev/alixpu3"),  # a card that was not granted
        DeviceNode("/dev/nvidia1", "/dev/nvidia1"),  # another family's node on a PPU grant
        DeviceNode("/dev/sda", "/dev/alixpu1"),  # a granted card's node, shown as a disk in the task
    ],
)
def test_device_nodes_only_of_the_family_and_the_granted_cards(node):
    assert rejected_rule(grant(device_nodes=(node,))) == "device"


def test_device_nodes_of_the_family_pass():
    ppu = (DeviceNode("/dev/alixpu", "/dev/alixpu"), DeviceNode("/dev/alixpu_ctl", "/dev/alixpu_ctl"), *NODES)
    assert build_container(grant(device_nodes=ppu), WHOLE, PPU, path_exists=never).devices == ppu
    nv = tuple(
        DeviceNode(p, p) for p in ("/dev/nvidia1", "/dev/nvidia2", "/dev/nvidiactl", "/dev/nvidia-caps/nvidia-cap12")
    )
    assert build_container(grant(device_nodes=nv), WHOLE, NV, path_exists=never).devices == nv
    renamed = (DeviceNode("/dev/alixpu0", "/dev/alixpu2"),)  # a granted card, numbered from 0 in the task
    assert build_container(grant(device_nodes=renamed), WHOLE, PPU, path_exists=never).devices == renamed


@pytest.mark.parametrize(
    "mount",
    [
        MountSpec("/etc", "/etc", read_only=True),  # covers the task's /etc, shows the host's
        MountSpec("/data", "/etc", read_only=True),
        MountSpec("/var/run/docker.sock", "/var/run/docker.sock", read_only=True),
        MountSpec("/x", "/var", read_only=True),  # holds /var/lib and /var/run
        MountSpec("/x", "/var/lib/x/journal.json", read_only=True),  # the plugin's own data_dir
        MountSpec("/opt/lib", "/usr/local/lib", read_only=False),  # read-write
        MountSpec("/usr/lib64", "/usr/local/nvidia/lib64", read_only=True),  # replaces a system directory
        MountSpec("/usr", "/usr/local/nvidia", read_only=True),
        MountSpec("/secrets/x", "/usr/local/nvidia", read_only=True),  # Nomad's task directory
        MountSpec("/proc/sys", "/usr/local/nvidia", read_only=True),
    ],
)
def test_mounts_read_only_and_never_over_system_paths(mount):
    assert rejected_rule(grant(mounts=(mount,))) == "mount"


def test_driver_mounts_pass_and_the_operator_may_allow_a_tree():
    from nomad_plugin.nomad.container import ReservePolicy

    ok = (
        MountSpec("/usr/local/nvidia", "/usr/local/nvidia"),
        MountSpec("/usr/lib64/libcuda.so.1", "/usr/lib64/libcuda.so.1"),
    )
    assert build_container(nv_grant(mounts=ok), WHOLE, NV, path_exists=never).mounts == ok
    socket = (MountSpec("/run/amp/xdm.sock", "/run/amp/eKitC/xdm/sockets/dp2mgr.sock", read_only=False),)
    policy = ReservePolicy(mount_allow=("/run/amp/eKitC",))
    assert build_container(nv_grant(mounts=socket), WHOLE, PPU, path_exists=never, policy=policy)
    assert rejected_rule(nv_grant(mounts=socket)) == "mount"


@pytest.mark.parametrize(
    "kw",
    [
        {"envs": {"BIG": "x" * (3 << 20)}},  # execve would fail with E2BIG
        {"envs": {f"E{i}": "1" for i in range(300)}},
        {"device_nodes": tuple(DeviceNode("/dev/alixpu1", "/dev/alixpu1") for _ in range(10_000))},
        {"mounts": tuple(MountSpec(f"/opt/l{i}", f"/opt/l{i}") for i in range(1000))},
        {"annotations": {f"xdm.amp.com/k{i}": "v" for i in range(1000)}},
        {"envs": {f"E{i}": "v" * 30_000 for i in range(6)}},  # each fits, together too much
    ],
)
def test_sizes_are_bounded(kw):
    assert rejected_rule(grant(**kw)) == "size"


def test_annotations_become_env_by_documented_mapping():
    g = grant(annotations={"xdm.amp.com/allocation-id": "a-1", "xdm.amp.com/core": "50", "bad key!": "x"})
    spec = build_container(g, WHOLE, PPU, path_exists=never)
    assert spec.envs["XDM_AMP_COM_ALLOCATION_ID"] == "a-1"
    assert spec.envs["XDM_AMP_COM_CORE"] == "50"
    assert not any("BAD" in k for k in spec.envs)


def test_annotation_with_interpolation_is_dropped_not_fatal():
    g = grant(annotations={"xdm.amp.com/x": "${attr.kernel.name}"})
    assert "XDM_AMP_COM_X" not in build_container(g, WHOLE, PPU, path_exists=never).envs


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("xdm.amp.com/allocation-id", "XDM_AMP_COM_ALLOCATION_ID"),
        ("simple", "SIMPLE"),
        ("9lives", None),
        ("a b", None),
        ("a$b", None),
        ("", None),
    ],
)
def test_annotation_env_name(key, expected):
    assert annotation_env_name(key) == expected


@pytest.mark.parametrize(
    ("envs", "match"),
    [
        ({"1BAD": "x"}, "not a valid variable name"),
        ({"A-B": "x"}, "not a valid variable name"),
        ({"A": "x\x00y"}, "control character"),
        ({"A": "x\ny"}, "control character"),
        ({"A": "${node.unique.id}"}, "interpolate"),
        ({"LD_LIBRARY_PATH": "/usr/lib:${NOMAD_SECRETS_DIR}/lib"}, "interpolate"),  # in the middle
        ({"PATH_SUFFIX": "/opt/bin${NOMAD_TASK_DIR}"}, "interpolate"),  # at the end
        ({"A": "x${"}, "interpolate"),  # an unclosed one at the very end
    ],
)
def test_bad_xdm_env_rejects_grant(envs, match):
    with pytest.raises(GrantRejected, match=match):
        build_container(grant(envs=envs), WHOLE, PPU, path_exists=never)


def test_dollar_or_brace_alone_is_not_interpolation():
    """Only the two together are Nomad's interpolation: "$HOME" and "{a}" pass through unchanged."""
    envs = {"A": "$HOME/x", "B": "{a}", "C": "$ {b}", "D": "{$x}"}
    spec = build_container(grant(envs=envs), WHOLE, PPU, path_exists=never)
    assert {k: spec.envs[k] for k in envs} == envs


BAD_PATHS = [
    "",
    "relative/path",
    "/dev/../etc/shadow",
    "/dev/./alixpu",
    "/dev//alixpu",
    "//dev/alixpu",
    "/dev/alixpu/",
    "/dev/ali\x00xpu",
    "/dev/ali\nxpu",
    "/dev/..",
]


@pytest.mark.parametrize("path", BAD_PATHS)
def test_bad_paths_rejected(path):
    with pytest.raises(GrantRejected):
        check_path(path, "device host path", under_dev=True)


@pytest.mark.parametrize("path", ["/etc/passwd", "/dev", "/devx/a", "/sys/class"])
def test_device_nodes_must_be_under_dev(path):
    with pytest.raises(GrantRejected, match="outside /dev/"):
        build_container(grant(device_nodes=(DeviceNode(path, path),)), WHOLE, PPU, path_exists=never)


@pytest.mark.parametrize(
    "mount",
    [
        MountSpec("/usr/lib/x", "/"),
        MountSpec("/usr/lib/x", "/opt/../etc"),
        MountSpec("usr/lib", "/opt/lib"),
        MountSpec("/usr/lib/x", "/opt/lib\n"),
    ],
)
def test_bad_mounts_reject_grant_even_when_mounts_are_not_passed_on(mount):
    with pytest.raises(GrantRejected):
        build_container(grant(mounts=(mount,)), WHOLE, PPU, path_exists=never)


def test_bad_permissions_rejected():
    with pytest.raises(GrantRejected, match="permissions"):
        build_container(grant(device_nodes=(DeviceNode("/dev/a", "/dev/a", "rwx"),)), WHOLE, PPU, path_exists=never)


def test_validated_mounts_are_carried_for_the_mount_policy_to_decide():
    g = grant(mounts=(MountSpec("/usr/local/lj", "/opt/lj/lib"),))
    assert build_container(g, WHOLE, PPU, path_exists=never).mounts == g.mounts


def test_device_nodes_derived_when_xdm_names_none_and_only_existing():
    g = grant(device_nodes=())
    spec = build_container(g, WHOLE, NV, path_exists=lambda p: p in {"/dev/nvidia1", "/dev/nvidiactl"})
    assert [d.host_path for d in spec.devices] == ["/dev/nvidia1", "/dev/nvidiactl"]
    spec = build_container(g, WHOLE, PPU, path_exists=lambda p: True)
    assert [d.host_path for d in spec.devices] == ["/dev/alixpu", "/dev/alixpu_ctl"]


def test_to_proto_round_trip():
    g = grant(mounts=(MountSpec("/usr/local/lj", "/opt/lj/lib", True),))
    proto = build_container(g, WHOLE, PPU, path_exists=never).to_proto()
    assert proto.envs["LINGJUN_GRANT_ID"] == "g-1"
    assert [(m.task_path, m.host_path, m.read_only) for m in proto.mounts] == [("/usr/local/lj", "/opt/lj/lib", True)]
    assert [(d.task_path, d.host_path, d.permissions) for d in proto.devices] == [
        ("/dev/alixpu1", "/dev/alixpu1", "rwm")
    ]


def test_derived_device_nodes_map_each_host_node_to_the_same_path_with_rwm():
    spec = build_container(grant(device_nodes=()), WHOLE, NV, path_exists=lambda p: p == "/dev/nvidia2")
    assert spec.devices == (DeviceNode("/dev/nvidia2", "/dev/nvidia2", "rwm"),)


def test_card_uuid_comes_from_the_instance_on_the_same_minor_when_xdm_omits_it():
    g = nv_grant(devices=(GrantedDevice(2),))
    spec = build_container(g, WHOLE, NV, path_exists=never)
    assert spec.envs["LINGJUN_CARD_UUIDS"] == "U2"
    assert spec.envs["NVIDIA_VISIBLE_DEVICES"] == "U2"


def test_a_granted_minor_without_an_instance_gives_no_uuid_rather_than_a_made_up_one():
    g = nv_grant(devices=(GrantedDevice(7),))
    spec = build_container(g, WHOLE, NV, path_exists=never)
    assert spec.envs["LINGJUN_CARD_UUIDS"] == ""
    assert "NVIDIA_VISIBLE_DEVICES" not in spec.envs


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"mounts": (MountSpec("/usr/lib/x", "relative"),)}, "mount host path that is not a plain absolute path"),
        ({"mounts": (MountSpec("relative", "/opt/x"),)}, "mount container path that is not a plain absolute path"),
        ({"mounts": (MountSpec("/usr/lib/x", "/"),)}, "^XDM returned a mount of the host root '/'$"),
        (
            {"device_nodes": (DeviceNode("/dev/a", "/etc/a"),)},
            "^XDM returned a device host path outside /dev/: '/etc/a'$",
        ),
        ({"device_nodes": (DeviceNode("/opt/a", "/dev/a"),)}, "^XDM returned a device container path outside /dev/"),
    ],
)
def test_rejections_name_which_path_is_wrong(kw, match):
    with pytest.raises(GrantRejected, match=match):
        build_container(grant(**kw), WHOLE, PPU, path_exists=never)


def test_no_visible_devices_env_for_a_grant_without_devices():
    g = nv_grant(devices=(), envs={"X": "1"})
    for group in (NV, PPU):
        spec = build_container(g, WHOLE, group, path_exists=never)
        assert "NVIDIA_VISIBLE_DEVICES" not in spec.envs and "PPU_VISIBLE_DEVICES" not in spec.envs
        assert spec.envs["LINGJUN_CORE_LIMIT_PERCENT"] == "100"  # whole card: unlimited
        assert spec.envs["LINGJUN_MEMORY_LIMIT_GIB"] == "0"
        assert spec.envs["LINGJUN_DEVICE_MINORS"] == ""


def test_uuid_xdm_names_wins_over_the_catalogs():
    g = nv_grant(devices=(GrantedDevice(1, "GPU-xdm-1"), GrantedDevice(2, "GPU-xdm-2")))
    spec = build_container(g, WHOLE, NV, path_exists=never)
    assert spec.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-xdm-1,GPU-xdm-2"
    assert spec.envs["LINGJUN_CARD_UUIDS"] == "GPU-xdm-1,GPU-xdm-2"


def test_mixed_kinds_report_whole_mode_and_no_slices():
    insts = [Instance("U1", Kind.WHOLE, "U1", 1), Instance("U2-share-0", Kind.SHARE, "U2", 2, 0, 50, 40)]
    spec = build_container(grant(), insts, PPU, path_exists=never)
    assert spec.envs["LINGJUN_MODE"] == "whole"
    assert "LINGJUN_MIG_SLICES" not in spec.envs


def test_limits_not_named_by_xdm_come_from_the_instances_on_the_first_card_only():
    insts = [
        Instance("U1-share-0", Kind.SHARE, "U1", 1, 0, 25, 10),
        Instance("U1-share-1", Kind.SHARE, "U1", 1, 1, 25, 10),
        Instance("U2-share-0", Kind.SHARE, "U2", 2, 0, 25, 10),
    ]
    g = grant(devices=(GrantedDevice(1, "U1"), GrantedDevice(2, "U2")))
    spec = build_container(g, insts, PPU, path_exists=never)
    assert (spec.envs["LINGJUN_CORE_LIMIT_PERCENT"], spec.envs["LINGJUN_MEMORY_LIMIT_GIB"]) == ("50", "20")


def test_limits_xdm_names_win_over_the_instances():
    insts = [Instance(f"U1-share-{i}", Kind.SHARE, "U1", 1, i, 10, 10) for i in range(2)]
    g = grant(devices=(GrantedDevice(1, "U1", 40, 30),))
    spec = build_container(g, insts, PPU, path_exists=never)
    assert (spec.envs["LINGJUN_CORE_LIMIT_PERCENT"], spec.envs["LINGJUN_MEMORY_LIMIT_GIB"]) == ("40", "30")


def test_a_plugin_env_that_nomad_would_interpolate_rejects_the_grant():
    with pytest.raises(GrantRejected, match=r"^plugin env LINGJUN_GRANT_ID="):
        build_container(grant(grant_id="g-${x}"), WHOLE, PPU, path_exists=never)


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("", "XDM returned an empty mount host path"),
        ("/opt/a\tb", "XDM returned a mount host path with a control character: '/opt/a\\tb'"),
        ("/opt/a\x00b", "XDM returned a mount host path with a control character: '/opt/a\\x00b'"),
        ("//opt/x", "XDM returned a mount host path that is not a plain absolute path: '//opt/x'"),
        ("/opt/../etc", "XDM returned a mount host path containing '..': '/opt/../etc'"),
        ("/opt/./x", "XDM returned a mount host path that is not normalised: '/opt/./x'"),
    ],
)
def test_check_path_says_what_is_wrong(path, message):
    with pytest.raises(GrantRejected) as err:
        check_path(path, "mount host path")
    assert str(err.value) == message


def test_xdm_env_errors_name_xdm_as_the_source():
    with pytest.raises(GrantRejected, match=r"^XDM env name '1BAD' is not a valid variable name"):
        build_container(grant(envs={"1BAD": "x"}), WHOLE, PPU, path_exists=never)


def test_annotations_cannot_take_plugin_or_derived_env_names(caplog):
    g = nv_grant(annotations={"lingjun_mode": "evil", "lingjun_extra": "x", "nvidia_visible_devices": "all"})
    with caplog.at_level("WARNING", logger="nomad_plugin.nomad.container"):
        spec = build_container(g, WHOLE, NV, path_exists=never)
    assert spec.envs["NVIDIA_VISIBLE_DEVICES"] == "U1,U2" and spec.envs["LINGJUN_MODE"] == "whole"
    assert "LINGJUN_EXTRA" not in spec.envs
    assert sorted(r.getMessage() for r in caplog.records) == [
        f"grant g-1: annotation {key!r} not carried as env (name not allowed or taken)"
        for key in ("lingjun_extra", "lingjun_mode", "nvidia_visible_devices")
    ]


def test_a_skipped_annotation_or_env_does_not_drop_the_ones_after_it(caplog):
    g = grant(
        annotations={"a.bad": "${x}", "b bad": "1", "c.ok": "yes"},
        envs={"LINGJUN_X": "1", "ZZZ": "2"},
    )
    with caplog.at_level("WARNING", logger="nomad_plugin.nomad.container"):
        spec = build_container(g, WHOLE, PPU, path_exists=never)
    assert spec.envs["C_OK"] == "yes" and spec.envs["ZZZ"] == "2"
    assert "A_BAD" not in spec.envs and "LINGJUN_X" not in spec.envs
    assert [r.getMessage() for r in caplog.records] == [
        "grant g-1: annotation 'a.bad' not carried as env: XDM annotation env A_BAD='${x}' contains '${', "
        "which Nomad would interpolate",
        "grant g-1: annotation 'b bad' not carried as env (name not allowed or taken)",
        "grant g-1: XDM env LINGJUN_X ignored (prefix LINGJUN_ is the plugin's)",
    ]


@pytest.mark.parametrize(
    ("slices", "percent"), [(0, 1), (1, 14), (2, 29), (3, 43), (5, 71), (6, 86), (7, 100), (8, 100), (14, 100)]
)
def test_a_mig_slices_core_percent_is_its_share_of_seven_between_1_and_100(slices: int, percent: int) -> None:
    from nomad_plugin.nomad.container import mig_core_percent

    assert mig_core_percent(slices) == percent


def _limits(spec):
    return {k: spec.envs.get(k) for k in ("LINGJUN_CORE_LIMIT_PERCENT", "LINGJUN_MIG_SLICES")}


def test_mig_limits_from_the_instances_when_xdm_names_no_slices_or_core():
    # A MIG unit of 0 slices still counts as one; the core share follows the slices.
    insts = [Instance("G-mig-0", Kind.MIG, "G", 3, 0, 0, 10, 0), Instance("G-mig-1", Kind.MIG, "G", 3, 1, 0, 10, 2)]
    g = grant(devices=(GrantedDevice(3, "G", 0, 20, 0, "MIG-xyz"),), device_nodes=())
    assert _limits(build_container(g, insts, NV, path_exists=never)) == {
        "LINGJUN_CORE_LIMIT_PERCENT": "43",
        "LINGJUN_MIG_SLICES": "3",
    }


def test_mig_limits_xdm_names_win_over_the_instances():
    insts = [Instance(f"G-mig-{i}", Kind.MIG, "G", 3, i, 0, 10, 1) for i in range(3)]
    g = grant(devices=(GrantedDevice(3, "G", 30, 20, 2, "MIG-xyz"),), device_nodes=())
    assert _limits(build_container(g, insts, NV, path_exists=never)) == {
        "LINGJUN_CORE_LIMIT_PERCENT": "30",
        "LINGJUN_MIG_SLICES": "2",
    }
    g = grant(devices=(GrantedDevice(3, "G", 0, 20, 2, "MIG-xyz"),), device_nodes=())
    assert _limits(build_container(g, insts, NV, path_exists=never)) == {
        "LINGJUN_CORE_LIMIT_PERCENT": "29",
        "LINGJUN_MIG_SLICES": "2",
    }


def test_share_core_from_the_instances_is_capped_at_100():
    insts = [Instance(f"U1-share-{i}", Kind.SHARE, "U1", 1, i, 60, 9) for i in range(2)]
    g = grant(devices=(GrantedDevice(1, "U1", 0, 18),))
    assert build_container(g, insts, PPU, path_exists=never).envs["LINGJUN_CORE_LIMIT_PERCENT"] == "100"
