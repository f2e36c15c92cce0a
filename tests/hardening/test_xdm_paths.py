"""Every path and env value from XDM is validated before it can reach a container.

A real XDM test server (real gRPC on a Unix socket) answers Allocate with
hand-crafted grants; the real XdmClient, Reserver and journal handle them.
A bad grant must fail Reserve with a message naming the problem, be released
at XDM at once, and leave nothing in the journal.
"""

from __future__ import annotations

import shutil

import pytest

from nomad_plugin._proto.lingjun import api_outer_pb2 as pb
from nomad_plugin.config.model import PluginConfig
from nomad_plugin.journal import Journal
from nomad_plugin.model.errors import PluginError
from nomad_plugin.model.instances import Catalog, GroupKey, Instance, InstanceGroup, Kind
from nomad_plugin.nomad.reserve import Reserver
from nomad_plugin.xdm.client import XdmClient
from tests.doubles.fake_xdm import FakeXdm, short_socket_dir

CARD = "GPU-0"
GROUP = GroupKey("nvidia", "gpu", "H800")
CATALOG = Catalog((InstanceGroup(GROUP, (Instance(CARD, Kind.WHOLE, CARD, 0),)),))


@pytest.fixture
def rig(tmp_path):
    sockets = short_socket_dir()
    fake = FakeXdm(str(sockets / "dp2mgr.sock"), str(sockets / "config-daemon.sock")).start()
    config = PluginConfig(
        xdm_socket=str(sockets / "dp2mgr.sock"),
        config_socket=str(sockets / "config-daemon.sock"),
        xdm_service="xdm.XpuDeviceManagerService",
        xdm_call_timeout=2.0,
        data_dir=str(tmp_path / "data"),
    )
    client = XdmClient(config)
    journal = Journal(config.data_dir)
    reserver = Reserver(client, lambda: CATALOG, journal, config, path_exists=lambda p: True)  # type: ignore[arg-type]
    yield fake, reserver, journal
    client.close()
    fake.stop()
    shutil.rmtree(sockets, ignore_errors=True)


def _crafted(fake: FakeXdm, nodes=(), mounts=(), envs=None):
    def answer(request: pb.AllocateRequest) -> bytes:
        with fake.lock:
            fake.grants[request.id] = request
        return pb.AllocateResponse(
            id=request.id,
            devices=[pb.AllocatedDevice(minor=0, uuid=CARD)],
            envs=envs or {},
            deviceSpecs=[pb.DeviceSpec(containerPath=t, hostPath=h, permissions=p) for t, h, p in nodes],
            mounts=[pb.Mount(containerPath=t, hostPath=h, readOnly=True) for t, h in mounts],
        ).SerializeToString()

    fake.raw["Allocate"] = answer


