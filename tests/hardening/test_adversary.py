"""The real plugin process against an adversary: XDM, Nomad's API, the filesystem and the config misbehave.

Each scenario runs the shipped entry point (the venv's console script under
the Go conformance host, or ``python -m nomad_plugin`` under a stand-in
agent, ``agent_stub.py``, where the host's own Pdeathsig would hide what is
tested) against the simulator or the fake XDM (``tests/doubles/fake_xdm.py``),
with a proxy (``tests/xdm/h2_proxy.py``) or the Nomad API double
(``tests/doubles/nomad_api.py``) where XDM or Nomad must misbehave.

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
import stat
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from nomad_plugin._proto.lingjun import api_outer_pb2 as pb
from nomad_plugin.journal import Journal
from nomad_plugin.sim import Simulator
from nomad_plugin.util.text import secret_forms
from tests.conformance.hostlib import HostProcess, HostRun, built_host, real_plugin, run_host, start_host
from tests.doubles.fake_xdm import FakeXdm, default_devices, short_socket_dir
from tests.doubles.nomad_api import NomadApiDouble
from tests.operator.test_dist import DIST, SOURCES
from tests.waiting import wait_until
from tests.xdm.h2_proxy import ResettingProxy

REPO = Path(__file__).resolve().parents[2]
TALLY: Counter[str] = Counter()
SCENARIOS: list[str] = []

pytestmark = pytest.mark.skipif(shutil.which("go") is None, reason="go is missing (the conformance host)")


@pytest.fixture(scope="module", autouse=True)
def _report() -> Iterator[None]:
    built_host()
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


@pytest.fixture
def shipped() -> Path:
    """The single-file executable, as tests/operator/test_dist.py finds it (missing in CI: a failure)."""
    if not DIST.is_file():
        message = f"{DIST} is missing: `make dist` builds it (`make test` does so first)"
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    if not os.environ.get("CI") and any(p.stat().st_mtime > DIST.stat().st_mtime for p in SOURCES):
        pytest.skip(f"{DIST} is older than the sources: run `make dist` to test the current code")
    return DIST


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
    # As in Nomad, an allocation holds its device IDs before its task's Reserve is made.
    api.add_alloc("alloc-1", [first_card], "pending", device="nvidia/gpu/H800")
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
        api.set_status("alloc-1", "running")
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
        api.add_alloc("alloc-2", [sim.cards[1].uuid], "running", device="nvidia/gpu/H800")
        ok = reserve(second, [sim.cards[1].uuid], "after")
        assert ok["ok"] is True, ok
        second_grant = ok["envs"]["LINGJUN_GRANT_ID"]
        # Several reconciler rounds past the grace period: both allocations are live, both grants stay.
        start = len(api.requests)
        wait_until(lambda: len(api.requests) >= start + 4, "a few reconciler rounds", timeout=60)
        live_released = len({first_grant, second_grant} - set(sim.grants()))
        api.set_status("alloc-1", "complete")
        wait_until(lambda: first_grant not in sim.grants(), "the ended allocation's grant to be released", timeout=60)
        released = [x for x in second.stderr_text().splitlines() if "released" in x or "took" in x or "startup" in x]
        assert second_grant in sim.grants(), "\n".join(released)
    finally:
        if agent.poll() is None:
            agent.kill()
        if second is not None:
            run = second.finish()
            assert not [v for v in run.violations if v["rule"] != "shutdown.not_graceful"], run.describe()
    scenario("two plugins on one data_dir, agent SIGKILLed", live_released=live_released, leaked=0)


@pytest.mark.timeout(180)
def test_the_shipped_executable_dies_with_its_agent_and_frees_the_lock(
    sim: Simulator, tmp_path: Path, shipped: Path
) -> None:
    """The single-file executable is a launcher that execs the unpacked bundle: the agent's child is the
    interpreter itself, which must end, and free plugin.lock, when the agent is SIGKILLed."""
    from nomad_plugin.journal import OwnerLock

    data = tmp_path / "data"
    config = xdm_config(sim.socket_dir, data, reconcile=False)
    env = dict(
        os.environ,
        PYTHONPATH=str(REPO),
        AGENT_STUB_PLUGIN=str(shipped),
        NOMAD_DEVICE_LINGJUN_CACHE_DIR=str(tmp_path / "cache"),
        AGENT_STUB_PLUGIN_STDERR=str(tmp_path / "plugin.log"),
    )
    agent = subprocess.Popen(
        [sys.executable, "-m", "tests.hardening.agent_stub", json.dumps(config), sim.cards[0].uuid],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert agent.stdout is not None
        pid = int(json.loads(agent.stdout.readline())["pid"])
        json.loads(agent.stdout.readline())
        grant = json.loads(agent.stdout.readline())["reserve"]["LINGJUN_GRANT_ID"]
        assert not OwnerLock(data).acquire(), "the plugin holds its lock"
        agent.send_signal(signal.SIGKILL)
        agent.wait(timeout=10)
        wait_until(lambda: not alive(pid), "the shipped plugin to exit after its agent died", timeout=30)
        lock = OwnerLock(data)
        assert lock.acquire(timeout=10), "plugin.lock is still held"
        lock.release()
        assert journal_ids(data) == {grant: "granted"} and grant in sim.grants()
    finally:
        if agent.poll() is None:
            agent.kill()
    scenario("shipped executable, agent SIGKILLed", live_released=int(grant not in sim.grants()))


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
        api.add_alloc("alloc-1", [card], "running", device="nvidia/gpu/H800")
        made = reserve(proc, [card], "r")
        assert made["ok"], made
        grant = made["envs"]["LINGJUN_GRANT_ID"]
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


# === 4. A slow-drip Nomad API ======================================================================
@pytest.mark.timeout(60)
def test_every_nomad_api_call_has_an_overall_deadline(api: NomadApiDouble) -> None:
    """One byte every 0.5 s: each read is quick, the answer takes minutes; the call ends at its deadline."""
    from nomad_plugin.reconcile.nomad_api import NomadApiError, NomadApiSettings, NomadClient

    api.set_drip(0.5)
    client = NomadClient(NomadApiSettings(address=api.address, timeout=1.0))
    try:
        for call in (lambda: client.node(api.node_id), lambda: client.node_allocations(api.node_id, 5, wait=1.0)):
            started = time.monotonic()
            with pytest.raises(NomadApiError, match="timed out") as err:
                call()
            took = time.monotonic() - started
            assert err.value.kind == "timeout" and took < 1.0 + 1.1 + 1.0, f"a call took {took:.1f}s"
    finally:
        client.close()


@pytest.mark.timeout(180)
def test_a_slow_drip_api_does_not_stall_the_reconciler(sim: Simulator, api: NomadApiDouble, tmp_path: Path) -> None:
    data = tmp_path / "data"
    config = xdm_config(
        sim.socket_dir, data, nomad_address=api.address, nomad_node_id=api.node_id, release_grace_period="1s"
    )
    api.set_drip(0.5)
    proc, _ = launch_host(config)
    try:
        card = first_devices(proc)[0]
        api.add_alloc("alloc-1", [card], "running", device="nvidia/gpu/H800")
        made = reserve(proc, [card], "during-drip")  # container_mounts "auto" asks the same API
        assert made["ok"] and made["seconds"] < 30, made
        grant = made["envs"]["LINGJUN_GRANT_ID"]
        started = time.monotonic()

        def deadlines_met() -> int:
            lines = proc.stderr_text().splitlines()
            return sum(1 for x in lines if "reconciler: Nomad API" in x and "timed out after" in x)

        wait_until(
            lambda: deadlines_met() >= 3, "the reconciler to fail three calls at their deadline, not hang on one", 90
        )
        took = time.monotonic() - started
        # Each call ends at its deadline (5 s, the client's timeout), then backs off (1 s, 2 s, ...): one
        # stalled call used to last over a minute.
        assert took < 60, took
        api.set_drip(None)
        wait_until(lambda: "is this host" in proc.stderr_text(), "the reconciler to recover", timeout=60)
        live_released = 0 if grant in sim.grants() else 1
    finally:
        proc.finish()
    scenario("slow-drip Nomad API", live_released=live_released)


# === 5. Tokens with newlines ==========================================================================
def _found(token: str, *texts: str) -> int:
    """How many of the token's spellings (raw, stripped, escaped, encoded, each line) appear in ``texts``."""
    forms = secret_forms(token) | secret_forms(token.strip())
    return sum(1 for form in forms for text in texts if form in text)


