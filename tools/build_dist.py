"""Build ``dist/nomad-device-lingjun``: one self-contained executable for Nomad's plugin_dir.

Why this shape (numbers in BENCHMARKS.md, "The shipped executable"):

* **PyInstaller onedir** carries the interpreter (libpython), the standard
  library, grpcio, protobuf (upb), msgpack, httpx, prometheus-client,
  python-hcl2 and nvidia-ml-py, so a node needs no Python at all.
* PyInstaller's own **onefile** mode unpacks everything into a new temporary
  directory on *every* launch, several times slower than the console script's
  exec → handshake, and Nomad launches the plugin three times at each agent start. So the
  onedir bundle is instead appended, as a gzip'd ustar archive, to a small
  compiled launcher (tools/launcher.c), and one text line after it names the
  build and where the archive lies. The first launch of a build unpacks it
  once into a versioned cache directory (atomic rename, so concurrent first
  launches are safe), prunes older builds (it keeps the previous one), and
  every launch then ``exec``s the bundle. The launcher reads the archive
  itself, with zlib linked in: unpacking needs no tar, gzip or coreutils, nor
  any PATH at all.

The cache is ``$NOMAD_DEVICE_LINGJUN_CACHE_DIR``, else
``$XDG_CACHE_HOME/nomad-device-lingjun``, else
``$HOME/.cache/nomad-device-lingjun``, else ``/var/cache/nomad-device-lingjun``;
each build lives in ``nomad-device-lingjun-<version>-<payload sha256[:16]>``.
At most two builds are kept.

The interpreter is **not** the one running this script: an interpreter built
on the build machine asks for that machine's glibc (Debian 12's 2.36, while
Lingjun nodes run Alibaba Cloud Linux 3 with 2.32 and EL8 has 2.28).
tools/build_python.py builds CPython 3.11 with ``zig cc`` (PyPI's ziglang)
against glibc 2.17's symbol versions, from the upstream tarballs in Debian's
source packages, with static OpenSSL, libffi and zlib, and caches it in
``~/.cache/nomad-device-lingjun-build`` (a cold build is several minutes, a
warm one nothing; see that file for why each choice). This script then makes
a dedicated build venv from that interpreter (``build/dist-venv``: PyInstaller
plus the project's runtime dependencies and the ``nvml`` extra, all
manylinux2014 wheels from PyPI, nothing from the dev toolchain), reused while
the interpreter, pyproject.toml's dependencies and the pins below are
unchanged.

The result needs **glibc >= 2.17** and the node's own ``libstdc++.so.6`` and
``libgcc_s.so.1`` (GCC >= 4.8): exactly what the manylinux2014 grpcio and
protobuf wheels ask of a system. PyInstaller would copy the build machine's
libstdc++ (which itself needs glibc 2.36), so those two are taken out of the
bundle, as libc, libm, libpthread and ld-linux already are; the build fails
if any bundled ELF file still asks for a newer glibc symbol version.
PyInstaller's prebuilt bootloader also links the node's ``libz.so.1``. The launcher is built by ``zig cc``
for the same glibc 2.17 target, with build_python's static zlib, and needs
only libc.

    python3 tools/build_dist.py [--output dist/nomad-device-lingjun]
    python3 tools/build_dist.py --onefile --output build/onefile/nomad-device-lingjun   # for comparison only
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from build_python import GLIBC_FLOOR, LOCK, compile_with_zlib, interpreter, locked  # tools/ is not a package

REPO = Path(__file__).resolve().parents[1]
NAME = "nomad-device-lingjun"
PYINSTALLER = locked("pyinstaller")
BUILD = REPO / "build"
VENV = BUILD / "dist-venv"
CACHE_ENV = "NOMAD_DEVICE_LINGJUN_CACHE_DIR"
# What every manylinux2014 system provides; never bundled (see the docstring).
NODE_LIBRARIES = ("libstdc++.so*", "libgcc_s.so*")

LAUNCHER_SOURCE = REPO / "tools" / "launcher.c"
LAUNCHER = BUILD / "launcher" / NAME
# Archive entries the launcher unpacks: ustar regular files and directories (tools/launcher.c).
ENTRY_TYPES = (tarfile.REGTYPE, tarfile.DIRTYPE)


def log(message: str) -> None:
    print(f"build_dist: {message}", flush=True)


def requirements() -> list[str]:
    """Runtime dependencies from pyproject.toml plus the nvml extra and PyInstaller (installed under requirements.lock)."""
    try:
        import tomllib
    except ImportError:  # Python 3.10: the same parser, as vendored by pip
        from pip._vendor import tomli as tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return [*project["dependencies"], *project["optional-dependencies"]["nvml"], PYINSTALLER]


def build_venv(interpreter: Path) -> Path:
    """A venv of ``interpreter`` with only PyInstaller and the runtime dependencies, reused while its inputs are unchanged.

    The venv gets the pip wheel that CPython's sources carry (ensurepip), so the build does not
    depend on the driving interpreter's pip; wheels only, so nothing is compiled on the build
    machine against its glibc.
    """
    wanted = json.dumps(
        {"python": str(interpreter.resolve()), "requirements": requirements(), "lock": LOCK.read_text()}, sort_keys=True
    )
    stamp = VENV / ".dist-stamp"
    python = VENV / "bin" / "python"
    if stamp.exists() and stamp.read_text() == wanted and python.exists():
        return python
    log(f"creating the build venv {VENV.relative_to(REPO)} (PyInstaller + runtime dependencies, from PyPI)")
    shutil.rmtree(VENV, ignore_errors=True)
    subprocess.run([str(interpreter), "-m", "venv", str(VENV)], check=True)
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "--only-binary", ":all:", "-c", str(LOCK), *requirements()], check=True)
    stamp.write_text(wanted)
    return python


def run_pyinstaller(python: Path, mode: str = "--onedir") -> Path:
    """The onedir bundle (build/pyinstaller/dist/nomad-device-lingjun), or with ``--onefile`` PyInstaller's one file."""
    work = BUILD / "pyinstaller"
    shutil.rmtree(work / "dist", ignore_errors=True)
    # python-hcl2 caches its compiled grammar next to its module, keyed by that module's absolute
    # path: a copy from the build venv is never valid in the bundle and would make builds differ.
    for stale in (python.parent.parent / "lib").glob("python3*/site-packages/hcl2/.lark_cache.bin"):
        stale.unlink()
    # pygohcl's Go library sits beside its package, not in it; the package loads it from its parent
    # directory, which in the bundle is the bundle's own (check-job's HCL2 syntax, jobspec/hcl2_syntax.py).
    gohcl = next((python.parent.parent / "lib").glob("python3*/site-packages/pygohcl.cpython-*.so"))
    # Stripping symbols roughly halves the bundle; it needs binutils' strip, which minimal hosts lack.
    strip = ["--strip"] if shutil.which("strip") else []
    if not strip:
        log("no `strip` on PATH (binutils): building unstripped (about 60 % larger)")
    cmd = [
        str(python), "-m", "PyInstaller", "--noconfirm", "--log-level", "WARN", mode, *strip,
        # Modules as plain .pyc files in the bundle, not in PyInstaller's PYZ archive: imports from
        # the archive (one zlib inflate per module) slow exec -> handshake down against the console
        # script's; as files they do not (BENCHMARKS.md, "The shipped executable").
        "--debug", "noarchive",
        "--name", NAME, "--distpath", str(work / "dist"), "--workpath", str(work / "work"), "--specpath", str(work),
        # Subcommands are imported by name (cli/main.py) and pynvml by importlib (nvml/lib.py);
        # xdm_schema = "<.proto path>" runs grpcio-tools' protoc in-process, with its well-known
        # .proto files (xdm/schema_source.py), and reflection is imported inside functions. (Not
        # --collect-all: grpcio-tools' RECORD would carry the build venv's path into the bundle.)
        "--collect-submodules", "nomad_plugin", "--hidden-import", "pynvml", "--collect-data", "hcl2",
        "--collect-submodules", "grpc_tools", "--collect-data", "grpc_tools", "--collect-binaries", "grpc_tools",
        "--collect-submodules", "grpc_reflection", "--add-binary", f"{gohcl}:.",
        # xdm-probe --capture records these versions (importlib.metadata, xdm/capture.py).
        "--copy-metadata", "grpcio", "--copy-metadata", "protobuf", "--copy-metadata", "grpcio-reflection",
        # Never used at run time, but once in the bundle PyInstaller runs a start-up hook for each:
        # setuptools/pkg_resources (reached through grpc_tools' Python < 3.9 branch) and
        # multiprocessing (reached through concurrent.futures) cost about 200 ms and 7 MiB per launch.
        "--exclude-module", "tkinter", "--exclude-module", "setuptools", "--exclude-module", "pkg_resources",
        "--exclude-module", "_distutils_hack", "--exclude-module", "multiprocessing",
        str(REPO / "nomad_plugin" / "__main__.py"),
    ]  # fmt: skip
    # collect_submodules imports nomad_plugin in a child interpreter: it must find this checkout.
    # PYTHONHASHSEED: set and frozenset constants marshal in one order, so equal sources give equal bytes.
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONDONTWRITEBYTECODE="1", PYTHONHASHSEED="0")
    subprocess.run(cmd, check=True, env=env, cwd=REPO)
    bundle = work / "dist" / NAME
    if mode == "--onefile":
        return bundle
    if not (bundle / NAME).is_file():
        raise SystemExit(f"PyInstaller did not produce {bundle / NAME}")
    # The node's own C++ runtime, as for any manylinux2014 wheel: the build machine's copies
    # would raise the glibc floor to the build machine's (libstdc++ 12 needs glibc 2.36).
    for lib in NODE_LIBRARIES:
        for found in (bundle / "_internal").glob(lib):
            found.unlink()
    return bundle