BAD = {
    "dotdot-host": dict(nodes=[("/dev/nvidia0", "/dev/../etc/shadow", "rw")]),
    "dotdot-task": dict(nodes=[("/dev/../etc/ld.so.preload", "/dev/nvidia0", "rw")]),
    "relative-host": dict(nodes=[("/dev/nvidia0", "dev/nvidia0", "rw")]),
    "outside-dev": dict(nodes=[("/dev/nvidia0", "/etc/shadow", "rw")]),
    "double-slash": dict(nodes=[("/dev/nvidia0", "//dev/nvidia0", "rw")]),
    "not-normalised": dict(nodes=[("/dev/nvidia0", "/dev/./nvidia0", "rw")]),
    "nul-byte": dict(nodes=[("/dev/nvidia0", "/dev/nvidia0\x00x", "rw")]),
    "bad-permissions": dict(nodes=[("/dev/nvidia0", "/dev/nvidia0", "rwx")]),
    "mount-root": dict(mounts=[("/host", "/")]),
    "mount-dotdot": dict(mounts=[("/usr/lib", "/opt/../etc")]),
    "mount-relative": dict(mounts=[("usr/lib", "/opt/lib")]),
    "env-interpolation": dict(envs={"LD_PRELOAD": "${NOMAD_SECRETS_DIR}/x.so"}),
    "env-interpolation-inside": dict(envs={"LD_LIBRARY_PATH": "/usr/lib:${NOMAD_SECRETS_DIR}/lib"}),
    "env-interpolation-at-end": dict(envs={"PATH_SUFFIX": "/opt/bin${NOMAD_TASK_DIR}"}),
    "env-newline": dict(envs={"A": "x\nB=y"}),
    "env-bad-name": dict(envs={"A B": "x"}),
    "env-own-prefix": dict(envs={"LINGJUN_GRANT_ID": "someone-else"}),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_grant_fails_reserve_and_is_released(rig, case):
    fake, reserver, journal = rig
    _crafted(fake, **BAD[case])
    try:
        response = reserver.reserve([CARD])
    except PluginError as exc:
        assert "XDM" in str(exc) or "env" in str(exc), str(exc)
    else:
        # Accepted only if the offending value never reached the reservation.
        res = response.container_res
        assert case == "env-own-prefix", f"{case} was accepted: {res}"
        assert res.envs["LINGJUN_GRANT_ID"] != "someone-else"
        return
    assert len(fake.grants) == 0, f"grant left at XDM: {list(fake.grants)}"
    assert len(fake.released) == 1
    assert journal.entries() == []


def test_good_grant_passes(rig):
    fake, reserver, journal = rig
    _crafted(fake, nodes=[("/dev/nvidia0", "/dev/nvidia0", "rw")], envs={"CUDA_VISIBLE_DEVICES": "0"})
    res = reserver.reserve([CARD]).container_res
    assert [d.host_path for d in res.devices] == ["/dev/nvidia0"]
    assert len(fake.grants) == 1 and len(journal.entries()) == 1


@pytest.mark.timeout(90)
def test_real_plugin_refuses_and_releases_a_bad_grant(tmp_path):
    """End to end: the executable under the conformance host, XDM answering with /dev/../etc/shadow.

    The host reserves at the first fingerprint that holds GPU-0 (never "after
    the second fingerprint": whether an empty one comes first is a race).
    """
    import json

    from tests.conformance.hostlib import built_host, real_plugin, run_host

    if shutil.which("go") is None:
        pytest.skip("go is missing (conformance host)")
    built_host()
    sockets = short_socket_dir()
    fake = FakeXdm(str(sockets / "dp2mgr.sock"), str(sockets / "config-daemon.sock")).start()
    _crafted(fake, nodes=[("/dev/nvidia0", "/dev/../etc/shadow", "rw")])
    sets = {
        "backend": '"xdm"',
        "xdm_socket": json.dumps(fake.socket_path),
        "config_socket": json.dumps(str(sockets / "config-daemon.sock")),
        "xdm_service": '"xdm.XpuDeviceManagerService"',
        "data_dir": json.dumps(str(tmp_path / "data")),
        "reconcile": "false",
        "nvml_enrich": "false",
    }
    args = ["--plugin", str(real_plugin()), "--config", "plugin.hcl", "--phase", "run", "--duration", "3"]
    args += ["--reserve-count", "1", "--expect-reserve", "error"]
    for k, v in sets.items():
        args += ["--set", f"{k}={v}"]
    try:
        run = run_host(args, timeout=60)
    finally:
        fake.stop()
        shutil.rmtree(sockets, ignore_errors=True)
    assert run.returncode == 0, run.describe()
    reserve = run.of("reserve")
    assert reserve, f"the host never reserved:\n{run.describe()}"
    assert reserve[0]["called"] and not reserve[0]["ok"], reserve
    assert "'..'" in reserve[0]["message"] and "/dev/../etc/shadow" in reserve[0]["message"], reserve[0]
    assert len(fake.released) == 1 and fake.grants == {}, (fake.released, fake.grants)
    from nomad_plugin.journal import Journal

    assert Journal(tmp_path / "data").entries() == []
