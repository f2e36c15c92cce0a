"""Every documented way in works, through the real command (the console script).

The demo on every simulator profile; profile nvml and the NVML backend on a machine without NVML
end at once with one line (on a machine with NVIDIA GPUs the nvml profile runs the demo); a reader
that closes stdout early stops every command quietly; doctor's plugin-file check knows this
plugin's files from any executable of the right name.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from nomad_plugin import PLUGIN_NAME, __version__
from nomad_plugin.nvml.lib import nvml_unavailable_reason
from nomad_plugin.sim.profiles import PROFILES
from tests.conformance.hostlib import real_plugin
from tests.operator.test_dist_launcher import STAND_IN_LAUNCHER, shipped_file

REPO = Path(__file__).resolve().parents[2]
NO_NVML = nvml_unavailable_reason()


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(real_plugin()), *args], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, cwd="/"
    )


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_the_demo_runs_on_every_profile(profile: str) -> None:
    done = cli("demo", "--json", "--seconds", "1", "--profile", profile)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["ok"] and doc["profile"] == profile
    spec = PROFILES[profile]
    res = doc["reservation"]
    assert res["group"] == f"{spec.vendor}/{spec.xpu_type}/{spec.model}" and len(res["ids"]) == 1
    fits_as_written = spec.vendor == "nvidia" and spec.memory_mib >= 79 * 1024
    if fits_as_written:
        assert res["job_source"] == "examples/jobs/whole-card.nomad.hcl"
    else:  # the example asks for nvidia/gpu with >= 79 GiB: the demo says why it asked for this node's card
        assert res["job_source"].startswith("whole-card.nomad.hcl for this node's cards; as written it does not")
        assert "mismatch" in res["job_source"] or "79 GiB" in res["job_source"]
        assert "('" not in res["job_source"]  # reasons in words, not a tuple's repr
    assert doc["health"]["sequence"] == ["healthy", "unhealthy", "healthy"]


def test_profile_nvml_runs_the_demo_or_says_in_one_line_why_not() -> None:
    demo = cli("demo", "--seconds", "1", "--profile", "nvml")
    check = cli("check-job", str(REPO / "examples/jobs/whole-card.nomad.hcl"), "--profile", "nvml")
    for done in (demo, check):
        assert "internal error" not in done.stderr and "Traceback" not in done.stderr
    if not NO_NVML:  # a machine with NVIDIA GPUs: the demo mirrors them
        assert demo.returncode == 0, demo.stderr
        return
    assert demo.returncode == 1
    assert demo.stderr.startswith("demo: profile nvml presents this machine's NVIDIA GPUs: NVML is not usable here")
    assert demo.stderr.count("\n") == 1
    assert check.returncode == 2
    assert check.stderr == (
        "check-job: cannot get the fingerprint: profile nvml presents this machine's NVIDIA GPUs: "
        + demo.stderr.split("GPUs: ", 1)[1]
    )


@pytest.mark.parametrize(
    "args",
    [("demo", "--seconds", "1"), ("doctor",), ("fingerprint", "--profile", "h800-8", "--detail"), ("--help",)],
    ids=lambda a: a[0],
)
def test_a_reader_that_goes_away_stops_the_command_quietly(args: tuple[str, ...], tmp_path: Path) -> None:
    """``nomad-device-lingjun demo | head -1``: the shell's pipeline; the command's stderr says nothing."""
    err = tmp_path / "stderr"
    done = subprocess.run(
        ["sh", "-c", '"$0" "$@" 2>"$ERR" | head -1', str(real_plugin()), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={"ERR": str(err), "PATH": "/usr/bin:/bin"},
        cwd=tmp_path,
    )
    assert done.returncode == 0 and done.stdout.count("\n") == 1, done.stderr
    assert err.read_text() == ""


@pytest.mark.skipif(not NO_NVML, reason="this machine has NVML: the NVML backend reads its GPUs")
def test_the_nvml_backend_without_nvml_fails_at_once_in_one_line(tmp_path: Path) -> None:
    fingerprint = cli("fingerprint", "--set", 'backend="nvml"')
    assert fingerprint.returncode == 1
    assert fingerprint.stderr.startswith("fingerprint: the NVML backend cannot read the cards: NVML ")
    assert fingerprint.stderr.count("\n") == 1 and "plugin log" not in fingerprint.stderr
    doctor = cli("doctor", "--json", "--set", 'backend="nvml"', "--set", f'data_dir="{tmp_path / "d"}"')
    assert doctor.returncode == 1
    assert doctor.stderr == ""  # no NVML backend log lines: it never started
    (nvml,) = [f for f in json.loads(doctor.stdout)["findings"] if f["check"] == "nvml"]
    assert nvml["status"] == "fail" and nvml["summary"].startswith("the NVML backend cannot read the cards: nvmlInit")


def plugin_file_finding(plugins: Path, tmp_path: Path) -> dict[str, str]:
    done = cli("doctor", "--json", "--plugin-dir", str(plugins), "--set", f'data_dir="{tmp_path / "data"}"')
    (finding,) = [f for f in json.loads(done.stdout)["findings"] if f["check"] == "plugin file"]
    return finding


def test_doctor_knows_this_plugin_from_a_file_of_the_same_name(tmp_path: Path) -> None:
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    exe = plugins / PLUGIN_NAME

    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    found = plugin_file_finding(plugins, tmp_path)
    assert found["status"] == "fail", found
    assert found["summary"] == (
        f"{exe} is named like this plugin but is neither the shipped file (launcher and bundle) nor the console "
        "script of a pip install"
    )

    shipped_file(exe, __version__)
    found = plugin_file_finding(plugins, tmp_path)
    assert found["status"] == "ok", found
    assert found["summary"] == (
        f"{exe} is the shipped file, version {__version__}, executable and matched by its plugin block"
    )

    exe.write_bytes(STAND_IN_LAUNCHER)  # the launcher alone: no bundle
    found = plugin_file_finding(plugins, tmp_path)
    assert found["status"] == "fail" and found["summary"].endswith(
        "its bundle is missing or damaged (no bundle line at its end)"
    )

    shipped_file(exe, __version__)
    exe.write_bytes(exe.read_bytes()[:-200] + exe.read_bytes()[-120:])  # cut from the archive's end
    found = plugin_file_finding(plugins, tmp_path)
    assert found["status"] == "fail" and "(the file is not as long as its last line says)" in found["summary"], found

    shutil.copy("/bin/true", exe)  # an executable, but no launcher of this plugin
    found = plugin_file_finding(plugins, tmp_path)
    assert found["status"] == "fail" and found["summary"].endswith("nor the console script of a pip install"), found

    shipped_file(exe, "0.0.1")
    found = plugin_file_finding(plugins, tmp_path)
    assert found["status"] == "warn" and f"version 0.0.1; this doctor is version {__version__}" in found["summary"]

    exe.unlink()
    shutil.copy(real_plugin(), exe)  # the console script of this install
    found = plugin_file_finding(plugins, tmp_path)
    assert found["status"] == "ok" and found["summary"].startswith(f"{exe} is the console script of /"), found