def launcher() -> bytes:
    """tools/launcher.c compiled for glibc 2.17 with static zlib, rebuilt when its source or toolchain changes."""
    defines = [f'-DNAME="{NAME}"', f'-DCACHE_ENV="{CACHE_ENV}"']
    wanted = json.dumps(
        {"source": LAUNCHER_SOURCE.read_text(), "python": str(interpreter()), "flags": defines}, sort_keys=True
    )
    stamp = LAUNCHER.with_name(".stamp")
    if stamp.exists() and stamp.read_text() == wanted and LAUNCHER.is_file():
        return LAUNCHER.read_bytes()
    log("compiling the launcher (tools/launcher.c) with zig cc")
    LAUNCHER.parent.mkdir(parents=True, exist_ok=True)
    compile_with_zlib(LAUNCHER_SOURCE, LAUNCHER, defines)
    stamp.write_text(wanted)
    return LAUNCHER.read_bytes()


def min_glibc(files: list[Path]) -> tuple[int, int]:
    """The newest GLIBC_2.x symbol version any of these ELF files asks for (a string scan: an upper bound)."""
    best = GLIBC_FLOOR
    for path in files:
        if path.is_file() and not path.is_symlink():
            with path.open("rb") as f:
                if f.read(4) != b"\x7fELF":
                    continue
                data = f.read()
            for major, minor in re.findall(rb"GLIBC_(\d+)\.(\d+)", data):
                best = max(best, (int(major), int(minor)))
    return best