def _plugin_output(run: HostRun) -> str:
    events = [e for e in run if e.get("event") not in ("config_file", "config_decoded")]  # the host's echo
    return run.stderr + "\n".join(json.dumps(e) for e in events)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("where", ["config", "env"])
@pytest.mark.parametrize("newline", ["trailing", "inner"])
def test_a_token_with_a_newline_is_never_shown(
    sim: Simulator, api: NomadApiDouble, tmp_path: Path, where: str, newline: str
) -> None:
    """A trailing newline is stripped (the token works); one inside refuses the token; no spelling of it is shown."""
    canary = f"canary-{uuid.uuid4()}"
    token = f"{canary}\n" if newline == "trailing" else f"{canary[:20]}\n{canary[20:]}"
    api.require_token(canary)  # only the token without its trailing newline is right
    data = tmp_path / "data"
    config = xdm_config(sim.socket_dir, data, nomad_address=api.address, release_grace_period="1s")
    env = {"NOMAD_TOKEN": token} if where == "env" else None
    if where == "config":
        config["nomad_token"] = token
    outputs: list[str] = []
    if where == "config" and newline == "inner":  # SetConfig refuses it, without showing it
        run = run_host(
            ["--plugin", str(real_plugin()), "--config", "plugin.hcl", "--phase", "validate",
             "--expect-set-config", "error", *sets_of(config)],
            cwd=REPO,
        )  # fmt: skip
        (call,) = run.of("set_config")
        assert call["code"] == "InvalidArgument" and "nomad_token" in call["message"], call
        outputs.append(_plugin_output(run))
    else:
        proc, _ = launch_host(config, env=env)
        try:
            card = first_devices(proc)[0]
            api.add_alloc("alloc-1", [card], "running", device="nvidia/gpu/H800")
            made = reserve(proc, [card], "t")
            assert made["ok"], made
            wanted = "is this host" if newline == "trailing" else "control character"
            wait_until(lambda: wanted in proc.stderr_text(), f"the reconciler to log {wanted!r}", timeout=60)
            if newline == "trailing":
                assert any(t == canary for _, t in api.requests), "the stripped token was sent"
            else:
                assert all(not t for _, t in api.requests), "a token with a newline inside was sent"
        finally:
            outputs.append(_plugin_output(proc.finish()))
        outputs += _operator_tools(sim, api, data, token, where)
    scenario(f"token with a {newline} newline in {where}", token_found=_found(token, *outputs))


