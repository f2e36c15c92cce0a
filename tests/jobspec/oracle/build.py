"""Build the Go oracle: Go's own strconv, strings, regexp, go-version and, where a
Nomad source mirror is on disk, Nomad's attribute and semver packages.

GOPATH mode, no modules, no network, as ``tests/conformance/build.py`` builds
the conformance host: GOPATH is a private tree under ``bin/.gopath`` followed
by ``/usr/share/gocode`` (Debian's golang-*-dev sources).

- go-version: the release Nomad's ``go.mod`` pins, taken from a go-version
  source mirror when one holds that tag, else Debian's package (whose
  release is reported by the ``info`` answer).
- Nomad's ``plugins/shared/structs`` (``attribute.go``, ``units.go`` and
  ``Pow`` from ``util.go``) and ``helper/constraints/semver``: Debian does not
  package them and this repository holds none of their code, so they are read
  from the mirror (``git show``) into the private GOPATH at build time and
  the binary is built with the ``nomadmirror`` tag. Without a mirror those
  questions answer ``skip``. Nomad's sources use Go 1.26's ``new(value)``;
  with an older toolchain each such call is rewritten to a generic helper
  with the same meaning (a rewrite that misreads a type fails the build).

Nothing generated is committed; a stamp skips the rebuild when nothing changed.
Run directly (``python tests/jobspec/oracle/build.py``) or through the pytest
fixture ``go_oracle``.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
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
IMPORT_ROOT = "lingjunoracle"
MIRRORS = Path(os.environ.get("LINGJUN_SOURCE_MIRRORS", "/work/.mirror"))
NOMAD_MIRROR = MIRRORS / "hashicorp+nomad" / "repo"
GO_VERSION_MIRROR = MIRRORS / "hashicorp+go-version" / "repo"
DEBIAN_PACKAGES = "golang-go golang-github-hashicorp-go-version-dev"

NOMAD_FILES = {
    "structs": ("plugins/shared/structs/attribute.go", "plugins/shared/structs/units.go"),
    "semver": ("helper/constraints/semver/constraints.go",),
}
POW_SOURCE = "plugins/shared/structs/util.go"  # only its Pow function: the rest needs Nomad's protos
NEW_HELPER = "oracleNew"


class BuildError(RuntimeError):
    """The oracle could not be built; the message says why."""


def missing() -> str:
    """Why the oracle cannot be built here, or empty."""
    if shutil.which("go") is None:
        return f"`go` is not installed (apt-get install -y {DEBIAN_PACKAGES})"
    if not (SYSTEM_GOPATH / "src" / GO_VERSION_PKG).is_dir() and _pinned_go_version() is None:
        return f"{SYSTEM_GOPATH / 'src' / GO_VERSION_PKG} is missing (apt-get install -y {DEBIAN_PACKAGES})"
    return ""


def _git(repo: Path, *args: str) -> str:
    proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildError(f"git -C {repo} {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout


def _is_repo(repo: Path) -> bool:
    return (
        repo.is_dir()
        and subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True).returncode == 0
    )


def nomad_commit() -> str:
    """The Nomad mirror's HEAD commit, or empty when there is no mirror."""
    return _git(NOMAD_MIRROR, "rev-parse", "HEAD").strip() if _is_repo(NOMAD_MIRROR) else ""


def pinned_go_version() -> str:
    """The go-version release Nomad's go.mod requires (empty without a Nomad mirror)."""
    if not nomad_commit():
        return ""
    found = re.search(rf"^\s*{re.escape(GO_VERSION_PKG)}\s+(v\S+)", _git(NOMAD_MIRROR, "show", "HEAD:go.mod"), re.M)
    return found.group(1) if found else ""


def _pinned_go_version() -> str | None:
    """The pinned tag when the go-version mirror holds it."""
    tag = pinned_go_version()
    if not tag or not _is_repo(GO_VERSION_MIRROR):
        return None
    ok = subprocess.run(
        ["git", "-C", str(GO_VERSION_MIRROR), "rev-parse", "--verify", f"{tag}^{{commit}}"], capture_output=True
    )
    return tag if ok.returncode == 0 else None


def _go_release() -> tuple[int, int]:
    out = subprocess.run(["go", "env", "GOVERSION"], capture_output=True, text=True, check=True).stdout.strip()
    found = re.match(r"go(\d+)\.(\d+)", out)
    if not found:
        raise BuildError(f"cannot read the Go release from {out!r}")
    return int(found.group(1)), int(found.group(2))


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


def _balanced(text: str, start: int) -> int:
    """Index just past the parenthesis that closes the one opened before ``start``."""
    depth = 1
    for i in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return i
    raise BuildError("unbalanced parentheses in Nomad's source")


