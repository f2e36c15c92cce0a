"""The Go programs the tests run are built by ``make go-tools``, never under a test's timeout.

The fixtures only ask each build script's ``problem()`` whether its binaries are there and built from
the current sources; a missing or stale build is named with the make target that fixes it. And no
test module calls a build function: one that did would compile Go (minutes with a cold cache on a
loaded box) inside some test's timeout again (``hostlib.build_host`` is there for scripts only).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from types import ModuleType

import pytest

from tests.conformance.hostlib import REPO, build_module
from tests.jobspec.oracle import build as oracle_build

pytestmark = pytest.mark.skipif(shutil.which("go") is None, reason="`go` is not installed (make go-deps)")


def point_at(monkeypatch: pytest.MonkeyPatch, module: ModuleType, bin_dir: Path, *names: str) -> list[Path]:
    """Make ``module`` look for its build in ``bin_dir``; return the binaries' paths there."""
    monkeypatch.setattr(module, "BIN_DIR", bin_dir)
    paths = [bin_dir / getattr(module, name).name for name in names]
    for name, path in zip(names, paths, strict=True):
        monkeypatch.setattr(module, name, path)
    return paths


@pytest.mark.parametrize("which", ["host", "oracle"])
def test_a_missing_or_stale_build_names_the_make_target(
    which: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = build_module() if which == "host" else oracle_build
    names = ("BINARY", "TEST_BINARY") if which == "host" else ("BINARY",)
    binaries = point_at(monkeypatch, module, tmp_path, *names)
    why = module.problem()
    assert "is not built" in why and "`make go-tools`" in why, why
    for path in binaries:
        path.write_bytes(b"")
    (tmp_path / ".stamp").write_text("built from older sources")
    why = module.problem()
    assert "was built from other" in why and "`make go-tools`" in why, why
    (tmp_path / ".stamp").write_text(module._stamp())
    assert module.problem() == ""


def test_no_test_module_builds_go() -> None:
    calls = re.compile(r"\bbuild_host\(|\bbuild\.build\(|\bbuild_module\(\)\.build\(")
    offenders = [
        str(path.relative_to(REPO))
        for path in sorted((REPO / "tests").rglob("*.py"))
        if path.name not in ("build.py", "hostlib.py") and path != Path(__file__) and calls.search(path.read_text())
    ]
    assert offenders == [], f"these build Go under a test's timeout; use built_host() / problem(): {offenders}"
