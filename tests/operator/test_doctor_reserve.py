"""doctor finds what breaks Reserve.

Real files, the XDM simulator on Unix sockets, the recorded NVML double, and
a real subprocess for the closed-pipe case.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nomad_plugin import PLUGIN_NAME
from nomad_plugin.cli import doctor
from nomad_plugin.nvml.lib import NvmlMissing
from nomad_plugin.sim import Simulator
from tests.doubles.fake_pynvml import NVML_ERROR_GPU_IS_LOST, FakeNvml, NVMLError, h100

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def sim() -> Iterator[Simulator]:
    directory = Path(tempfile.mkdtemp(prefix="docr-", dir="/tmp"))  # short: Unix socket paths
    try:
        with Simulator(directory / "s", "h800-8") as s:
            yield s
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def findings(capsys: pytest.CaptureFixture[str], argv: list[str], host: doctor.Host) -> tuple[int, dict[str, dict]]:
    if not any(a.startswith("data_dir=") for a in argv):  # never the default, a real node's data dir
        argv = [*argv, "--set", f'data_dir="{host.root.parent / "data"}"']
    code = doctor.main([*argv, "--json"], host)
    doc = json.loads(capsys.readouterr().out)
    return code, {f["check"]: f for f in doc["findings"]}


def xdm_args(sim: Simulator, *extra: str) -> list[str]:
    return [
        "--set",
        f'xdm_socket="{sim.dp2mgr_path}"',
        "--set",
        f'config_socket="{sim.config_path}"',
        "--set",
        "reconcile=false",
        *extra,
    ]


def host(tmp_path: Path, **kw: object) -> doctor.Host:
    return doctor.Host(root=tmp_path / "root", **kw)  # type: ignore[arg-type]


# --- data_dir ----------------------------------------------------------------------------------


def test_unusable_data_dir_fails_with_the_reason(sim: Simulator, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    # A path that can never be the plugin's own is SetConfig's refusal, and doctor's config finding.
    code, found = findings(capsys, xdm_args(sim, "--set", 'data_dir="/proc/nope"'), host(tmp_path))
    assert code == 1
    assert found["config"]["status"] == "fail" and "data_dir" in found["config"]["summary"]
    assert "/proc/nope" in found["config"]["summary"] and "kernel or device filesystem" in found["config"]["summary"]
    blocker = tmp_path / "file"
    blocker.write_text("")
    code, found = findings(capsys, xdm_args(sim, "--set", f'data_dir="{blocker}/journal"'), host(tmp_path))
    assert code == 1
    assert found["data dir"]["status"] == "fail" and str(blocker) in found["data dir"]["summary"]
    assert "Reserve refuses every request" in found["data dir"]["next_step"]
    _, found = findings(capsys, xdm_args(sim, "--set", f'data_dir="{blocker}"'), host(tmp_path))
    assert "not a directory" in found["data dir"]["summary"]


def test_usable_data_dir_passes_and_is_left_as_found(sim: Simulator, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    target = tmp_path / "a" / "b" / "journal"
    _, found = findings(capsys, xdm_args(sim, "--set", f'data_dir="{target}"'), host(tmp_path))
    assert found["data dir"]["status"] == "ok"
    assert not (tmp_path / "a").exists()  # the probe removed what it created


# --- unhealthy cards ----------------------------------------------------------------------------


def test_unhealthy_card_is_named_with_its_reason(sim: Simulator, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    sim.set_health(3, False, "XID 79: GPU has fallen off the bus")
    try:
        deadline = time.monotonic() + 10
        while True:
            _, found = findings(capsys, xdm_args(sim), host(tmp_path))
            if found["card health"]["status"] != "ok" or time.monotonic() > deadline:
                break
            time.sleep(0.1)
    finally:
        sim.set_health(3, True)
    health = found["card health"]
    assert health["status"] == "warn", "awaited the unhealthy card in doctor's inventory"
    assert "1 of 8 cards unhealthy" in health["summary"] and "minor 3" in health["summary"]
    assert "XID 79" in health["summary"] and "fallen off the bus" in health["next_step"]


# --- NVML ----------------------------------------------------------------------------------------


def test_nvml_backend_is_checked_with_card_health(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    fake = FakeNvml([h100(0), h100(1)])
    real_pci = fake.nvmlDeviceGetPciInfo

    def pci_info(handle):  # type: ignore[no-untyped-def]
        if handle.gpu is fake.gpus[1]:  # enumerated, then fell off the bus while being read
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        return real_pci(handle)

    fake.nvmlDeviceGetPciInfo = pci_info  # type: ignore[method-assign]
    argv = ["--set", 'backend="nvml"', "--set", "reconcile=false", "--set", f'data_dir="{tmp_path / "d"}"']
    code, found = findings(capsys, argv, host(tmp_path, nvml_loader=lambda: fake))
    assert found["sockets"]["status"] == "skip"
    assert found["nvml"]["status"] == "ok" and "2 cards" in found["nvml"]["summary"]
    sick = found["nvml cards"]
    assert sick["status"] == "warn" and "minor 1" in sick["summary"] and "GPU is lost" in sick["summary"]
    assert code == 0  # warnings only


def test_auto_without_xdm_socket_uses_nvml_and_reports_it_missing(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    def missing() -> object:
        raise NvmlMissing("the NVML backend needs the Python package nvidia-ml-py")

    argv = [
        "--set",
        f'xdm_socket="{tmp_path / "none.sock"}"',
        "--set",
        "reconcile=false",
        "--set",
        f'data_dir="{tmp_path / "d"}"',
    ]
    code, found = findings(capsys, argv, host(tmp_path, nvml_loader=missing, nvml_usable=lambda: True))
    assert code == 1 and found["nvml"]["status"] == "fail"
    assert "nvidia-ml-py" in found["nvml"]["summary"] and "libnvidia-ml" in found["nvml"]["next_step"]


# --- agent config directory, JSON, missing block -------------------------------------------------


def test_config_directory_with_a_json_agent_file(sim: Simulator, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    conf = tmp_path / "nomad.d"
    conf.mkdir()
    (conf / "00-client.hcl").write_text("client {\n  enabled = true\n}\n")
    (conf / "10-plugin.json").write_text(
        json.dumps({"plugin": {PLUGIN_NAME: {"config": {"xdm_socket": str(sim.dp2mgr_path), "tdm_shares": 4}}}})
    )
    (conf / "README.txt").write_text("not read by Nomad")
    argv = ["--plugin-config", str(conf), "--set", f'config_socket="{sim.config_path}"', "--set", "reconcile=false"]
    _, found = findings(capsys, argv, host(tmp_path))
    assert found["config"]["status"] == "ok", found["config"]
    assert found["xdm"]["status"] == "ok"


def test_missing_plugin_block_says_nomad_will_not_run_it(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    conf = tmp_path / "nomad.d"
    conf.mkdir()
    (conf / "client.hcl").write_text('plugin "docker" {\n  config {}\n}\n')
    code, found = findings(capsys, ["--plugin-config", str(conf)], host(tmp_path))
    assert code == 1 and found["config"]["status"] == "fail"
    assert f'no plugin "{PLUGIN_NAME}" block' in found["config"]["summary"]
    step = found["config"]["next_step"]
    assert "Nomad >= 1.10 does not run" in step and f'plugin "{PLUGIN_NAME}"' in step and "restart" in step


def test_plugin_defined_twice_across_files_is_a_warning(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """The agent merges the files' plugin blocks (PluginConfigSetMerge: the later file's config wins);
    doctor accepts what the agent accepts and warns which block counts."""
    conf = tmp_path / "nomad.d"
    conf.mkdir()
    for name, mode in (("a.hcl", "mig"), ("b.hcl", "tdm")):
        (conf / name).write_text(f'plugin "{PLUGIN_NAME}" {{\n  config {{\n    default_mode = "{mode}"\n  }}\n}}\n')
    argv = ["--plugin-config", str(conf), "--config-only", "--set", f'data_dir="{tmp_path / "data"}"']
    code, found = findings(capsys, argv, host(tmp_path))
    assert code == 0
    assert found["config"]["status"] == "ok"
    warning = found["plugin block"]
    assert warning["status"] == "warn" and "defined 2 times" in warning["summary"], warning
    assert str(conf / "b.hcl") + ":1" in warning["summary"].split("uses the one at")[1]


# --- nomad-device-nvidia in the same plugin_dir --------------------------------------------------


def test_nvidia_plugin_beside_ours_is_a_warning(sim: Simulator, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    for name in (PLUGIN_NAME, "nomad-device-nvidia"):
        (plugins / name).write_text("#!/bin/sh\n")
        (plugins / name).chmod(0o755)
    _, found = findings(capsys, [*xdm_args(sim), "--plugin-dir", str(plugins)], host(tmp_path))
    warning = found["nvidia plugin"]
    assert warning["status"] == "warn" and "nomad-device-nvidia" in warning["summary"]
    assert "enabled = false" in warning["next_step"] and "ignored_gpu_ids" in warning["next_step"]
    (plugins / "nomad-device-nvidia").unlink()
    _, found = findings(capsys, [*xdm_args(sim), "--plugin-dir", str(plugins)], host(tmp_path))
    assert "nvidia plugin" not in found


# --- a closed pipe ---------------------------------------------------------------------------------


def test_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "nomad_plugin", "doctor", "--set", "reconcile=false"]
    argv += ["--set", f'data_dir="{tmp_path / "data"}"']
    argv += ["--set", f'xdm_socket="{tmp_path / "none.sock"}"', "--set", 'backend="xdm"']
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader went away before doctor wrote a line (`doctor | head -0`)
    err = proc.stderr.read().decode()
    code = proc.wait(timeout=60)
    assert "Traceback" not in err and "BrokenPipe" not in err, err
    assert code == 141


def test_card_block_matching_no_card_is_a_doctor_warning(sim: Simulator, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    agent = tmp_path / "agent.hcl"
    agent.write_text(
        f'plugin "{PLUGIN_NAME}" {{\n  config {{\n    include_types = ["gpus"]\n'
        f'    card {{\n      match = "NVIDIA H80"\n      mode = "tdm"\n    }}\n  }}\n}}\n'
    )
    _, found = findings(capsys, ["--plugin-config", str(agent), *xdm_args(sim)], host(tmp_path))
    warning = found["config vs cards"]
    assert warning["status"] == "warn"
    assert "card[0] match = 'NVIDIA H80' matches no card" in warning["summary"]
    assert "include_types value 'gpus'" in warning["summary"]
    _, found = findings(capsys, xdm_args(sim), host(tmp_path))
    assert found["config vs cards"]["status"] == "ok"


def test_broken_agent_hcl_is_named_by_line_and_column(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    agent = tmp_path / "agent.hcl"
    agent.write_text(f'plugin "{PLUGIN_NAME}" {{\n  config {{\n    tdm_shares = 4 4\n  }}\n}}\n')
    code, found = findings(capsys, ["--plugin-config", str(agent)], host(tmp_path))
    summary = found["config"]["summary"]
    assert code == 1 and f"{agent}:3:20: not valid HCL" in summary and "Token(" not in summary
