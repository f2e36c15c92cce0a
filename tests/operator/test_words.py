"""What the operator commands say, through the real command (the console script).

Errors in words (no ``[Errno N]``, no tuple, "Nomad API" once); an unknown option gets "did you
mean" and a pointer to plugin.hcl; a schema mismatch makes fingerprint fail instead of showing
misread groups; doctor's summary counts its failures; a syntax error keeps its caret line; the
demo says what Power usage's numbers are; the README and the example jobs agree.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from nomad_plugin import PLUGIN_NAME
from nomad_plugin.cli.demo import POWER_NOTE
from nomad_plugin.sim import Simulator
from tests.conformance.hostlib import real_plugin
from tests.doubles.drifted_schemas import served_schema

REPO = Path(__file__).resolve().parents[2]
JOBS = REPO / "examples" / "jobs"


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(real_plugin()), *args], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, cwd="/"
    )


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port  # closed again: nothing listens there


def test_errors_in_words_not_pythons(tmp_path: Path) -> None:
    missing = cli("check-job", str(tmp_path / "nope.hcl"), "--profile", "h800-8")
    assert (missing.returncode, missing.stderr) == (
        2,
        f"check-job: {tmp_path / 'nope.hcl'}: No such file or directory\n",
    )
    address = f"http://127.0.0.1:{closed_port()}"
    settings = ["--set", f'nomad_address="{address}"', "--set", f'data_dir="{tmp_path / "d"}"']
    grants = cli("grants", "--json", *settings)
    doc = json.loads(grants.stdout)
    assert doc["nomad"]["error"] == "Nomad API /v1/agent/self: cannot connect: Connection refused", doc["nomad"]
    topology = cli("topology", "--address", address)
    assert topology.stderr == f"topology: {address}: Nomad API /v1/nodes: cannot connect: Connection refused\n"
    for said in (missing.stderr, grants.stdout, topology.stderr):
        assert "Errno" not in said and "Nomad API: Nomad API" not in said and "Error:" not in said


def test_an_unknown_option_gets_did_you_mean_and_plugin_hcl() -> None:
    done = cli("fingerprint", "--set", "tdm_share=4")
    assert done.returncode == 1
    assert done.stderr == (
        'fingerprint: config: unsupported argument "tdm_share" (Nomad refuses it: "No argument or block type is '
        'named "tdm_share""); did you mean "tdm_shares"?; plugin.hcl lists every option (nomad-device-lingjun '
        "doctor checks the node step by step)\n"
    )
    card = cli("fingerprint", "--set", 'card=[{matc="0"}]')  # a card block's few names are still listed
    assert 'did you mean "match"?; allowed: match, mode, share_percent, shares' in card.stderr


@pytest.fixture
def misread_xdm() -> Iterator[Simulator]:
    d = Path(tempfile.mkdtemp(prefix="wr-", dir="/tmp"))  # short: Unix socket paths
    try:
        with Simulator(d / "s", "h800-8", schema=served_schema("renumbered")) as sim:
            yield sim
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_a_schema_mismatch_fails_fingerprint_and_check_job_without_misread_groups(misread_xdm: Simulator) -> None:
    for args in ((), ("--json",)):
        done = cli("fingerprint", "--socket-dir", str(misread_xdm.socket_dir), *args)
        assert done.returncode == 1 and done.stdout == ""
        assert done.stderr.startswith("fingerprint: XDM schema mismatch: ListGpuInfo: ")
        assert "the plugin offers all 8 cards as unhealthy, under names read with the wrong schema" in done.stderr
        assert "xdm_schema" in done.stderr and done.stderr.count("\n") == 1
    job = str(JOBS / "whole-card.nomad.hcl")
    check = cli("check-job", job, "--socket-dir", str(misread_xdm.socket_dir))  # no verdict on misread groups
    assert check.returncode == 2 and check.stdout == ""
    assert check.stderr.startswith("check-job: cannot get the fingerprint: XDM schema mismatch: ListGpuInfo: ")


def test_doctors_summary_counts_the_failures(tmp_path: Path) -> None:
    done = cli(
        "doctor", "--json", "--set", f'xdm_socket="{tmp_path / "none.sock"}"', "--set", 'backend="xdm"',
        "--set", f'nomad_address="http://127.0.0.1:{closed_port()}"', "--set", f'data_dir="{tmp_path / "d"}"',
    )  # fmt: skip
    doc = json.loads(done.stdout)
    failed = list(dict.fromkeys(f["check"] for f in doc["findings"] if f["status"] == "fail"))
    count = sum(f["status"] == "fail" for f in doc["findings"])
    assert count >= 2 and failed[0] == "socket dp2mgr" and "nomad api" in failed
    assert doc["summary"].endswith(
        f"fix the {count} failures above ({', '.join(failed)}), starting with socket dp2mgr, then run doctor again"
    )


def test_a_syntax_error_keeps_its_caret_line(tmp_path: Path) -> None:
    agent = tmp_path / "agent.hcl"
    agent.write_text(f'plugin "{PLUGIN_NAME}" {{\n  config {{\n    tdm_shares = = 4\n  }}\n}}\n')
    done = cli("fingerprint", "--plugin-config", str(agent))
    assert done.returncode == 1
    first, source, caret, hint = done.stderr.splitlines()
    assert first.startswith(f"fingerprint: {agent}:3:18: not valid HCL: ")
    assert source.endswith("tdm_shares = = 4") and caret.strip() == "^"
    assert caret.index("^") == source.index("= = 4") + 2  # under the second "=", column 18
    assert hint == "(nomad-device-lingjun doctor checks the node step by step)"


def test_the_demo_says_what_power_usage_is() -> None:
    """nomad-device-nvidia (1.1.0 on, stats.go + nvml/driver_linux.go) sends the draw in mW over the
    draw in whole W; the plugin sends the same on XDM (here) and NVML (tests/nvml/official_oracle.py)."""
    doc = json.loads(cli("demo", "--json", "--seconds", "1").stdout)
    for inst in doc["stats"]["instances"]:
        power, draw = inst["stats"]["Power usage"], inst["stats"]["xdm.Power draw"]
        assert power["unit"] == "W" and power["denominator"] == power["value"] // 1000
        assert abs(power["value"] / 1000 - draw["value"]) < 1
    text = cli("demo", "--seconds", "1").stdout
    assert re.search(r"Power usage += \d+ / \d+ W", text) and POWER_NOTE in text


def test_the_readme_counts_the_cards_the_numa_example_asks_for() -> None:
    words = {"One": 1, "Two": 2, "Three": 3, "Four": 4}
    said = re.search(r"(\w+) cards inside one NUMA domain", (REPO / "README.md").read_text())
    assert said is not None
    asked = re.search(r"count = (\d+)", (JOBS / "two-cards-one-numa.nomad.hcl").read_text())
    assert asked is not None and words[said[1]] == int(asked[1])


def test_the_runtime_kit_controller_has_its_check_job_command() -> None:
    path = JOBS / "runtime-kit-controller.sysbatch.hcl"
    line = next(x for x in path.read_text().splitlines() if x.startswith("# check-job:"))
    args = [str(REPO / a) if a.startswith("examples/") else a for a in shlex.split(line.split(":", 1)[1])]
    done = cli("check-job", str(path), *args, "--json")
    doc = json.loads(done.stdout)
    assert done.returncode == 0  # a sysbatch job runs here when one of its groups does
    assert [g["outcome"] for g in doc["node_rules"]["groups"]] == ["place", "not_placed"]
