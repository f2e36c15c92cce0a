"""``runtime-kit`` and ``doctor`` on a config-daemon whose schema the plugin cannot verify.

A real simulator process serving the ``renumbered`` schema (``python -m tests.doubles.drifted_sim``: the
product's simulator with the reconstruction's names, other numbers, no server reflection: a node's likely
first day) serves on Unix sockets in a temp dir, and the real
``nomad-device-lingjun`` executable runs each command. Runtime Kit is enabled there; read with the
built-in numbers, its answer would say "disabled". Every command must say "unknown, because ...",
name ``xdm_schema``, and send neither Enable nor Disable: the simulator's own call counts (``ctl
status``) prove it. Turning reflection on (a verified binding) makes the same commands work, so the
refusal comes from the binding, not from a broken simulator.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nomad_plugin import PLUGIN_NAME
from nomad_plugin.sim.control import send_command
from tests.waiting import DEADLINE_S, wait_until

EXECUTABLE = Path(sys.executable).parent / PLUGIN_NAME  # the console script `pip install -e .` made
ROOT = Path(__file__).resolve().parents[2]
DRIFTED_SIM = [sys.executable, "-m", "tests.doubles.drifted_sim"]  # the product's simulator, a drifted schema


class SimProcess:
    def __init__(self, directory: Path, schema: str) -> None:
        self.dir = directory
        where = ["--profile", "h800-8", "--socket-dir", str(directory)]
        # the reconstruction is the product's own `xdm-sim`; a drifted schema is the test double's
        program = [str(EXECUTABLE), "xdm-sim"] if schema == "builtin" else [*DRIFTED_SIM, "--schema", schema]
        self.proc = subprocess.Popen(
            [*program, *where],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        control = directory / "xdm-sim-control.sock"
        wait_until(lambda: control.exists() or self.proc.poll() is not None, f"xdm-sim's control socket {control}")
        assert self.proc.poll() is None, self.proc.communicate()[1]

    def ctl(self, *argv: str) -> Any:
        return send_command(self.dir / "xdm-sim-control.sock", list(argv))

    def switches(self) -> dict[str, int]:
        calls = self.ctl("status")["calls"]
        assert calls.get("QueryStatus", 0) > 0, calls  # the counter sees config-daemon's calls
        return {name: calls.get(name, 0) for name in ("Enable", "Disable")}

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.communicate(timeout=DEADLINE_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.communicate()


@pytest.fixture
def workdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="rku-", dir="/tmp"))  # short: Unix socket paths
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def start(workdir: Path, schema: str) -> Iterator[SimProcess]:
    sim = SimProcess(workdir / "s", schema)
    try:
        yield sim
    finally:
        sim.stop()


@pytest.fixture
def renumbered(workdir: Path) -> Iterator[SimProcess]:
    yield from start(workdir, "renumbered")


@pytest.fixture
def builtin(workdir: Path) -> Iterator[SimProcess]:
    yield from start(workdir, "builtin")


def command(sim: SimProcess, *argv: str) -> subprocess.CompletedProcess[str]:
    sets = [
        *("--set", f'xdm_socket="{sim.dir / "dp2mgr.sock"}"'),
        *("--set", f'config_socket="{sim.dir / "config-daemon.sock"}"'),
        *("--set", f'data_dir="{sim.dir.parent / "data"}"'),
        *("--set", 'nomad_address="http://127.0.0.1:9"'),
    ]
    return subprocess.run(
        [str(EXECUTABLE), *argv, *sets],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        stdin=subprocess.DEVNULL,
    )


def test_status_reads_unknown_not_disabled(renumbered: SimProcess) -> None:
    done = command(renumbered, "runtime-kit", "status")
    assert done.returncode == 1, done
    assert "Runtime Kit on this node: unknown, because" in done.stdout and "xdm_schema" in done.stdout, done.stdout
    assert "disabled" not in done.stdout and "Traceback" not in done.stderr
    done = command(renumbered, "runtime-kit", "status", "--json")
    doc = json.loads(done.stdout)
    assert done.returncode == 1 and (doc["status"], doc["enabled"]) == ("unknown", None), doc
    assert "xdm_schema" in doc["reason"]
    assert renumbered.ctl("status")["enabled"] is True
    assert renumbered.switches() == {"Enable": 0, "Disable": 0}


@pytest.mark.parametrize("argv", [["enable", "--yes"], ["disable", "--yes", "--force"]])
def test_enable_and_disable_refuse_unsent(renumbered: SimProcess, argv: list[str]) -> None:
    done = command(renumbered, "runtime-kit", *argv)
    assert done.returncode == 1, done
    assert "unknown, because" in done.stderr and "xdm_schema" in done.stderr, done.stderr
    assert "nothing was sent to config-daemon" in done.stderr and "Traceback" not in done.stderr
    assert renumbered.switches() == {"Enable": 0, "Disable": 0}
    assert renumbered.ctl("status")["enabled"] is True


def test_under_reflection_the_same_commands_read_and_switch(renumbered: SimProcess) -> None:
    renumbered.ctl("reflection", "on")
    done = command(renumbered, "runtime-kit", "status")
    assert done.returncode == 0 and "Runtime Kit on this node: enabled" in done.stdout, done
    done = command(renumbered, "runtime-kit", "disable", "--yes")
    assert done.returncode == 0 and "enabled -> disabled" in done.stdout, done
    assert renumbered.switches() == {"Enable": 0, "Disable": 1}
    assert renumbered.ctl("status")["enabled"] is False


def doctor_finding(sim: SimProcess, check: str) -> dict[str, str]:
    done = command(sim, "doctor", "--json", "--root", str(sim.dir.parent))
    assert done.returncode in (0, 1) and "Traceback" not in done.stderr, done
    found = [f for f in json.loads(done.stdout)["findings"] if f["check"] == check]
    assert len(found) == 1, found
    return found[0]


def test_doctor_says_unknown_and_names_xdm_schema(renumbered: SimProcess) -> None:
    found = doctor_finding(renumbered, "runtime kit")
    assert found["status"] == "warn" and "unknown, because" in found["summary"], found
    assert "disabled" not in found["summary"] and "xdm_schema" in found["next_step"], found
    assert renumbered.switches() == {"Enable": 0, "Disable": 0}


def test_doctor_next_step_for_a_disabled_runtime_kit_is_ours(builtin: SimProcess) -> None:
    builtin.ctl("disable")
    found = doctor_finding(builtin, "runtime kit")
    assert found["status"] == "fail" and "disabled" in found["summary"], found
    step = found["next_step"]
    assert "`nomad-device-lingjun runtime-kit enable`" in step and "sysbatch" in step, step
    assert "label" not in step, step  # Kubernetes' node label means nothing to a Nomad node
    assert builtin.switches() == {"Enable": 0, "Disable": 0}


def test_an_empty_answer_reads_disabled_under_any_numbering(renumbered: SimProcess) -> None:
    """Disabled, config-daemon answers QueryStatus with no field at all: that reads "disabled" whatever the
    numbers, so enable goes ahead; its answer and the status after it do not fit, and the command says so."""
    renumbered.ctl("disable")
    done = command(renumbered, "runtime-kit", "status")
    assert done.returncode == 0 and "Runtime Kit on this node: disabled" in done.stdout, done
    done = command(renumbered, "runtime-kit", "enable", "--yes")
    assert done.returncode == 1, done
    assert "Enable answered (no readable success field), but QueryStatus reads unknown, because" in done.stderr
    assert "nothing changed" not in done.stderr and "xdm_schema" in done.stderr, done.stderr
    assert renumbered.switches() == {"Enable": 1, "Disable": 0}
    assert renumbered.ctl("status")["enabled"] is True