def _operator_tools(sim: Simulator, api: NomadApiDouble, data: Path, token: str, where: str) -> list[str]:
    """``grants``, ``grants --json`` and ``doctor --json`` with the same token: everything they print."""
    sets = {
        "backend": "xdm",
        "xdm_socket": str(sim.socket_dir / "dp2mgr.sock"),
        "config_socket": str(sim.socket_dir / "config-daemon.sock"),
        "data_dir": str(data),
        "nomad_address": api.address,
        "nvml_enrich": False,
    }
    if where == "config":
        sets["nomad_token"] = token
    args = [f"{k}={json.dumps(v)}" for k, v in sets.items()]
    env = {k: v for k, v in os.environ.items() if k != "NOMAD_TOKEN"}
    if where == "env":
        env["NOMAD_TOKEN"] = token
    outputs = []
    for command in (["grants"], ["grants", "--json"], ["doctor", "--json"]):
        flags = [x for a in args for x in ("--set", a)]
        done = subprocess.run(
            [str(real_plugin()), *command, *flags], capture_output=True, text=True, env=env, timeout=120, cwd=REPO
        )
        assert "Traceback" not in done.stderr, done.stderr
        outputs.append(done.stdout + done.stderr)
    return outputs


# === 6. data_dir ==============================================================================
def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.timeout(300)
def test_set_config_refuses_every_data_dir_that_can_never_be_the_plugins_own(tmp_path: Path) -> None:
    watched = [Path("/"), Path("/etc"), Path("/tmp"), REPO]
    before = {p: _mode(p) for p in watched}
    refused = {
        "": "empty",
        "relative/dir": "relative",
        "/": "system directory",
        "/etc": "system directory",
        "/tmp": "system directory",
        str(tmp_path / "a" / ".." / "b"): "'..'",
        str(tmp_path / "new\nline"): "control character",
        "/proc/self": "kernel or device filesystem",
    }
    for value, why in refused.items():
        run = run_host(
            ["--plugin", str(real_plugin()), "--config", "plugin.hcl", "--phase", "validate",
             "--expect-set-config", "error", *sets_of({"data_dir": value})],
            cwd=REPO,
        )  # fmt: skip
        assert run.returncode == 0, (value, run.describe())
        (call,) = run.of("set_config")
        assert call["code"] == "InvalidArgument" and "data_dir" in call["message"] and why in call["message"], call
    assert not (REPO / "journal.json").exists() and not (REPO / "plugin.lock").exists()
    changed = sum(1 for p, m in before.items() if _mode(p) != m)
    scenario(f"data_dir refused in SetConfig ({len(refused)} values)", mode_changed=changed)


