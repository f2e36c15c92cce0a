"""The environment that runs the tests is exactly the one requirements.lock describes.

A dependency that arrives outside the lock (a new release picked up by an unpinned name, a
package installed by hand) fails here, naming it, instead of changing what lint, mypy or the
tests see on the day it is released.
"""

from __future__ import annotations

import importlib.metadata
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LOCK = REPO / "requirements.lock"
PROJECT = "nomad-device-lingjun"


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pins() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in LOCK.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        name, sep, version = line.partition("==")
        assert sep and version.strip(), f"requirements.lock: {line!r} is not an exact pin (name==version)"
        pins[_canonical(name)] = version.strip()
    return pins


def _installed() -> dict[str, str]:
    return {
        _canonical(dist.metadata["Name"]): dist.version
        for dist in importlib.metadata.distributions()
        if dist.metadata["Name"] and _canonical(dist.metadata["Name"]) != PROJECT
    }


def test_every_installed_distribution_is_pinned_at_its_locked_version() -> None:
    pins = _pins()
    outside = {name: version for name, version in _installed().items() if pins.get(name) != version}
    described = ", ".join(
        f"{name} {version} (lock: {pins.get(name, 'not pinned')})" for name, version in sorted(outside.items())
    )
    assert not outside, (
        f"installed outside requirements.lock: {described}; run `make lock` to take a new version on purpose"
    )


def test_the_lock_pins_the_tools_that_lint_type_check_and_test() -> None:
    pins = _pins()
    for tool in (
        "mypy",
        "ruff",
        "pytest",
        "types-protobuf",
        "grpc-stubs",
        "pyinstaller",
        "ziglang",
        "setuptools",
        "pip",
    ):
        assert tool in pins, f"requirements.lock pins no {tool}"


def test_the_shipped_file_build_installs_its_tools_at_the_locked_versions() -> None:
    sys.path.insert(0, str(REPO / "tools"))
    try:
        import build_dist
        import build_python
    finally:
        sys.path.remove(str(REPO / "tools"))
    pins = _pins()
    assert build_dist.PYINSTALLER == f"pyinstaller=={pins['pyinstaller']}"
    assert build_python.ZIGLANG == f"ziglang=={pins['ziglang']}"
    assert build_dist.LOCK == LOCK


def test_the_makefile_installs_through_the_lock() -> None:
    makefile = (REPO / "Makefile").read_text()
    installs = [line for line in makefile.splitlines() if "pip install" in line]
    assert installs, "the Makefile installs nothing with pip"
    for line in installs:
        assert "PIP_CONSTRAINT=$(LOCK)" in line, f"Makefile installs outside the lock: {line.strip()}"
