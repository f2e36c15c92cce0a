"""Every command of the shipped file under adverse conditions: never a traceback, never a ``PYI-`` line.

``dist/nomad-device-lingjun`` (``make dist``; tests/operator/test_dist.py says when a missing file
fails or skips) runs each command with unreadable paths, an absent XDM (no socket), a dead XDM
(stale socket files that refuse connections), paths longer than a Unix socket can hold, stdout
closed by its reader, and as ``nobody`` through ``setpriv`` (a non-root operator), with no Python
on PATH. Each case must end with an exit status (no signal) and no Python traceback, no
"Exception ignored" and no PyInstaller ``[PYI-...]`` line on either stream.

The check-job cases with ``inf`` and ``nan`` values depend on check-job's own handling of those
numbers.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from nomad_plugin.cli.main import SUBCOMMANDS
from tests.operator.test_dist import CACHE_ENV, dist  # noqa: F401 - the fixture

NOBODY = 65534
SETPRIV = shutil.which("setpriv")
# "internal error" is main's last resort (nomad_plugin/cli/main.py): no traceback, but a case to handle.
FORBIDDEN = ("Traceback (most recent call last)", "Exception ignored", "[PYI-", "internal error")


@dataclass
class World:
    """A directory any user can traverse: tools, caches, socket dirs and files for the cases."""

    root: Path
    bin: Path = field(init=False)

    def __post_init__(self) -> None:
        self.bin = self.root / "bin"

    def path(self, *parts: str) -> Path:
        return self.root.joinpath(*parts)


def _stale_socket(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.close()  # the file stays and refuses connections: XDM died


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    root = Path(tempfile.mkdtemp(prefix="adv-", dir="/tmp"))  # short: socket paths
    root.chmod(0o755)
    w = World(root)
    w.bin.mkdir()  # PATH: empty, as the launcher needs no tool
    for d in ("cache-root", "cache-nobody", "home-nobody", "home-root", "open"):
        w.path(d).mkdir()
        w.path(d).chmod(0o777)
    closed = w.path("root700")
    (closed / "data").mkdir(parents=True)
    closed.chmod(0o700)  # root's, like /var/lib: nobody cannot enter
    for name in ("dp2mgr.sock", "config-daemon.sock", "xdm-sim-control.sock"):
        _stale_socket(w.path("stale", name))
    w.path("unreadable.hcl").write_text('plugin "nomad-device-lingjun" {\n  config {}\n}\n')
    w.path("unreadable.hcl").chmod(0)
    w.path("garbage.json").write_text("{ not json")
    w.path("agent.hcl").write_text('plugin "nomad-device-lingjun" {\n  config {\n    backend = "xdm"\n  }\n}\n')
    long_dir = w.path("l" * 60, "o" * 60)
    long_dir.mkdir(parents=True)
    jobs = {
        "inf-count": "count = 1e999",
        "nan-value": 'count = 1\n      constraint {\n        attribute = "${device.attr.memory}"\n'
        '        operator = ">="\n        value = "nan GiB"\n      }',
        "inf-value": 'count = 1\n      constraint {\n        attribute = "${device.attr.memory}"\n'
        '        operator = ">="\n        value = "inf MiB"\n      }',
    }
    for name, body in jobs.items():
        w.path(f"{name}.nomad.hcl").write_text(
            'job "j" {\n  group "g" {\n    task "t" {\n      driver = "raw_exec"\n      config { command = "true" }\n'
            f'      resources {{\n        device "nvidia/gpu" {{\n      {body}\n        }}\n      }}\n    }}\n  }}\n}}\n'
        )
    try:
        yield w
    finally:
        closed.chmod(0o755)
        shutil.rmtree(root, ignore_errors=True)


@dataclass(frozen=True)
class Case:
    name: str
    argv: tuple[str, ...]  # after the executable; {w} is the world's root
    nobody: bool = False
    closed_stdout: bool = False
    timeout: float = 120


def _cases() -> list[Case]:
    long_sock = "{w}/" + "l" * 60 + "/" + "o" * 60 + "/dp2mgr.sock"
    stale = "{w}/stale"
    absent = "{w}/absent"
    xdm_stale = ("--set", f'xdm_socket="{stale}/dp2mgr.sock"', "--set", f'config_socket="{stale}/config-daemon.sock"')
    xdm_absent = (
        "--set",
        f'xdm_socket="{absent}/dp2mgr.sock"',
        "--set",
        f'config_socket="{absent}/config-daemon.sock"',
    )
    data_open = ("--set", 'data_dir="{w}/open/data"')
    data_closed = ("--set", 'data_dir="{w}/root700/data"')
    xdm = ("--set", 'backend="xdm"')
    cases = [
        Case("usage", ()),
        Case("version", ("--version",)),
        Case("unknown command", ("doctr",)),
        Case("serve without the cookie", ("serve",)),
        Case("help closed stdout", ("--help",), closed_stdout=True),
        *(Case(f"{name} --help closed stdout", (name, "--help"), closed_stdout=True) for name in SUBCOMMANDS),
        *(Case(f"{name} bad flag", (name, "--no-such-flag")) for name in SUBCOMMANDS),
        # doctor
        Case("doctor absent XDM", ("doctor", *xdm_absent, *data_open, "--set", "reconcile=false")),
        Case("doctor dead XDM", ("doctor", *xdm_stale, *data_open, "--set", "reconcile=false")),
        Case("doctor long socket path", ("doctor", "--set", f'xdm_socket="{long_sock}"', *data_open)),
        Case("doctor unreadable config, nobody", ("doctor", "--plugin-config", "{w}/unreadable.hcl"), nobody=True),
        Case("doctor data_dir under root 0700, nobody", ("doctor", *data_closed, *xdm_stale), nobody=True),
        Case("doctor plugin_dir under root 0700, nobody", ("doctor", "--plugin-dir", "{w}/root700/data"), nobody=True),
        Case("doctor config dir under root 0700, nobody", ("doctor", "--plugin-config", "{w}/root700"), nobody=True),
        Case("doctor closed stdout", ("doctor", *xdm_absent, *data_open), closed_stdout=True),
        Case("doctor missing xdm_schema", ("doctor", "--set", 'xdm_schema="{w}/absent/api.proto"', *data_open)),
        # fingerprint
        Case("fingerprint absent XDM", ("fingerprint", *xdm, *xdm_absent)),
        Case("fingerprint dead XDM", ("fingerprint", *xdm, *xdm_stale, "--timeout", "10")),
        Case("fingerprint long socket path", ("fingerprint", *xdm, "--set", f'xdm_socket="{long_sock}"')),
        Case("fingerprint as nobody", ("fingerprint", *xdm, *xdm_stale), nobody=True),
        Case("fingerprint closed stdout", ("fingerprint", "--profile", "h800-8"), closed_stdout=True),
        Case(
            "fingerprint unreadable config, nobody",
            ("fingerprint", "--plugin-config", "{w}/unreadable.hcl"),
            nobody=True,
        ),
        # xdm-probe
        Case("xdm-probe absent XDM", ("xdm-probe", "--socket-dir", absent)),
        Case("xdm-probe dead XDM", ("xdm-probe", "--socket-dir", stale)),
        Case("xdm-probe long socket dir", ("xdm-probe", "--socket-dir", str(Path(long_sock).parent))),
        Case(
            "xdm-probe capture under root 0700, nobody",
            ("xdm-probe", "--socket-dir", stale, "--capture", "{w}/root700/capture"),
            nobody=True,
        ),
        Case("xdm-probe closed stdout", ("xdm-probe", "--socket-dir", stale), closed_stdout=True),
        # xdm-sim
        Case("xdm-sim long socket dir", ("xdm-sim", "--socket-dir", "{w}/" + "s" * 120)),
        Case("xdm-sim socket dir under root 0700, nobody", ("xdm-sim", "--socket-dir", "{w}/root700/s"), nobody=True),
        Case(
            "xdm-sim emit-schema under root 0700, nobody",
            ("xdm-sim", "--emit-schema", "{w}/root700/schema"),
            nobody=True,
        ),
        Case(
            "xdm-sim unreadable state file, nobody",
            ("xdm-sim", "--socket-dir", "{w}/open/s", "--state-file", "{w}/unreadable.hcl"),
            nobody=True,
            timeout=20,
        ),
        Case("xdm-sim ctl absent", ("xdm-sim", "ctl", "--socket-dir", absent, "status")),
        Case("xdm-sim ctl dead", ("xdm-sim", "ctl", "--socket-dir", stale, "status")),
        # grants
        Case("grants absent data_dir", ("grants", "--set", 'data_dir="{w}/absent/data"')),
        Case("grants data_dir is a file", ("grants", "--set", 'data_dir="{w}/garbage.json"')),
        Case("grants data_dir under root 0700, nobody", ("grants", *data_closed), nobody=True),
        Case("grants release nothing", ("grants", "release", "no-such-grant", "--set", 'data_dir="{w}/absent/d"')),
        Case("grants closed stdout", ("grants", *data_open), closed_stdout=True),
        # check-job
        Case("check-job missing file", ("check-job", "{w}/absent.nomad.hcl", "--profile", "h800-8")),
        Case(
            "check-job unreadable file, nobody", ("check-job", "{w}/unreadable.hcl", "--profile", "h800-8"), nobody=True
        ),
        Case(
            "check-job garbage fingerprint",
            ("check-job", "{w}/inf-value.nomad.hcl", "--fingerprint", "{w}/garbage.json"),
        ),
        Case("check-job inf count", ("check-job", "{w}/inf-count.nomad.hcl", "--profile", "h800-8")),
        Case("check-job nan value", ("check-job", "{w}/nan-value.nomad.hcl", "--profile", "h800-8")),
        Case("check-job inf value", ("check-job", "{w}/inf-value.nomad.hcl", "--profile", "h800-8")),
        Case("check-job absent XDM", ("check-job", "{w}/inf-value.nomad.hcl", *xdm, *xdm_absent)),
        # demo
        Case("demo closed stdout", ("demo", "--seconds", "1"), closed_stdout=True, timeout=180),
    ]
    return cases


CASES = _cases()


def _env(world: World, nobody: bool) -> dict[str, str]:
    who = "nobody" if nobody else "root"
    return {
        "PATH": str(world.bin),
        "HOME": str(world.path(f"home-{who}")),
        CACHE_ENV: str(world.path(f"cache-{who}")),
        "PYTHONHOME": str(world.path("absent-python")),
        "PYTHONPATH": str(world.path("absent-python")),
        "LANG": "C.UTF-8",
    }


def _run(dist_file: Path, world: World, case: Case) -> tuple[int, str]:
    argv = [a.replace("{w}", str(world.root)) for a in case.argv]
    cmd = [str(dist_file), *argv]
    if case.nobody:
        assert SETPRIV is not None
        cmd = [SETPRIV, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--", *cmd]
    stdout_r, stdout_w = os.pipe()
    stderr_r, stderr_w = os.pipe()
    if case.closed_stdout:
        os.close(stdout_r)  # the reader went away before the command wrote a byte (`| head -0`)
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=stdout_w, stderr=stderr_w, env=_env(world, case.nobody),
                            cwd=world.root)  # fmt: skip
    os.close(stdout_w)
    os.close(stderr_w)
    with (
        os.fdopen(stderr_r, "rb") as err,
        open(os.devnull, "rb") if case.closed_stdout else os.fdopen(stdout_r, "rb") as out,
    ):
        try:
            code = proc.wait(timeout=case.timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise AssertionError(f"{case.name}: still running after {case.timeout} s") from None
        text = (b"" if case.closed_stdout else out.read()) + err.read()
    return code, text.decode(errors="replace")


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_no_traceback(case: Case, dist: Path, world: World) -> None:  # noqa: F811 - dist is the fixture
    if case.nobody and (SETPRIV is None or os.geteuid() != 0):
        pytest.skip("needs root and setpriv to run a case as nobody")
    if case.nobody:
        mode = stat.S_IMODE(os.stat(dist).st_mode)
        assert mode & 0o005 == 0o005, f"{dist} must be readable and executable by others ({oct(mode)})"
    code, output = _run(dist, world, case)
    for marker in FORBIDDEN:
        assert marker not in output, f"{case.name}: exit {code}\n{output[-4000:]}"
    assert code >= 0, f"{case.name}: killed by signal {-code}\n{output[-2000:]}"
    if not case.closed_stdout and code != 0:
        assert output.strip(), f"{case.name}: exit {code} and nothing said why"