@pytest.mark.timeout(300)
def test_a_directory_the_plugin_did_not_make_its_own_is_refused_and_left_as_it_was(
    sim: Simulator, tmp_path: Path
) -> None:
    """A shared (1777, 0777) or foreign directory: Reserve is refused with the reason; its mode stays.

    SetConfig does not look at the disk: a refusal there stops the whole agent, and a directory's state
    at boot may be passing. The plugin serves fingerprints and refuses Reserve until it is fixed.
    """
    sticky, open_dir, theirs = tmp_path / "shared", tmp_path / "open", tmp_path / "theirs"
    for directory, mode in ((sticky, 0o1777), (open_dir, 0o777), (theirs, 0o700)):
        directory.mkdir()
        os.chmod(directory, mode)
    os.chown(theirs, 65534, 65534)
    before = {p: _mode(p) for p in (sticky, open_dir, theirs)}
    for directory, why in ((sticky, "sticky"), (open_dir, "writable by other users"), (theirs, "owned by uid")):
        proc, _ = launch_host(xdm_config(sim.socket_dir, directory, reconcile=False))
        try:
            card = first_devices(proc)[0]
            answer = reserve(proc, [card], why)
        finally:
            run = proc.finish()
        assert answer["ok"] is False and answer["code"] == "Unavailable" and why in answer["message"], answer
        assert not list(directory.iterdir()), f"the plugin wrote into {directory}"
        assert not run.violations, run.describe()
    assert sim.grants() == {}
    changed = sum(1 for p, m in before.items() if _mode(p) != m)
    scenario("shared or foreign data_dir refused at start", mode_changed=changed, leaked=len(sim.grants()))


@pytest.mark.timeout(120)
def test_the_plugin_creates_its_own_data_dir_and_changes_no_other(sim: Simulator, tmp_path: Path) -> None:
    parent = tmp_path / "parent"
    parent.mkdir()
    os.chmod(parent, 0o751)
    data = parent / "a" / "data"
    old = os.umask(0)
    try:
        proc, _ = launch_host(xdm_config(sim.socket_dir, data, reconcile=False))
    finally:
        os.umask(old)
    try:
        card = first_devices(proc)[0]
        assert reserve(proc, [card], "r")["ok"]
    finally:
        proc.finish()
    assert (_mode(parent / "a"), _mode(data), _mode(data / "journal.json")) == (0o755, 0o700, 0o600)
    scenario("data_dir created by the plugin", mode_changed=int(_mode(parent) != 0o751))


