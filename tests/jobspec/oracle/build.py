"""Build the Go oracle: Go's own strconv, strings, regexp, HashiCorp's go-version and hcl/v2 with cty.

GOPATH mode, no modules, no network, as ``tests/conformance/build.py`` builds
the conformance host: GOPATH is a private tree under ``bin/.gopath`` followed
by ``/usr/share/gocode`` (Debian's golang-*-dev sources, go-version among them).
Only packaged code is built; nothing generated is committed, and a stamp skips
the rebuild when nothing changed. Run by ``make go-tools`` (``make pytest`` runs
it first) or directly (``python tests/jobspec/oracle/build.py``); the pytest
fixture ``go_oracle`` only checks, with ``problem()``, that the binary is there
and current: it never builds under a test's timeout.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BIN_DIR = HERE / "bin"
BINARY = BIN_DIR / "go-oracle"
GOPATH = BIN_DIR / ".gopath"
GOCACHE = BIN_DIR / ".cache"
SYSTEM_GOPATH = Path("/usr/share/gocode")
GO_VERSION_PKG = "github.com/hashicorp/go-version"
HCL_PKGS = ("github.com/hashicorp/hcl/v2/hclsyntax", "github.com/zclconf/go-cty/cty/function/stdlib")
IMPORT_ROOT = "lingjunoracle"
DEBIAN_PACKAGES = "golang-go golang-github-hashicorp-go-version-dev golang-github-hashicorp-hcl-v2-dev golang-github-zclconf-go-cty-dev"
MAKE_TARGET = "make go-tools"


class BuildError(RuntimeError):
    """The oracle could not be built; the message says why."""


def missing() -> str:
    """Why the oracle cannot be built here, or empty."""
    if shutil.which("go") is None:
        return f"`go` is not installed (apt-get install -y {DEBIAN_PACKAGES})"
    for package in (GO_VERSION_PKG, *HCL_PKGS):
        if not (SYSTEM_GOPATH / "src" / package).is_dir():
            return f"{SYSTEM_GOPATH / 'src' / package} is missing (apt-get install -y {DEBIAN_PACKAGES})"
    return ""


def _go_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        GOPATH=f"{GOPATH}:{SYSTEM_GOPATH}",
        GO111MODULE="off",
        GOCACHE=str(GOCACHE),
        GOFLAGS="",
        GOPROXY="off",
        CGO_ENABLED="0",
    )
    return env


def _stamp() -> str:
    h = hashlib.sha256()
    for path in [*sorted(HERE.glob("*.go")), Path(__file__)]:
        h.update(path.name.encode() + path.read_bytes())
    for package in (GO_VERSION_PKG, *HCL_PKGS):
        for path in sorted((SYSTEM_GOPATH / "src" / package).glob("*.go")):
            h.update(path.read_bytes())
    h.update(subprocess.run(["go", "version"], capture_output=True, text=True, check=True).stdout.encode())
    return h.hexdigest()


def _debian_go_version() -> str:
    proc = subprocess.run(
        ["dpkg-query", "-W", "-f=${Version}", "golang-github-hashicorp-go-version-dev"], capture_output=True, text=True
    )
    return f"Debian {proc.stdout.strip()}" if proc.returncode == 0 and proc.stdout.strip() else "Debian"


def problem() -> str:
    """Why the built oracle cannot be used as it is (missing, or built from other sources), or ""."""
    why = missing()
    if why:
        return why
    stamp_file = BIN_DIR / ".stamp"
    if not (BINARY.exists() and stamp_file.exists()):
        return f"{BINARY} is not built: `{MAKE_TARGET}` builds it (`make pytest` does so first)"
    if stamp_file.read_text() != _stamp():
        return f"{BINARY} was built from other Go sources, go-version or Go than these: `{MAKE_TARGET}` rebuilds it"
    return ""


def build(force: bool = False) -> Path:
    """Build (if needed) and return the oracle binary."""
    why = missing()
    if why:
        raise BuildError(why)
    BIN_DIR.mkdir(parents=True, exist_ok=True)
    with open(BIN_DIR / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stamp = _stamp()
        stamp_file = BIN_DIR / ".stamp"
        if not force and BINARY.exists() and stamp_file.exists() and stamp_file.read_text() == stamp:
            return BINARY
        stamp_file.unlink(missing_ok=True)
        shutil.rmtree(GOPATH, ignore_errors=True)
        src = GOPATH / "src" / IMPORT_ROOT / "oracle"
        src.mkdir(parents=True)
        for go_file in HERE.glob("*.go"):
            shutil.copy2(go_file, src / go_file.name)
        ldflags = f"-X 'main.goVersionSource={_debian_go_version()}'"
        cmd = ["go", "build", "-ldflags", ldflags, "-o", str(BINARY), f"{IMPORT_ROOT}/oracle"]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=_go_env(), cwd=HERE)
        if proc.returncode != 0:
            raise BuildError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
        stamp_file.write_text(stamp)
    return BINARY


def main() -> int:
    try:
        print(build(force="--force" in sys.argv[1:]))
    except BuildError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
