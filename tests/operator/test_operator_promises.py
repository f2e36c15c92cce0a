"""What the operator commands promise, each through the real command (the console script).

doctor judges only the plugin file and leaves the data dir as found; xdm-probe's QueryStatus
section names config-daemon.sock; a second xdm-sim refuses a socket directory already served, or
one too long for a Unix socket; fingerprint stops at the first clear cause in one line and prints
one line per group; "did you mean" for commands and options; group_by's warning names the levels
that exist; help without reStructuredText markup; "share", a mode name no release accepted, is refused
with a warning.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nomad_plugin import PLUGIN_NAME
from nomad_plugin.cli.main import SUBCOMMANDS
from nomad_plugin.sim import Simulator
from tests.conformance.hostlib import real_plugin


def cli(*args: str, timeout: float = 120, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(real_plugin()), *args], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, **kw
    )  # type: ignore[call-overload]


def findings(proc: subprocess.CompletedProcess[str]) -> list[dict[str, str]]:
    found: list[dict[str, str]] = json.loads(proc.stdout)["findings"]
    return found


@pytest.fixture
def short_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="op-", dir="/tmp"))  # short: Unix socket paths
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def sim() -> Iterator[Simulator]:
    d = Path(tempfile.mkdtemp(prefix="ops-", dir="/tmp"))
    try:
        with Simulator(d / "s", "h800-8") as s:
            yield s
    finally:
        shutil.rmtree(d, ignore_errors=True)


def sockets(sim: Simulator) -> list[str]:
    return ["--set", f'xdm_socket="{sim.dp2mgr_path}"', "--set", f'config_socket="{sim.config_path}"']


# --- doctor ------------------------------------------------------------------------------------


def test_doctor_judges_only_the_plugin_file(tmp_path: Path) -> None:
    """The README's "copy both files": the .sha256 beside the plugin is not a plugin (Nomad skips
    files without an execute bit)."""
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    shutil.copy(real_plugin(), plugins / PLUGIN_NAME)  # this install's console script
    (plugins / f"{PLUGIN_NAME}.sha256").write_text(f"{'0' * 64}  {PLUGIN_NAME}\n")
    proc = cli("doctor", "--json", "--plugin-dir", str(plugins), "--set", f'data_dir="{tmp_path / "data"}"')
    plugin = [f for f in findings(proc) if f["check"] in ("plugin file", "plugin dir")]
    assert [f["status"] for f in plugin] == ["ok"], plugin
    assert ".sha256" not in json.dumps(plugin)
    (plugins / PLUGIN_NAME).chmod(0o644)
    proc = cli("doctor", "--json", "--plugin-dir", str(plugins), "--set", f'data_dir="{tmp_path / "data"}"')
    (bad,) = [f for f in findings(proc) if f["check"] == "plugin file"]
    assert bad["status"] == "fail" and bad["summary"].endswith(f"{PLUGIN_NAME} is not executable")


def test_doctor_leaves_the_data_dir_as_found(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    lock = data / "plugin.lock"
    lock.write_text("4242\n")
    old = time.time() - 3600
    os.utime(lock, (old, old))
    os.utime(data, (old, old))
    before = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in data.iterdir()}
    proc = cli("doctor", "--json", "--set", f'data_dir="{data}"', "--set", "reconcile=false")
    assert {f["check"]: f["status"] for f in findings(proc)}["data dir"] == "ok"
    after = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in data.iterdir()}
    assert after == before
    assert abs(data.stat().st_mtime - old) < 1, "the probe file doctor wrote and removed changed the directory"


def test_doctor_sees_the_running_plugin_without_writing_its_lock(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    with open(data / "plugin.lock", "w") as held:  # the plugin holds it for its whole life
        held.write("777\n")
        held.flush()
        fcntl.flock(held, fcntl.LOCK_EX)
        proc = cli("doctor", "--json", "--set", f'data_dir="{data}"', "--set", "reconcile=false")
        assert (data / "plugin.lock").read_text() == "777\n"
    grants = [f for f in findings(proc) if f["check"] == "grants"]
    assert grants and "a plugin runs on this data_dir" in grants[0]["summary"], grants


def test_the_never_released_mode_name_share_is_refused_naming_the_choices(tmp_path: Path) -> None:
    agent = tmp_path / "agent.hcl"
    agent.write_text(f'plugin "{PLUGIN_NAME}" {{\n  config {{\n    default_mode = "share"\n  }}\n}}\n')
    proc = cli("doctor", "--config-only", "--json", "--plugin-config", str(agent))
    failed = [f for f in findings(proc) if f["status"] == "fail"]
    assert proc.returncode == 1 and failed and "default_mode" in failed[0]["summary"], proc.stdout
    assert "tdm" in failed[0]["summary"] and "share" in failed[0]["summary"]


def test_doctor_did_you_mean_for_an_option(tmp_path: Path) -> None:
    agent = tmp_path / "agent.hcl"
    agent.write_text(f'plugin "{PLUGIN_NAME}" {{\n  config {{\n    defualt_mode = "tdm"\n  }}\n}}\n')
    proc = cli("doctor", "--config-only", "--plugin-config", str(agent))
    assert proc.returncode == 1
    assert 'unsupported argument "defualt_mode"' in proc.stdout and 'did you mean "default_mode"?' in proc.stdout


def test_group_by_warning_lists_the_levels(sim: Simulator, tmp_path: Path) -> None:
    proc = cli("doctor", *sockets(sim), "--set", 'group_by="numaNode"', "--set", "reconcile=false",
               "--set", f'data_dir="{tmp_path / "data"}"')  # fmt: skip
    lines = proc.stdout.splitlines()
    (warning,) = [line for line in lines if "group_by 'numaNode'" in line]
    assert "did you mean 'numaNodes'?" in warning
    assert "levels on this node: cpuSockets, leafSwitch, numaNodes, pcieSwitches, pointOfDelivery" in warning
    assert lines[-1].startswith("doctor: ") and "warning(s)" in lines[-1]


def test_unknown_command_did_you_mean() -> None:
    proc = cli("fingreprint")
    assert proc.returncode == 2 and "unknown command 'fingreprint'; did you mean 'fingerprint'?" in proc.stderr


# --- xdm-probe -----------------------------------------------------------------------------------


def _stale(path: Path) -> None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    s.close()


def test_xdm_probe_query_status_names_config_daemon(short_dir: Path) -> None:
    for name in ("dp2mgr.sock", "config-daemon.sock"):
        _stale(short_dir / name)  # XDM died: both files refuse connections
    proc = cli("xdm-probe", "--socket-dir", str(short_dir))
    section = proc.stdout.split("== QueryStatus", 1)[1]
    assert "config-daemon.sock" in section and "dp2mgr.sock" not in section, section
    (short_dir / "config-daemon.sock").unlink()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(short_dir / "config-daemon.sock"))
    listener.listen()
    try:  # config-daemon answers the connect; dp2mgr (where the schema is bound) is dead
        proc = cli("xdm-probe", "--socket-dir", str(short_dir), "--set", 'xdm_call_timeout="2s"')
    finally:
        listener.close()
    section = proc.stdout.split("== QueryStatus", 1)[1]
    assert f"QueryStatus was not sent to {short_dir / 'config-daemon.sock'}" in section, section


# --- xdm-sim ---------------------------------------------------------------------------------------


def _wait_for(predicate: object, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.1)


def _answers(path: Path) -> bool:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(str(path))
        return True
    except OSError:
        return False
    finally:
        s.close()


def test_second_xdm_sim_refuses_and_leaves_the_first_alone(short_dir: Path) -> None:
    first = subprocess.Popen([str(real_plugin()), "xdm-sim", "--socket-dir", str(short_dir), "--quiet"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        _wait_for(lambda: _answers(short_dir / "dp2mgr.sock") and _answers(short_dir / "config-daemon.sock"))
        inodes = {p.name: p.stat().st_ino for p in short_dir.glob("*.sock")}
        second = cli("xdm-sim", "--socket-dir", str(short_dir), timeout=60)
        assert second.returncode == 2
        assert "served by a running process" in second.stderr and "Traceback" not in second.stderr
        assert {p.name: p.stat().st_ino for p in short_dir.glob("*.sock")} == inodes
        assert _answers(short_dir / "dp2mgr.sock") and first.poll() is None
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=60)
    assert not list(short_dir.glob("*.sock")), "the first simulator removes its own sockets when it stops"


def test_xdm_sim_waits_for_nobody_holding_the_lock(short_dir: Path) -> None:
    """A simulator still starting holds the directory's lock before its sockets exist."""
    with open(short_dir / "xdm-sim.lock", "w") as held:
        held.write("4321\n")
        held.flush()
        fcntl.flock(held, fcntl.LOCK_EX)
        proc = cli("xdm-sim", "--socket-dir", str(short_dir), timeout=60)
    assert proc.returncode == 2 and "another xdm-sim (pid 4321)" in proc.stderr
    assert not list(short_dir.glob("*.sock"))


