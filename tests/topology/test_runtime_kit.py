"""``runtime-kit status|enable|disable`` against the XDM simulator's config-daemon.

The simulator counts every RPC it receives, so each test also says exactly
which of Enable/Disable were called (none when the node is already as asked,
none before the operator confirms).
"""

from __future__ import annotations

import io
import json
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

import pytest

from nomad_plugin.cli import runtime_kit
from nomad_plugin.journal import EntryState, Journal, JournalEntry
from nomad_plugin.model.grant import DeviceAsk
from nomad_plugin.sim import Simulator
from tests.doubles.drifted_schemas import served_schema


@pytest.fixture
def sim() -> Iterator[Simulator]:
    directory = Path(tempfile.mkdtemp(prefix="rk-", dir="/tmp"))  # short: Unix socket paths
    try:
        with Simulator(directory / "s", "h800-8") as s:
            yield s
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def run(
    sim: Simulator,
    capsys: pytest.CaptureFixture[str],
    *argv: str,
    data_dir: Path | None = None,
    answer: bool | None = None,
) -> tuple[int, str, str]:
    sets = ["--set", f'config_socket="{sim.config_path}"']
    if data_dir is not None:
        sets += ["--set", f'data_dir="{data_dir}"']
    asked: list[str] = []

    def ask(question: str, _in: TextIO, _out: TextIO) -> bool | None:
        asked.append(question)
        return answer

    code = runtime_kit.main([*argv, *sets], ask=ask)
    out, err = capsys.readouterr()
    return code, out + "".join(f"\n[asked] {q}" for q in asked), err


def switches(sim: Simulator) -> dict[str, int]:
    calls = sim.calls()
    return {name: calls.get(name, 0) for name in ("Enable", "Disable")}


def test_status_disable_status_enable(sim: Simulator, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, _ = run(sim, capsys, "status")
    assert code == 0 and "Runtime Kit on this node: enabled" in out
    code, out, _ = run(sim, capsys, "disable", "--yes", data_dir=tmp_path)
    assert code == 0 and "Runtime Kit: enabled -> disabled (Disable answered success: disabled)" in out, out
    assert sim.status()["enabled"] is False
    code, out, _ = run(sim, capsys, "status", "--json")
    assert code == 0 and json.loads(out)["status"] == "disabled"
    code, out, _ = run(sim, capsys, "enable", "--yes", "--json")
    doc = json.loads(out)
    assert code == 0 and (doc["before"], doc["after"], doc["done"]) == ("disabled", "enabled", True)
    assert switches(sim) == {"Enable": 1, "Disable": 1}


def test_nothing_is_called_when_already_as_asked(sim: Simulator, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(sim, capsys, "enable", "--yes")
    assert code == 0 and "already enabled on this node: nothing changed" in out
    assert switches(sim) == {"Enable": 0, "Disable": 0}


def test_confirmation_is_asked_and_no_means_no(
    sim: Simulator, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, _ = run(sim, capsys, "disable", data_dir=tmp_path, answer=False)
    assert code == 1 and "not changed" in out and "[asked] Disable Runtime Kit on this node" in out
    assert "off-peak" in out and switches(sim)["Disable"] == 0
    code, _, err = run(sim, capsys, "disable", data_dir=tmp_path, answer=None)  # no terminal
    assert code == 2 and "--yes" in err and switches(sim)["Disable"] == 0
    code, out, _ = run(sim, capsys, "disable", data_dir=tmp_path, answer=True)
    assert code == 0 and "enabled -> disabled" in out and switches(sim)["Disable"] == 1


def test_disable_refuses_while_the_plugin_holds_grants(
    sim: Simulator, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    journal = Journal(tmp_path)
    card = sim.cards[0].uuid
    journal.put(
        JournalEntry(
            "g-1", (card,), "nvidia/gpu/NVIDIA H800", "whole", (card,), (DeviceAsk(0),), time.time()
        ).with_state(EntryState.GRANTED)
    )
    journal.close()
    code, _, err = run(sim, capsys, "disable", "--yes", data_dir=tmp_path)
    assert code == 1 and "holds 1 grant(s)" in err and "nomad node drain" in err and "--force" in err
    assert switches(sim)["Disable"] == 0
    code, out, _ = run(sim, capsys, "disable", "--yes", "--force", data_dir=tmp_path)
    assert code == 0 and "enabled -> disabled" in out
    code, out, _ = run(sim, capsys, "enable", "--yes", data_dir=tmp_path)  # enabling never waits for grants
    assert code == 0 and "disabled -> enabled" in out


def test_a_failed_switch_says_nothing_changed(
    sim: Simulator, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    sim.config_fail = True  # Enable and Disable answer success: false while set
    code, _, err = run(sim, capsys, "disable", "--yes", data_dir=tmp_path)
    assert code == 1 and "Disable answered failure: disable failed (simulated)" in err
    assert "QueryStatus still says enabled: nothing changed" in err
    assert sim.status()["enabled"] is True


def test_config_daemon_missing(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code = runtime_kit.main(["status", "--set", f'config_socket="{tmp_path}/none.sock"'])
    err = capsys.readouterr().err
    assert code == 1 and "none.sock" in err and "config-daemon running" in err


def test_bad_config_is_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert runtime_kit.main(["status", "--set", 'config_socket="relative.sock"']) == 2
    assert "config_socket" in capsys.readouterr().err


def test_binds_config_daemons_own_schema_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    """A foreign schema (other packages, every field renumbered) read through config-daemon's reflection."""
    directory = Path(tempfile.mkdtemp(prefix="rkf-", dir="/tmp"))
    try:
        with Simulator(directory / "s", "m890p-8", schema=served_schema("foreign"), reflection=True) as foreign:
            code, out, _ = run(foreign, capsys, "disable", "--yes", "--force")
            assert code == 0 and "enabled -> disabled" in out, out
            code, out, _ = run(foreign, capsys, "status")
            assert "disabled" in out and "ljrk.controller.v1.AmpConfigService" in out and "reflection" in out
            assert switches(foreign) == {"Enable": 0, "Disable": 1}
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def test_confirm_needs_a_terminal() -> None:
    assert runtime_kit.confirm("q?", io.StringIO("y\n"), io.StringIO()) is None
