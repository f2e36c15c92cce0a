"""Build the Go conformance host from Debian's packaged Go libraries.

GOPATH mode, no module proxy, no network: GOPATH is a private tree under
tests/conformance/bin/.gopath plus /usr/share/gocode (where Debian's
golang-*-dev packages put their sources). Nomad's protos are compiled with
Debian's legacy protoc-gen-go (``plugins=grpc``) into that private tree at
build time; nothing generated is committed.

Run by ``make go-tools`` (``make pytest`` runs it first) or directly
(``python tests/conformance/build.py``); never under a test's timeout: the
fixtures only check, with ``problem()``, that the binaries are there and
current. Rebuilds only when a Go source, a proto or the Go version changed;
the Go build cache lives in tests/conformance/bin/.cache. Besides the host it
compiles the host's Go unit tests into ``conformance-host.test``.
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
REPO = HERE.parent.parent
HOST_SRC = HERE / "host"
PROTO_ROOT = REPO / "proto"
BIN_DIR = HERE / "bin"
BINARY = BIN_DIR / "conformance-host"
TEST_BINARY = BIN_DIR / "conformance-host.test"  # the host's Go unit tests, compiled
MAKE_TARGET = "make go-tools"
GOPATH = BIN_DIR / ".gopath"
GOCACHE = BIN_DIR / ".cache"
SYSTEM_GOPATH = Path("/usr/share/gocode")
GO_IMPORT_ROOT = "lingjunconf"

# Debian packages the build needs (the lead's Makefile GO_PKGS).
DEBIAN_PACKAGES = (
    "golang-go golang-github-hashicorp-go-plugin-dev golang-google-grpc-dev "
    "golang-goprotobuf-dev protobuf-compiler golang-github-zclconf-go-cty-dev "
    "golang-github-hashicorp-hcl-v2-dev golang-github-hashicorp-go-version-dev golang-github-hashicorp-hcl-dev"
)

# One protoc run per Go package (legacy protoc-gen-go wants that).
PROTO_PACKAGES = {
    "hclspec": ["nomad/hcl_spec.proto"],
    "base": ["nomad/base.proto"],
    "structs": ["nomad/attribute.proto", "nomad/stats.proto"],
    "device": ["nomad/device.proto"],
}
WELL_KNOWN = {
    "google/protobuf/timestamp.proto": "github.com/golang/protobuf/ptypes/timestamp",
    "google/protobuf/duration.proto": "github.com/golang/protobuf/ptypes/duration",
    "google/protobuf/wrappers.proto": "github.com/golang/protobuf/ptypes/wrappers",
}


class BuildError(RuntimeError):
    """The host could not be built; the message says what is missing."""


def missing_tools() -> list[str]:
    """Names of required tools or source trees that are not installed."""
    missing = [tool for tool in ("go", "protoc", "protoc-gen-go") if shutil.which(tool) is None]
    for pkg in ("github.com/hashicorp/go-plugin", "github.com/hashicorp/hcl/v2", "github.com/hashicorp/go-version"):
        if not (SYSTEM_GOPATH / "src" / pkg).is_dir():
            missing.append(str(SYSTEM_GOPATH / "src" / pkg))
    hcl1 = SYSTEM_GOPATH / "src" / "github.com/hashicorp/hcl" / "decoder.go"  # HCL v1, the agent's parser
    if not hcl1.is_file():
        missing.append(str(hcl1))
    return missing


def _stamp() -> str:
    h = hashlib.sha256()
    for path in sorted(HOST_SRC.glob("*.go")) + sorted((PROTO_ROOT / "nomad").glob("*.proto")) + [Path(__file__)]:
        h.update(path.name.encode())
        h.update(path.read_bytes())
    h.update(subprocess.run(["go", "version"], capture_output=True, text=True, check=True).stdout.encode())
    return h.hexdigest()


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


def _run(cmd: list[str], env: dict[str, str] | None = None) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
    if proc.returncode != 0:
        raise BuildError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")


def _generate_protos(src: Path) -> None:
    mappings = dict(WELL_KNOWN)
    for pkg, files in PROTO_PACKAGES.items():
        for f in files:
            mappings[f] = f"{GO_IMPORT_ROOT}/pb/{pkg}"
    m_opts = ",".join(f"M{k}={v}" for k, v in mappings.items())
    includes = [f"-I{PROTO_ROOT}"]
    if Path("/usr/include/google/protobuf").is_dir():
        includes.append("-I/usr/include")
    for pkg, files in PROTO_PACKAGES.items():
        out = src / "pb" / pkg
        tmp = src / "pb" / f".{pkg}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        _run(["protoc", *includes, f"--go_out=plugins=grpc,{m_opts}:{tmp}", *files])
        out.mkdir(parents=True, exist_ok=True)
        for gen in tmp.rglob("*.pb.go"):
            shutil.move(str(gen), out / gen.name)
        shutil.rmtree(tmp)


def problem() -> str:
    """Why the built host cannot be used as it is (missing, or built from other sources), or ""."""
    if shutil.which("go") is None:
        return f"`go` is not installed; the conformance host needs: apt-get install -y {DEBIAN_PACKAGES}"
    stamp_file = BIN_DIR / ".stamp"
    if not (BINARY.exists() and TEST_BINARY.exists() and stamp_file.exists()):
        return f"{BINARY} is not built: `{MAKE_TARGET}` builds it (`make pytest` does so first)"
    if stamp_file.read_text() != _stamp():
        return f"{BINARY} was built from other Go sources, protos or Go than these: `{MAKE_TARGET}` rebuilds it"
    return ""


def build(force: bool = False) -> Path:
    """Build (if needed) and return the path of the conformance-host binary."""
    missing = missing_tools()
    if missing:
        raise BuildError(f"missing {', '.join(missing)}; install with: apt-get install -y {DEBIAN_PACKAGES}")
    BIN_DIR.mkdir(parents=True, exist_ok=True)
    with open(BIN_DIR / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stamp = _stamp()
        stamp_file = BIN_DIR / ".stamp"
        current = BINARY.exists() and TEST_BINARY.exists() and stamp_file.exists()
        if not force and current and stamp_file.read_text() == stamp:
            return BINARY
        stamp_file.unlink(missing_ok=True)
        src = GOPATH / "src" / GO_IMPORT_ROOT
        shutil.rmtree(src, ignore_errors=True)
        (src / "host").mkdir(parents=True)
        for go_file in HOST_SRC.glob("*.go"):
            shutil.copy2(go_file, src / "host" / go_file.name)
        _generate_protos(src)
        _run(["go", "build", "-o", str(BINARY), f"{GO_IMPORT_ROOT}/host"], env=_go_env())
        _run(["go", "test", "-c", "-o", str(TEST_BINARY), f"{GO_IMPORT_ROOT}/host"], env=_go_env())
        stamp_file.write_text(stamp)
    return BINARY


def go_test() -> str:
    """Run the host's compiled Go unit tests (built by ``build()``); return their verbose output."""
    proc = subprocess.run([str(TEST_BINARY), "-test.count=1", "-test.v"], capture_output=True, text=True, cwd=REPO)
    if proc.returncode != 0:
        raise BuildError(f"the host's Go unit tests failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
    return proc.stdout


def main() -> int:
    try:
        if "--test" in sys.argv[1:]:
            build()
            print(go_test(), end="")
            return 0
        path = build(force="--force" in sys.argv[1:])
    except BuildError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
