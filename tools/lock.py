"""Refresh ``requirements.lock``: the exact versions every tool of this repo installs.

``make venv`` (and so ``make test`` and ``.ci/run``), the shipped file's build venv
(tools/build_dist.py) and its Zig (tools/build_python.py) all install through this one
constraints file, so a release of any dependency changes nothing here until someone runs
``make lock`` on purpose, reviews the diff and fixes what the new versions break.

pyproject.toml keeps ranges for the runtime dependencies (people who ``pip install`` the
package resolve them themselves); the lock pins what this repo's own builds and tests use.

    python3 tools/lock.py            # resolve the newest releases, write requirements.lock
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LOCK = REPO / "requirements.lock"
# Installed beside the project's extras so that their versions are locked too: the shipped
# file's bundler and the compiler its Python is built with, and pip's own build tools.
BUILD_TOOLS = ("pyinstaller", "ziglang", "pip", "setuptools", "wheel")
HEADER = """\
# Exact versions of everything this repo installs: the dev and test tools, the runtime
# dependencies, the shipped file's build tools. Refreshed on purpose with `make lock`
# (tools/lock.py); never edited by hand. tests/test_lock.py fails when the environment that
# runs the tests holds anything else.
"""


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="lock-") as tmp:
        venv = Path(tmp) / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
        subprocess.run([*pip, "install", "-q", "--upgrade", *BUILD_TOOLS], check=True)
        subprocess.run([*pip, "install", "-q", "-e", f"{REPO}[dev,nvml]"], check=True)
        frozen = subprocess.run(
            [*pip, "freeze", "--all", "--exclude-editable"], check=True, capture_output=True, text=True
        ).stdout
    pins = sorted((line for line in frozen.splitlines() if "==" in line), key=lambda pin: pin.split("==")[0].lower())
    LOCK.write_text(HEADER + "\n".join(pins) + "\n")
    print(f"lock: {len(pins)} pins written to {LOCK.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