_TYPE_ARG = re.compile(r"(?:[a-z]\w*\.)?[A-Z]\w*|u?int(?:8|16|32|64)?|float(?:32|64)|string|bool|byte|rune")


def rewrite_new_values(source: str) -> str:
    """Go 1.26's ``new(value)`` as ``oracleNew(value)``; ``new(Type)`` stays."""
    out, pos = [], 0
    for found in re.finditer(r"(?<![\w.])new\(", source):
        if found.start() < pos:
            continue
        close = _balanced(source, found.end())
        arg = source[found.end() : close].strip()
        out.append(source[pos : found.start()])
        out.append(("new(" if _TYPE_ARG.fullmatch(arg) else f"{NEW_HELPER}(") + source[found.end() : close + 1])
        pos = close + 1
    out.append(source[pos:])
    return "".join(out)


def _function(source: str, name: str) -> str:
    found = re.search(rf"^func {name}\(.*?^}}\n", source, re.M | re.S)
    if not found:
        raise BuildError(f"func {name} not found in Nomad's {POW_SOURCE}")
    return found.group(0)


def _write_nomad_packages(src: Path, commit: str, rewrite: bool) -> None:
    for pkg, files in NOMAD_FILES.items():
        out = src / "nomad" / pkg
        out.mkdir(parents=True)
        for path in files:
            text = _git(NOMAD_MIRROR, "show", f"{commit}:{path}")
            (out / Path(path).name).write_text(rewrite_new_values(text) if rewrite else text)
        if rewrite:
            (out / "oracle_new.go").write_text(
                f"package {pkg}\n\n// {NEW_HELPER} is new(value) for a Go release before 1.26.\n"
                f"func {NEW_HELPER}[T any](v T) *T {{ return &v }}\n"
            )
    pow_go = _function(_git(NOMAD_MIRROR, "show", f"{commit}:{POW_SOURCE}"), "Pow")
    (src / "nomad" / "structs" / "pow.go").write_text(f"package structs\n\n{pow_go}")


def _write_go_version(tag: str) -> None:
    dest = GOPATH / "src" / GO_VERSION_PKG
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(GO_VERSION_MIRROR), "archive", tag], capture_output=True, check=False)
    if archive.returncode != 0:
        raise BuildError(f"git archive {tag} of go-version failed: {archive.stderr.decode(errors='replace')}")
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    for test_file in dest.glob("*_test.go"):
        test_file.unlink()


def _stamp(commit: str, tag: str | None) -> str:
    h = hashlib.sha256()
    for path in [*sorted(HERE.glob("*.go")), Path(__file__)]:
        h.update(path.name.encode() + path.read_bytes())
    debian = SYSTEM_GOPATH / "src" / GO_VERSION_PKG
    for path in sorted(debian.glob("*.go")) if debian.is_dir() else []:
        h.update(path.read_bytes())
    h.update(subprocess.run(["go", "version"], capture_output=True, text=True, check=True).stdout.encode())
    h.update(f"{commit}|{tag}".encode())
    return h.hexdigest()


def _debian_go_version() -> str:
    proc = subprocess.run(
        ["dpkg-query", "-W", "-f=${Version}", "golang-github-hashicorp-go-version-dev"], capture_output=True, text=True
    )
    return f"Debian {proc.stdout.strip()}" if proc.returncode == 0 and proc.stdout.strip() else "Debian"


def build(force: bool = False) -> Path:
    """Build (if needed) and return the oracle binary."""
    why = missing()
    if why:
        raise BuildError(why)
    BIN_DIR.mkdir(parents=True, exist_ok=True)
    with open(BIN_DIR / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        commit = nomad_commit()
        tag = _pinned_go_version()
        stamp = _stamp(commit, tag)
        stamp_file = BIN_DIR / ".stamp"
        if not force and BINARY.exists() and stamp_file.exists() and stamp_file.read_text() == stamp:
            return BINARY
        shutil.rmtree(GOPATH, ignore_errors=True)
        src = GOPATH / "src" / IMPORT_ROOT
        (src / "oracle").mkdir(parents=True)
        for go_file in HERE.glob("*.go"):
            shutil.copy2(go_file, src / "oracle" / go_file.name)
        source = f"{tag} (source mirror)" if tag else _debian_go_version()
        ldflags = [f"-X 'main.goVersionSource={source}'"]
        tags = []
        if commit:
            _write_nomad_packages(src, commit, rewrite=_go_release() < (1, 26))
            ldflags.append(f"-X main.nomadCommit={commit}")
            tags = ["-tags", "nomadmirror"]
        if tag:
            _write_go_version(tag)
        cmd = ["go", "build", *tags, "-ldflags", " ".join(ldflags), "-o", str(BINARY), f"{IMPORT_ROOT}/oracle"]
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
