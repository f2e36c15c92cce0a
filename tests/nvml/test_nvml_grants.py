from __future__ import annotations

from pathlib import Path

import pytest

from nomad_plugin.model.errors import BackendRefused, BackendUnavailable, GrantMismatch, ReservationRejected
from nomad_plugin.model.grant import DeviceAsk, GrantRequest
from tests.doubles.fake_pynvml import NVML_ERROR_DRIVER_NOT_LOADED, FakeNvml, write_mig_caps


def _nodes(grant) -> dict[str, str]:
    return {n.container_path: n.host_path for n in grant.device_nodes}


def test_whole_cards_env_and_device_nodes(fake: FakeNvml, make_backend, tmp_path) -> None:
    backend = make_backend(fake)
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "nvidia-uvm").touch()  # uvm present, uvm-tools not
    grant = backend.allocate(GrantRequest("g1", (DeviceAsk(minor=1), DeviceAsk(minor=0))))
    assert grant.grant_id == "g1"
    assert grant.envs == {"NVIDIA_VISIBLE_DEVICES": f"{fake.gpus[1].uuid},{fake.gpus[0].uuid}"}
    dev = str(tmp_path / "dev")
    assert _nodes(grant) == {
        "/dev/nvidia1": f"{dev}/nvidia1",
        "/dev/nvidia0": f"{dev}/nvidia0",
        "/dev/nvidiactl": f"{dev}/nvidiactl",
        "/dev/nvidia-uvm": f"{dev}/nvidia-uvm",
    }
    assert all(n.permissions == "rwm" for n in grant.device_nodes)
    assert [(d.minor, d.uuid) for d in grant.devices] == [(1, fake.gpus[1].uuid), (0, fake.gpus[0].uuid)]
    assert grant.mounts == ()


def test_minor_differs_from_nvml_index(make_backend, tmp_path) -> None:
    from tests.doubles.fake_pynvml import h100

    gpu = h100(0)
    gpu.minor = 5  # /dev/nvidia5 although NVML index 0
    backend = make_backend(FakeNvml([gpu]))
    grant = backend.allocate(GrantRequest("g", (DeviceAsk(minor=5),)))
    assert "/dev/nvidia5" in _nodes(grant) and "/dev/nvidia0" not in _nodes(grant)


def test_mig_instances_get_mig_uuids_and_caps_nodes(fake: FakeNvml, make_backend, tmp_path) -> None:
    backend = make_backend(fake)
    caps = write_mig_caps(tmp_path / "proc", fake)
    migs = fake.gpus[2].migs
    request = GrantRequest(
        "g2",
        (
            DeviceAsk(minor=2, slices=3, memory_gib=39, mig_uuid=migs[0].uuid),
            DeviceAsk(minor=2, slices=1, memory_gib=9, mig_uuid=migs[2].uuid),
        ),
    )
    grant = backend.allocate(request)
    assert grant.envs["NVIDIA_VISIBLE_DEVICES"] == f"{migs[0].uuid},{migs[2].uuid}"
    assert [(d.minor, d.mig_uuid, d.slices) for d in grant.devices] == [(2, migs[0].uuid, 3), (2, migs[2].uuid, 1)]
    nodes = _nodes(grant)
    dev = str(tmp_path / "dev")
    for mig in (migs[0], migs[2]):
        gi_minor, ci_minor = caps[mig.uuid]
        assert nodes[f"/dev/nvidia-caps/nvidia-cap{gi_minor}"] == f"{dev}/nvidia-caps/nvidia-cap{gi_minor}"
        assert f"/dev/nvidia-caps/nvidia-cap{ci_minor}" in nodes
    gi_unused, _ = caps[migs[1].uuid]
    assert f"/dev/nvidia-caps/nvidia-cap{gi_unused}" not in nodes
    assert "/dev/nvidia2" in nodes and "/dev/nvidiactl" in nodes


