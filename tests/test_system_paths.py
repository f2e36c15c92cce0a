"""The guard of tests/conftest.py sees a created, changed or removed file (tried on a temporary tree)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.system_paths import EXTRA_ENV, SYSTEM_PATHS, changes, snapshot

REPO = Path(__file__).resolve().parent.parent


def test_guard_sees_every_kind_of_change(tmp_path: Path) -> None:
    root = tmp_path / "var-lib"
    (root / "sub").mkdir(parents=True)
    (root / "journal.json").write_text("{}")
    (root / "plugin.lock").write_text("1\n")
    roots = (str(root), str(tmp_path / "absent"))
    before = snapshot(roots)
    assert changes(before, snapshot(roots)) == []
    (root / "journal.json").write_text('{"a": 1}')
    os.chmod(root / "sub", 0o755 if (root / "sub").stat().st_mode & 0o777 != 0o755 else 0o700)
    (root / "plugin.lock").unlink()
    (root / "sub" / "new").write_text("")
    (tmp_path / "absent").mkdir()
    found = changes(before, snapshot(roots))
    assert f"changed {root / 'journal.json'}" in found
    assert f"changed {root / 'sub'}" in found
    assert f"removed {root / 'plugin.lock'}" in found
    assert f"created {root / 'sub' / 'new'}" in found
    assert f"created {tmp_path / 'absent'}" in found


def test_guard_watches_the_defaults_the_product_writes() -> None:
    assert "/var/lib/nomad-device-lingjun" in SYSTEM_PATHS
    assert "/run/amp" in SYSTEM_PATHS and "/var/cache/nomad-device-lingjun" in SYSTEM_PATHS
    assert any(p.startswith("/etc/nomad") for p in SYSTEM_PATHS)


def test_a_run_that_writes_a_guarded_path_fails(tmp_path: Path) -> None:
    """A pytest run (with this suite's conftest as a plugin) whose only test passes but writes into a
    guarded directory exits 1 and names the file."""
    guarded = tmp_path / "guarded"
    guarded.mkdir()
    test = tmp_path / "test_writer.py"
    test.write_text(f"def test_writes():\n    open({str(guarded / 'journal.json')!r}, 'w').write('x')\n")
    env = {**os.environ, EXTRA_ENV: str(guarded)}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider",
           "--rootdir", str(tmp_path), "-c", os.devnull, str(test)]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "1 passed" in proc.stdout and f"created {guarded / 'journal.json'}" in proc.stderr
    (tmp_path / "test_clean.py").write_text("def test_ok():\n    pass\n")
    clean = subprocess.run(
        [*cmd[:-1], str(tmp_path / "test_clean.py")], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert clean.returncode == 0, clean.stdout + clean.stderr
