"""The real plugin process against an adversary: XDM, Nomad's API, the filesystem and the config misbehave.

Each scenario runs the shipped entry point (the venv's console script under
the Go conformance host, or ``python -m nomad_plugin`` under a stand-in
agent, ``agent_stub.py``, where the host's own Pdeathsig would hide what is
tested) against the simulator or the fake XDM (``tests/xdm/fake_xdm.py``),
with a proxy (``tests/xdm/h2_proxy.py``) or the Nomad API double
(``nomad_plugin/testing/nomad_api.py``) where XDM or Nomad must misbehave.

The invariants, counted across every scenario in ``TALLY`` (printed at the
end of the module, ``-s`` to see it) and asserted zero in each:

- ``live_released``: a grant held by a live allocation that left XDM;
- ``leaked``: a grant left at XDM that no journal entry names, once the plugin had its chance;
- ``token_found``: a spelling of a canary token in anything the plugin or its tools printed;
- ``mode_changed``: a directory the plugin did not create whose mode changed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from nomad_plugin.journal import Journal
from nomad_plugin.sim import Simulator
from nomad_plugin.testing.nomad_api import NomadApiDouble
from tests.conformance.hostlib import HostProcess, build_host, real_plugin, run_host, start_host
from tests.waiting import wait_until
from tests.xdm.fake_xdm import FakeXdm, default_devices, short_socket_dir
from tests.xdm.h2_proxy import ResettingProxy

REPO = Path(__file__).resolve().parents[2]
TALLY: Counter[str] = Counter()
SCENARIOS: list[str] = []

pytestmark = pytest.mark.skipif(shutil.which("go") is None, reason="go is missing (the conformance host)")


@pytest.fixture(scope="module", autouse=True)
def _report() -> Iterator[None]:
    build_host()
    yield
    print(f"\nadversary: {len(SCENARIOS)} scenarios; " + ", ".join(f"{k}={TALLY[k]}" for k in COUNTS))


COUNTS = ("live_released", "leaked", "token_found", "mode_changed")


def scenario(name: str, **counts: int) -> None:
    """Record one scenario's counts (each must be 0) and assert them."""
    SCENARIOS.append(name)
    for key, value in counts.items():
        assert key in COUNTS, key
        TALLY[key] += value
    assert all(v == 0 for v in counts.values()), f"{name}: {counts}"


# --- running the plugin ---------------------------------------------------------------------------
def sets_of(config: dict[str, Any]) -> list[str]:
    args: list[str] = []
    for key, value in config.items():
        args += ["--set", f"{key}={json.dumps(value)}"]
    return args


def host_args(config: dict[str, Any], *extra: str) -> list[str]:
    args = ["--plugin", str(real_plugin()), "--config", "plugin.hcl", "--phase", "run", "--duration", "0"]
    return [*args, "--rpc-timeout", "120", *extra, *sets_of(config)]


def launch_host(config: dict[str, Any], env: dict[str, str] | None = None) -> tuple[HostProcess, int]:
    """A running host (launches 1 and 3); returns it and the long-lived plugin's pid."""
    proc = start_host(host_args(config), env=env)
    launch = proc.wait_for(lambda e: e.get("event") == "launch" and e.get("launch") == 3, timeout=60)
    return proc, int(launch["pid"])


def first_devices(proc: HostProcess, timeout: float = 60) -> list[str]:
    fp = proc.wait_for(lambda e: e.get("event") == "fingerprint" and e.get("n_devices", 0) > 0, timeout=timeout)
    return [d["id"] for g in fp["groups"] for d in g["devices"]]


def reserve(proc: HostProcess, ids: list[str], tag: Any, timeout: float = 90) -> dict[str, Any]:
    proc.send({"op": "reserve", "ids": ids, "expect": "any", "tag": tag})
    return proc.wait_for(lambda e: e.get("event") == "reserve" and e.get("tag") == tag, timeout=timeout)