def test_xdm_sim_socket_dir_too_long(short_dir: Path) -> None:
    long_dir = short_dir / ("d" * 110)
    proc = cli("xdm-sim", "--socket-dir", str(long_dir), timeout=60)
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert "is too long" in line and "at most 107" in line


# --- fingerprint -------------------------------------------------------------------------------------


def test_fingerprint_without_xdm_stops_at_the_first_cause(short_dir: Path) -> None:
    """One line naming the socket, no hclog JSON; it does not wait out --timeout (600 s here, far
    beyond the subprocess's own limit)."""
    proc = cli("fingerprint", "--set", 'backend="xdm"', "--set", f'xdm_socket="{short_dir / "dp2mgr.sock"}"',
               "--timeout", "600", timeout=90)  # fmt: skip
    assert proc.returncode == 1 and proc.stdout == ""
    (line,) = proc.stderr.strip().splitlines()
    assert f"XDM socket {short_dir / 'dp2mgr.sock'} does not exist" in line
    assert "@level" not in line and "{" not in line


def test_fingerprint_tdm_is_one_line_per_group() -> None:
    compact = cli("fingerprint", "--profile", "h800-8", "--set", 'default_mode="tdm"')
    assert compact.returncode == 0, compact.stderr
    lines = compact.stdout.splitlines()
    assert len(lines) <= 16, compact.stdout
    assert lines[2].split()[:3] == ["GROUP", "INSTANCES", "HEALTHY"]
    assert sum(1 for line in lines if line.startswith("nvidia/gpu-share/NVIDIA H800 card")) == 8
    detail = cli("fingerprint", "--profile", "h800-8", "--set", 'default_mode="tdm"', "--detail")
    assert len(detail.stdout.splitlines()) > 200 and "Device Group Attributes:" in detail.stdout


# --- help ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", [*SUBCOMMANDS, "xdm-sim ctl"])
def test_help_is_plain_text(command: str) -> None:
    proc = cli(*command.split(), "--help")
    assert proc.returncode == 0, proc.stderr
    for markup in ("``", ":class:`", ":func:`", ":mod:`", ".. "):
        assert markup not in proc.stdout, f"{command} --help shows {markup!r}:\n{proc.stdout}"
