"""Installing the package prints nothing: no setuptools deprecation, no notice box.

The README's two commands start with ``make venv``, an editable install of this project;
people who take the package itself run ``pip install .``. setuptools' warnings reach the
terminal through pip even with ``-q``, so each install here runs through the real pip and the
real build backend, quiet, as the Makefile runs them, and its output must be empty.

The build runs on a copy of the project in a temporary directory, offline: ``--no-build-isolation``
takes the build backend from this environment, where the lock pins it at the version that
``PIP_CONSTRAINT`` gives pip's isolated build environment in ``make venv``.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# What setuptools reads to build the package: its metadata, the README it embeds, the code.
PROJECT_FILES = ("pyproject.toml", "README.md")
PACKAGE = "nomad_plugin"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    copy = tmp_path / "project"
    copy.mkdir()
    for name in PROJECT_FILES:
        shutil.copy2(ROOT / name, copy / name)
    shutil.copytree(ROOT / PACKAGE, copy / PACKAGE, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def _pip_quiet(*args: str) -> subprocess.CompletedProcess[str]:
    # The machine's pip configuration (indexes, find-links, its own constraints) stays out of it.
    env = {key: value for key, value in os.environ.items() if not key.startswith("PIP_") and key != "PYTHONWARNINGS"}
    env |= {"PIP_CONFIG_FILE": os.devnull, "PIP_CONSTRAINT": str(ROOT / "requirements.lock")}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "-q",
            "--disable-pip-version-check",
            "--no-input",
            *args,
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def _said(run: subprocess.CompletedProcess[str]) -> str:
    return (run.stdout + run.stderr).strip()


def test_an_editable_install_as_make_venv_does_it_prints_nothing_and_points_at_the_project(
    project: Path, tmp_path: Path
) -> None:
    prefix = tmp_path / "prefix"
    # --ignore-installed: without it pip uninstalls this environment's own install of the project.
    run = _pip_quiet("install", "--ignore-installed", "--prefix", str(prefix), "-e", str(project))
    assert run.returncode == 0, _said(run)
    assert _said(run) == "", f"an editable install printed:\n{_said(run)}"

    site = prefix / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    pth = list(site.glob("*.pth"))
    assert [p.read_text().split() for p in pth] == [[str(project.resolve())]], [p.name for p in pth]
    assert (prefix / "bin" / "nomad-device-lingjun").is_file()
    assert importlib.metadata.distribution("nomad-device-lingjun").files, "the tests' own install was removed"


def test_a_wheel_build_prints_nothing_and_holds_only_the_package_with_its_spdx_licence(
    project: Path, tmp_path: Path
) -> None:
    out = tmp_path / "wheels"
    run = _pip_quiet("wheel", "-w", str(out), str(project))
    assert run.returncode == 0, _said(run)
    assert _said(run) == "", f"a wheel build printed:\n{_said(run)}"

    (wheel,) = out.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = next(archive.read(n).decode() for n in names if n.endswith(".dist-info/METADATA"))
    top = {name.split("/", 1)[0] for name in names}
    assert top == {PACKAGE, f"{'-'.join(wheel.name.split('-')[:2])}.dist-info"}, top
    sources = {path.relative_to(project).as_posix() for path in (project / PACKAGE).rglob("*.py")}
    assert sources and sources == {name for name in names if name.endswith(".py")}
    assert "License-Expression: MPL-2.0" in metadata.splitlines()