def alive(pid: int) -> bool:
    """Running (not exited, not a zombie waiting to be reaped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def journal_ids(data_dir: Path) -> dict[str, str]:
    return {e.grant_id: e.state.value for e in Journal.snapshot(data_dir)}


def xdm_config(socket_dir: Path, data_dir: Path, **extra: Any) -> dict[str, Any]:
    return {
        "backend": "xdm",
        "xdm_socket": str(socket_dir / "dp2mgr.sock"),
        "config_socket": str(socket_dir / "config-daemon.sock"),
        "data_dir": str(data_dir),
        "nvml_enrich": False,
        "log_level": "debug",
        **extra,
    }


@pytest.fixture
def sim() -> Iterator[Simulator]:
    d = Path(tempfile.mkdtemp(prefix="adv", dir="/tmp"))
    s = Simulator(d / "s", profile="h800-8").start()
    yield s
    s.stop()
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def api() -> Iterator[NomadApiDouble]:
    with NomadApiDouble() as double:
        yield double


@pytest.fixture
def fake() -> Iterator[tuple[FakeXdm, Path]]:
    sockets = short_socket_dir()
    xdm = FakeXdm(str(sockets / "dp2mgr.sock"), str(sockets / "config-daemon.sock"))
    xdm.devices = default_devices(8)
    xdm.start()
    yield xdm, sockets
    xdm.stop()
    shutil.rmtree(sockets, ignore_errors=True)


def fake_grants(xdm: FakeXdm) -> set[str]:
    with xdm.lock:
        return set(xdm.grants)


# === 1. Two plugins on one data_dir; the plugin ends when its agent dies ============================
@pytest.mark.timeout(240)
def test_two_plugins_on_one_data_dir_and_an_agent_killed(sim: Simulator, api: NomadApiDouble, tmp_path: Path) -> None:
    """The first plugin's agent is SIGKILLed while a second plugin runs on the same data_dir.

    The second serves fingerprints at once, refuses Reserve (UNAVAILABLE,
    naming the lock's holder), and recovers, releases and reconciles nothing
    while the first lives; the first notices its agent is gone and exits,
    freeing the lock; the second then owns the journal, keeps the first's
    grant (its allocation still runs) and releases it once it ends.
    """
    data = tmp_path / "data"
    config = xdm_config(
        sim.socket_dir,
        data,
        nomad_address=api.address,
        nomad_node_id=api.node_id,
        release_grace_period="1s",
        xdm_allocate_timeout="2s",
    )
    first_card = sim.cards[0].uuid
    env = dict(os.environ, PYTHONPATH=str(REPO), AGENT_STUB_PLUGIN_STDERR=str(tmp_path / "first.log"))
    agent = subprocess.Popen(
        [sys.executable, "-m", "tests.hardening.agent_stub", json.dumps(config), first_card],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    second: HostProcess | None = None
    try:
        assert agent.stdout is not None
        first_pid = int(json.loads(agent.stdout.readline())["pid"])
        json.loads(agent.stdout.readline())  # its first fingerprint with devices
        answer = json.loads(agent.stdout.readline())
        first_grant = answer["reserve"]["LINGJUN_GRANT_ID"]
        api.add_alloc("alloc-1", [first_card], "running", device="nvidia/gpu/H800")
        assert set(sim.grants()) == {first_grant}

        second, _ = launch_host(config)
        devices = first_devices(second)  # while the first holds the lock: the fingerprint does not wait on it
        assert first_card in devices
        refused = reserve(second, [sim.cards[1].uuid], "refused")
        assert refused["ok"] is False and refused["code"] == "Unavailable", refused
        assert "is held by another process" in refused["message"] and str(first_pid) in refused["message"]
        assert set(sim.grants()) == {first_grant}, "the second plugin touched XDM while not owning data_dir"
        assert journal_ids(data) == {first_grant: "granted"}, "the second plugin touched the journal"

        agent.send_signal(signal.SIGKILL)  # the agent dies without a word to its plugin
        agent.wait(timeout=10)
        wait_until(lambda: not alive(first_pid), "the first plugin to exit after its agent died", timeout=30)
        took = wait_until(
            lambda: "the grant journal is this plugin's now" in second.stderr_text(),
            "the second plugin to take the lock",
        )
        assert took
        ok = reserve(second, [sim.cards[1].uuid], "after")
        assert ok["ok"] is True, ok
        second_grant = ok["envs"]["LINGJUN_GRANT_ID"]
        api.add_alloc("alloc-2", [sim.cards[1].uuid], "running", device="nvidia/gpu/H800")
        # Several reconciler rounds past the grace period: both allocations are live, both grants stay.
        start = len(api.requests)
        wait_until(lambda: len(api.requests) >= start + 4, "a few reconciler rounds", timeout=60)
        live_released = len({first_grant, second_grant} - set(sim.grants()))
        api.set_status("alloc-1", "complete")
        wait_until(lambda: first_grant not in sim.grants(), "the ended allocation's grant to be released", timeout=60)
        assert second_grant in sim.grants()
    finally:
        if agent.poll() is None:
            agent.kill()
        if second is not None:
            run = second.finish()
            assert not [v for v in run.violations if v["rule"] != "shutdown.not_graceful"], run.describe()
    scenario("two plugins on one data_dir, agent SIGKILLed", live_released=live_released, leaked=0)


# === 2. A wrong nomad_node_id ======================================================================
@pytest.mark.timeout(180)
def test_a_wrong_node_id_releases_no_live_grant(sim: Simulator, api: NomadApiDouble, tmp_path: Path) -> None:
    """Nomad answers 200 [] for a node it does not know: without the node check every grant was released."""
    data = tmp_path / "data"
    wrong = str(uuid.uuid4())
    config = xdm_config(sim.socket_dir, data, nomad_address=api.address, nomad_node_id=wrong, release_grace_period="1s")
    proc, _ = launch_host(config)
    try:
        card = first_devices(proc)[0]
        made = reserve(proc, [card], "r")
        assert made["ok"], made
        grant = made["envs"]["LINGJUN_GRANT_ID"]
        api.add_alloc("alloc-1", [card], "running", device="nvidia/gpu/H800")
        wait_until(
            lambda: proc.stderr_text().count(f"Nomad has no node {wrong}") >= 3,
            "three reconciler rounds to meet the unknown node",
            timeout=90,
        )
        live_released = 0 if grant in sim.grants() else 1
        assert journal_ids(data) == {grant: "granted"}
    finally:
        proc.finish()
    scenario("wrong nomad_node_id", live_released=live_released)


@pytest.mark.timeout(120)
def test_a_node_id_that_is_not_a_uuid_is_refused_by_set_config(tmp_path: Path) -> None:
    run = run_host(
        [
            "--plugin", str(real_plugin()), "--config", "plugin.hcl", "--phase", "validate",
            "--expect-set-config", "error", *sets_of({"nomad_node_id": "node-1", "data_dir": str(tmp_path / "d")}),
        ],
        cwd=REPO,
    )  # fmt: skip
    assert run.returncode == 0, run.describe()
    (call,) = run.of("set_config")
    assert call["code"] == "InvalidArgument" and "nomad_node_id" in call["message"] and "UUID" in call["message"]
    scenario("node ID not a UUID")


# === 3. Late commits ==============================================================================
@pytest.mark.timeout(240)
def test_late_commits_after_any_allocate_error_never_leak(fake: tuple[FakeXdm, Path], tmp_path: Path) -> None:
    """XDM answers an error (or nothing within the deadline) and commits the grant later: released anyway."""
    xdm, sockets = fake
    proxy = ResettingProxy(str(sockets / "proxy.sock"), xdm.socket_path)  # resets Allocate when told to
    data = tmp_path / "data"
    config = xdm_config(
        sockets,
        data,
        xdm_socket=str(sockets / "proxy.sock"),
        xdm_service="xdm.XpuDeviceManagerService",
        reconcile=False,
        xdm_allocate_timeout="1s",
    )
    cases = {
        "UNAVAILABLE at once, commit 1 s later": ("abort", grpc.StatusCode.UNAVAILABLE),
        "CANCELLED at once, commit 1 s later": ("abort", grpc.StatusCode.CANCELLED),
        "INTERNAL (RST_STREAM) at once, commit 1 s later": ("reset", None),
        "commit after the plugin's deadline": ("slow", None),
    }
    proc, _ = launch_host(config)
    late: dict[str, str] = {}
    try:
        cards = first_devices(proc)
        for n, (name, (how, code)) in enumerate(cases.items()):
            before = set(xdm.allocate_requests)
            xdm.allocate_abort = (code, "transport gave up") if how == "abort" else None
            proxy.methods = {"Allocate"} if how == "reset" else set()
            xdm.latency["Allocate"] = 1.0 if how == "reset" else 1.5 if how == "slow" else 0.0
            answer = reserve(proc, [cards[n]], n)
            assert answer["ok"] is False, (name, answer)
            if how == "reset":
                assert answer["code"] == "Unavailable" and "reset" in answer["message"], answer
            (grant_id,) = set(xdm.allocate_requests) - before
            late[name] = grant_id
            wait_until(lambda g=grant_id: g in fake_grants(xdm), f"XDM to commit {name} late")
            assert grant_id in journal_ids(data), f"{name}: the entry was dropped before XDM committed"
        xdm.allocate_abort, proxy.methods, xdm.latency["Allocate"] = None, set(), 0.0
        wait_until(lambda: not (fake_grants(xdm) & set(late.values())), "every late grant to be released", timeout=60)
        wait_until(lambda: not journal_ids(data), "the journal to settle", timeout=30)
    finally:
        proc.finish()
        proxy.close()
    for name, grant_id in late.items():
        scenario(f"late commit: {name}", leaked=int(grant_id in fake_grants(xdm)))


@pytest.mark.timeout(240)
def test_a_sigkill_in_the_middle_of_a_slow_allocate_leaks_nothing(fake: tuple[FakeXdm, Path], tmp_path: Path) -> None:
    """The relaunched plugin keeps the intent until XDM can no longer commit it, and releases what XDM did."""
    xdm, sockets = fake
    data = tmp_path / "data"
    config = xdm_config(
        sockets, data, xdm_service="xdm.XpuDeviceManagerService", reconcile=False, xdm_allocate_timeout="3s"
    )
    xdm.latency["Allocate"] = 4.0  # commits 4 s after the call began, whatever became of the caller
    proc, pid = launch_host(config)
    try:
        card = first_devices(proc)[0]
        proc.send({"op": "reserve", "ids": [card], "expect": "any", "tag": "killed"})
        wait_until(lambda: xdm.allocate_requests, "the Allocate to reach XDM")
        (grant_id,) = xdm.allocate_requests
        os.kill(pid, signal.SIGKILL)
    finally:
        proc.finish()
    xdm.latency["Allocate"] = 0.0
    relaunched, _ = launch_host(config)
    try:
        first_devices(relaunched)
        wait_until(lambda: grant_id in fake_grants(xdm), "XDM to commit the killed Reserve's grant late")
        assert grant_id in journal_ids(data), "the relaunched plugin forgot the intent before XDM committed it"
        wait_until(lambda: grant_id not in fake_grants(xdm), "the late grant to be released", timeout=60)
        wait_until(lambda: not journal_ids(data), "the journal to settle", timeout=30)
    finally:
        relaunched.finish()
    scenario("SIGKILL mid slow Allocate, relaunch", leaked=int(grant_id in fake_grants(xdm)))