# === 7. The Reserve content policy ================================================================
CARD0 = "GPU-00000000-aaaa-bbbb-cccc-000000000000"


def _crafted(xdm: FakeXdm, **parts: Any) -> None:
    """XDM answers Allocate with a grant of card 0 carrying ``parts`` (and holds it until released)."""

    def answer(request: pb.AllocateRequest) -> bytes:
        with xdm.lock:
            xdm.grants[request.id] = request
        return pb.AllocateResponse(
            id=request.id,
            devices=[pb.AllocatedDevice(minor=0, uuid=CARD0)],
            envs=parts.get("envs", {}),
            annotations=parts.get("annotations", {}),
            deviceSpecs=[
                pb.DeviceSpec(containerPath=t, hostPath=h, permissions=p) for t, h, p in parts.get("nodes", ())
            ],
            mounts=[pb.Mount(containerPath=t, hostPath=h, readOnly=ro) for t, h, ro in parts.get("mounts", ())],
        ).SerializeToString()

    xdm.raw["Allocate"] = answer


HOSTILE: dict[str, tuple[str, dict[str, Any]]] = {
    "/etc read-write": ("mount", {"mounts": [("/etc", "/etc", False)]}),
    "docker.sock": ("mount", {"mounts": [("/var/run/docker.sock", "/var/run/docker.sock", True)]}),
    "/dev/sda rwm": ("device", {"nodes": [("/dev/sda", "/dev/sda", "rwm")]}),
    "/dev/mem": ("device", {"nodes": [("/dev/mem", "/dev/mem", "r")]}),
    "LD_PRELOAD": ("env", {"envs": {"LD_PRELOAD": "/tmp/x.so"}}),
    "PATH": ("env", {"envs": {"PATH": "/tmp/bin"}}),
    "NOMAD_ALLOC_DIR=/etc": ("env", {"envs": {"NOMAD_ALLOC_DIR": "/etc"}}),
    "LD_PRELOAD through an annotation": ("env", {"annotations": {"LD_PRELOAD": "/tmp/x.so"}}),
    "NVIDIA_VISIBLE_DEVICES=all on one card": ("visibility", {"envs": {"NVIDIA_VISIBLE_DEVICES": "all"}}),
    "a 3 MB env value": ("size", {"envs": {"BIG": "x" * (3 << 20)}}),
    "10,000 device specs": ("size", {"nodes": [("/dev/nvidia0", "/dev/nvidia0", "rw")] * 10_000}),
}


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.timeout(300)
def test_a_hostile_grant_is_refused_released_and_counted(fake: tuple[FakeXdm, Path], tmp_path: Path) -> None:
    import httpx

    xdm, sockets = fake
    data = tmp_path / "data"
    port = _free_port()
    config = xdm_config(sockets, data, xdm_service="xdm.XpuDeviceManagerService", reconcile=False, metrics_port=port)
    leaked = 0
    proc, _ = launch_host(config)
    try:
        first_devices(proc)
        for n, (name, (rule, parts)) in enumerate(HOSTILE.items()):
            _crafted(xdm, **parts)
            answer = reserve(proc, [CARD0], n)
            assert answer["ok"] is False and answer["code"] == "FailedPrecondition", (name, answer)
            assert len(answer["message"]) < 4200, (name, len(answer["message"]))
            leaked += len(fake_grants(xdm))
            assert not journal_ids(data), name
        xdm.raw.pop("Allocate")
        assert reserve(proc, [CARD0], "clean")["ok"], "an ordinary grant still passes"
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    finally:
        proc.finish()
    counted = Counter(rule for rule, _ in HOSTILE.values())
    for rule, n in counted.items():
        line = f'lingjun_plugin_reserve_policy_violations_total{{rule="{rule}"}} {float(n)}'
        assert line in text, (line, [x for x in text.splitlines() if "policy" in x])
    scenario(f"hostile grants ({len(HOSTILE)})", leaked=leaked)


