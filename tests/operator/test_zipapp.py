"""tools/build_zipapp.py builds one executable; Nomad-style launch hand-shakes through it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from nomad_plugin import PLUGIN_NAME, __version__
from nomad_plugin.launcher import PluginProcess

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def zipapp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist") / PLUGIN_NAME
    result = subprocess.run(
        [sys.executable, str(REPO / "tools/build_zipapp.py"), "--output", str(out)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr
    assert "grpcio" in result.stdout and "protobuf" in result.stdout
    return out


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "NOMAD_PLUGIN_MAGIC_COOKIE")}
    clean["SHIV_ROOT"] = str(tmp_path / "shiv")
    clean["PATH"] = os.pathsep.join(p for p in clean.get("PATH", "").split(os.pathsep) if ".venv" not in p)
    return clean


def test_single_executable_file(zipapp: Path) -> None:
    assert zipapp.stat().st_mode & 0o111
    first = zipapp.read_bytes()[:64].split(b"\n", 1)[0]
    assert first == f"#!/usr/bin/env python{sys.version_info.major}.{sys.version_info.minor}".encode()
    assert 2 * 2**20 < zipapp.stat().st_size < 40 * 2**20


def test_handshake_through_the_zipapp(zipapp: Path, env: dict[str, str], tmp_path: Path) -> None:
    proc = PluginProcess([str(zipapp)], env=env, handshake_timeout=60)
    with proc:
        assert proc.handshake is not None and proc.handshake.address.endswith("plugin.sock")
        info = proc.plugin_info()
        assert (info.type, info.name, info.version) == ("DEVICE", PLUGIN_NAME, __version__)
    assert proc.proc is not None and proc.proc.returncode == 0
    assert proc.extra_stdout == []  # nothing but the handshake line on stdout
    assert (tmp_path / "shiv").is_dir()  # extracted under SHIV_ROOT, not ~/.shiv


def test_behaves_like_the_console_script_without_the_cookie(zipapp: Path, env: dict[str, str], tmp_path: Path) -> None:
    usage = subprocess.run([str(zipapp)], env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert usage.returncode == 1 and "This binary is a plugin" in usage.stderr and usage.stdout == ""
    version = subprocess.run([str(zipapp), "--version"], env=env, capture_output=True, text=True, timeout=60)
    assert version.stdout.strip() == f"{PLUGIN_NAME} {__version__}"
    check = subprocess.run(
        [str(zipapp), "check-job", str(REPO / "examples/jobs/raw-exec-env.nomad.hcl"), "--profile", "h800-8"],
        env=env, capture_output=True, text=True, timeout=90, cwd=tmp_path,
    )  # fmt: skip
    assert check.returncode == 0, check.stderr
    assert "served by nvidia/gpu/NVIDIA H800" in check.stdout