def test_mig_caps_file_missing_is_a_clear_error(fake: FakeNvml, make_backend) -> None:
    backend = make_backend(fake)
    mig = fake.gpus[2].migs[0]
    with pytest.raises(GrantMismatch, match=r"gpu2/mig/gi2/access cannot be read"):
        backend.allocate(GrantRequest("g", (DeviceAsk(minor=2, slices=3, mig_uuid=mig.uuid),)))


def test_mig_caps_file_without_minor(fake: FakeNvml, make_backend, tmp_path) -> None:
    backend = make_backend(fake)
    write_mig_caps(tmp_path / "proc", fake)
    mig = fake.gpus[2].migs[1]
    access = Path(tmp_path, "proc/driver/nvidia/capabilities/gpu2/mig/gi3/access")
    access.write_text("DeviceFileMode: 292\n")
    with pytest.raises(GrantMismatch, match="no DeviceFileMinor line"):
        backend.allocate(GrantRequest("g", (DeviceAsk(minor=2, slices=2, mig_uuid=mig.uuid),)))


def test_shares_are_refused(fake: FakeNvml, make_backend) -> None:
    backend = make_backend(fake)
    with pytest.raises(BackendRefused, match=r"card 0: shares are not available.*core=30%.*no time-division"):
        backend.allocate(GrantRequest("g", (DeviceAsk(minor=0, core=30),)))
    with pytest.raises(BackendRefused, match="memory_gib=8"):
        backend.allocate(GrantRequest("g", (DeviceAsk(minor=0, memory_gib=8),)))


def test_mig_slices_without_an_existing_instance_are_refused(fake: FakeNvml, make_backend) -> None:
    backend = make_backend(fake)
    with pytest.raises(BackendRefused, match="NVML cannot create MIG instances"):
        backend.allocate(GrantRequest("g", (DeviceAsk(minor=2, slices=1),)))


def test_unknown_card_and_unknown_or_stray_mig(fake: FakeNvml, make_backend) -> None:
    backend = make_backend(fake)
    with pytest.raises(ReservationRejected, match=r"card 9 is not on this node \(NVML sees \[0, 1, 2\]\)"):
        backend.allocate(GrantRequest("g", (DeviceAsk(minor=9),)))
    with pytest.raises(ReservationRejected, match=r"unknown MIG instance MIG-nope on card 2"):
        backend.allocate(GrantRequest("g", (DeviceAsk(minor=2, slices=1, mig_uuid="MIG-nope"),)))
    mig = fake.gpus[2].migs[0]
    with pytest.raises(ReservationRejected, match=f"MIG instance {mig.uuid} is on card 2, not on card 0"):
        backend.allocate(GrantRequest("g", (DeviceAsk(minor=0, mig_uuid=mig.uuid),)))


def test_a_card_in_mig_mode_is_not_granted_whole(fake: FakeNvml, make_backend) -> None:
    backend = make_backend(fake)
    with pytest.raises(BackendRefused, match=r"card 2 .* is in MIG mode: only its MIG instances"):
        backend.allocate(GrantRequest("g", (DeviceAsk(minor=2),)))


def test_empty_request_and_release_is_a_no_op(fake: FakeNvml, make_backend) -> None:
    backend = make_backend(fake)
    grant = backend.allocate(GrantRequest("g", ()))
    assert grant.envs == {} and grant.device_nodes == ()
    backend.release("g")
    backend.release("g")
    backend.release("never-granted")


def test_allocate_while_nvml_is_down(make_backend, wait_for) -> None:
    fake = FakeNvml()
    fake.init_error = NVML_ERROR_DRIVER_NOT_LOADED
    backend = make_backend(fake, start=False)
    with pytest.raises(BackendUnavailable, match="not started"):
        backend.allocate(GrantRequest("g", (DeviceAsk(minor=0),)))
    backend.start()
    assert wait_for(lambda: "Driver Not Loaded" in backend.inventory().unreachable_reason)
    with pytest.raises(BackendUnavailable, match="Driver Not Loaded"):
        backend.allocate(GrantRequest("g", (DeviceAsk(minor=0),)))