# === 8. XDM text that forges log lines and device names ==============================================
FORGED = "H800\n[ERROR] agent: FORGED-LINE\x1b[31m\r"


@pytest.mark.timeout(180)
def test_xdm_text_cannot_forge_a_log_line_or_a_device_name(fake: tuple[FakeXdm, Path], tmp_path: Path) -> None:
    xdm, sockets = fake
    for device in xdm.devices:
        device.model = FORGED
    xdm.refuse_allocate, xdm.error_mode = True, "grpc"
    xdm.refusal = "no memory\n[ERROR] agent: FORGED-LINE\x1b[2J\r"
    config = xdm_config(sockets, tmp_path / "data", xdm_service="xdm.XpuDeviceManagerService", reconcile=False)
    proc, _ = launch_host(config)
    try:
        fp = proc.wait_for(lambda e: e.get("event") == "fingerprint" and e.get("n_devices", 0) > 0, timeout=60)
        refused = reserve(proc, [CARD0], "refused")
    finally:
        run = proc.finish()
    names = [g["name"] for g in fp["groups"]]
    assert names and all(n.isprintable() and "/" not in n for n in names), names
    assert refused["ok"] is False and refused["code"] == "ResourceExhausted", refused
    assert refused["message"].isprintable(), refused["message"]
    lines = run.stderr.splitlines()
    assert not [x for x in lines if x.lstrip().startswith("[ERROR] agent: FORGED")], "a forged line in the agent log"
    assert "\x1b" not in run.stderr and "\r" not in run.stderr
    assert "FORGED-LINE" in run.stderr, "the refusal was logged (escaped), so the check saw it"
    scenario("XDM text forging log lines and names")


# === 9. Clear errors =============================================================================
@pytest.mark.timeout(180)
def test_clear_bounded_errors(sim: Simulator, tmp_path: Path) -> None:
    """10,000 IDs: a short INVALID_ARGUMENT; metrics_bind that is not an address: refused in SetConfig."""
    proc, _ = launch_host(xdm_config(sim.socket_dir, tmp_path / "data", reconcile=False))
    try:
        first_devices(proc)
        many = reserve(proc, [f"GPU-made-up-{i}" for i in range(10_000)], "many")
    finally:
        proc.finish()
    assert many["ok"] is False and many["code"] == "InvalidArgument", many
    assert len(many["message"]) < 1000 and "and 9995 more" in many["message"], many["message"][:300]
    run = run_host(
        ["--plugin", str(real_plugin()), "--config", "plugin.hcl", "--phase", "validate",
         "--expect-set-config", "error", *sets_of({"metrics_bind": "not an address", "metrics_port": 9999})],
        cwd=REPO,
    )  # fmt: skip
    (call,) = run.of("set_config")
    assert call["code"] == "InvalidArgument" and "metrics_bind" in call["message"], call
    scenario("clear errors: 10,000 IDs, metrics_bind")


@pytest.mark.timeout(180)
def test_an_oversized_list_and_watch_message_is_said_plainly(fake: tuple[FakeXdm, Path], tmp_path: Path) -> None:
    xdm, sockets = fake
    huge = pb.ListAndWatchResponse(
        devices=[pb.Device(minor=0, uuid=CARD0, model="H800", extenderResources={"blob": "x" * (17 << 20)})]
    ).SerializeToString()
    xdm.raw["ListAndWatch"] = lambda _request: huge
    config = xdm_config(sockets, tmp_path / "data", xdm_service="xdm.XpuDeviceManagerService", reconcile=False)
    proc, _ = launch_host(config)
    try:
        wait_until(
            lambda: "over the plugin's receive limit" in proc.stderr_text(),
            "the plugin to say what is wrong",
            timeout=60,
        )
        said = [x for x in proc.stderr_text().splitlines() if "over the plugin's receive limit" in x]
    finally:
        proc.finish()
    assert all("[ERROR]" in x for x in said), said[:2]
    scenario("ListAndWatch message over the limit")