def payload(bundle: Path) -> bytes:
    """A reproducible gzip'd ustar archive of the bundle's contents (sorted, no owners, fixed mtimes)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for path in sorted(bundle.rglob("*")):
            info = tar.gettarinfo(str(path), arcname=str(path.relative_to(bundle)))
            if info.type not in ENTRY_TYPES:
                raise SystemExit(f"{path} is neither a file nor a directory: the launcher unpacks only those")
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0
            info.mode = 0o755 if (path.is_dir() or info.mode & 0o111) else 0o644
            if info.isreg():
                with path.open("rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
    return gzip.compress(raw.getvalue(), compresslevel=6, mtime=0)


def trailer(version: str, key: str, glibc: tuple[int, int], offset: int, size: int) -> bytes:
    """The shipped file's last line, which the launcher (and doctor) read: the build and where its archive lies."""
    if not re.fullmatch(r"[A-Za-z0-9.+_-]{1,63}", version):
        raise SystemExit(f"version {version!r} cannot name a cache directory")
    return f"\n{NAME} bundle version={version} key={key} glibc={glibc[0]}.{glibc[1]} offset={offset} size={size}\n".encode()


def build(output: Path) -> dict[str, object]:
    start = time.monotonic()
    python = build_venv(interpreter())
    venv_s = time.monotonic() - start
    bundle = run_pyinstaller(python)
    head = launcher()
    glibc = min_glibc([*bundle.rglob("*"), LAUNCHER])
    if glibc > GLIBC_FLOOR:
        raise SystemExit(f"a bundled ELF file asks for glibc {glibc[0]}.{glibc[1]} > the {GLIBC_FLOOR} floor")
    data = payload(bundle)
    key = hashlib.sha256(data).hexdigest()[:16]
    sys.path.insert(0, str(REPO))
    from nomad_plugin import __version__

    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(f".{output.name}.tmp")
    tmp.write_bytes(head + data + trailer(__version__, key, glibc, len(head), len(data)))
    tmp.chmod(0o755)
    tmp.replace(output)
    digest = hashlib.sha256(output.read_bytes()).hexdigest()
    output.with_name(output.name + ".sha256").write_text(f"{digest}  {output.name}\n")
    return {
        "output": output,
        "bytes": output.stat().st_size,
        "unpacked": sum(p.stat().st_size for p in bundle.rglob("*") if p.is_file()),
        "glibc": f"{glibc[0]}.{glibc[1]}",
        "seconds": time.monotonic() - start,
        "venv_seconds": venv_s,
        "sha256": digest,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--output", type=Path, default=REPO / "dist" / NAME)
    parser.add_argument("--onefile", action="store_true", help="write PyInstaller's onefile instead (benchmarks only)")
    args = parser.parse_args(argv)
    if args.onefile:
        onefile = run_pyinstaller(build_venv(interpreter()), "--onefile")
        args.output.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(onefile, args.output)
        print(f"built {args.output} (PyInstaller onefile, for comparison; not the shipped layout)")
        return 0
    r = build(args.output.absolute())
    mib = 2**20
    print(
        f"built {r['output']}: {int(r['bytes']) / mib:.1f} MiB ({int(r['unpacked']) / mib:.1f} MiB unpacked), "  # type: ignore[call-overload]
        f"needs glibc >= {r['glibc']}, in {r['seconds']:.0f} s (build venv {r['venv_seconds']:.0f} s)\n"
        f"sha256 {r['sha256']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
