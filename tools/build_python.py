"""Build the CPython that ``make dist`` bundles, linked against glibc 2.17's symbol versions.

Why: PyInstaller bundles the interpreter it runs under, and an interpreter built
on the build machine asks for that machine's glibc (Debian 12: 2.36), while
Lingjun nodes run Alibaba Cloud Linux 3 (glibc 2.32) and EL8 has 2.28.
python.org and python-build-standalone downloads are not reachable from the
build hosts; PyPI and Debian's archive are. So:

* the C compiler is Zig's ``zig cc`` from PyPI's ``ziglang`` wheel, with
  ``-target x86_64-linux-gnu.2.17``: it compiles against glibc headers and
  links against stub libraries of exactly that glibc version, so no object
  can ask for a newer symbol version (the manylinux2014 level, the same as
  the grpcio, protobuf and msgpack wheels the bundle carries);
* the sources are the pristine upstream tarballs inside Debian's source
  packages (``*.orig.tar.*`` in Debian's archive, at the mirror this machine's
  apt is configured with), each checked against a
  pinned SHA-256: CPython 3.11, OpenSSL 3.0 (the ``ssl`` module: httpx to an
  https Nomad), libffi (``ctypes``: NVML through nvidia-ml-py) and zlib;
* OpenSSL, libffi and zlib are built as static ``-fPIC`` archives and linked
  into the extension modules that need them, so the bundle carries no copy of
  the build machine's libssl/libffi/libz; modules whose libraries are not
  built (bz2, lzma, uuid, sqlite3, readline, curses, dbm, tkinter) are left
  out: nothing in the plugin imports them. OpenSSL keeps what TLS, hashlib
  and X.509 need (legacy ciphers, CMS, CT, SRP... are configured out) and
  looks for CA files under ``/etc/ssl`` (httpx uses certifi's bundle anyway);
* CPython is ``--enable-shared`` (PyInstaller needs libpython), at its own
  default ``-O3``, without PGO (a PGO run would double the cold build).

The result is cached outside the clone, in
``$NOMAD_DEVICE_LINGJUN_BUILD_CACHE`` (default
``~/.cache/nomad-device-lingjun-build``), under a key made of the source
hashes, the Zig version and this file's bytes: repeated builds on one machine
reuse it, any change rebuilds it (the static libraries are keyed by their
own sources, options and build recipe, so a CPython-only change reuses them).
Only the current key's builds are kept, with the checked sources (about
200 MiB); Zig (about 530 MiB with its compile cache) is removed after a
build and installed again, from pip's cache, when a key changes. A lock file
serialises concurrent builds. Needs ``make`` and ``perl`` (OpenSSL's
Configure), as any Debian or Ubuntu machine has.

    python3 tools/build_python.py      # prints the interpreter's path
"""

from __future__ import annotations

import fcntl
import hashlib
import inspect
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LOCK = REPO / "requirements.lock"


def locked(name: str) -> str:
    """``name==version`` as requirements.lock pins it (every build tool is installed at its locked version)."""
    for line in LOCK.read_text().splitlines():
        if line.split("==")[0].strip().lower() == name.lower():
            return line.strip()
    raise SystemExit(f"{LOCK.name} pins no {name}: run `make lock`")


ZIGLANG = locked("ziglang")
TARGET = "x86_64-linux-gnu.2.17"
GLIBC_FLOOR = (2, 17)

# (name, version, sha256, candidate paths in Debian's archives: the first one that answers wins). Debian
# moves a superseded security release out of the pool, so the stable point release's copy comes second.
SOURCES: list[tuple[str, str, str, list[str]]] = [
    ("zlib", "1.2.13", "71feb7947e3c00ef125f83b79a4e529bde31171e5babe48b391f06758d1ab0a1",
     ["debian/pool/main/z/zlib/zlib_1.2.13.dfsg.orig.tar.bz2"]),
    ("libffi", "3.4.4", "d66c56ad259a82cf2a9dfc408b32bf5da52371500b84745f7fb8b645712df676",
     ["debian/pool/main/libf/libffi/libffi_3.4.4.orig.tar.gz"]),
    ("openssl", "3.0.22", "67ebca7e50d17383028045486653492195b83db95f8558709701bb47b5c1ef81",
     ["debian-security/pool/updates/main/o/openssl/openssl_3.0.22.orig.tar.gz"]),
    ("python", "3.11.2", "2411c74bda5bbcfcddaf4531f66d1adc73f247f529aee981b029513aefdbf849",
     ["debian/pool/main/p/python3.11/python3.11_3.11.2.orig.tar.gz"]),
]  # fmt: skip
# Used when the pinned OpenSSL is gone from the security pool (Debian removes superseded ones).
OPENSSL_FALLBACK = (
    "openssl", "3.0.20", "c80a01dfc70ece4dc21168932c37739042d404d46ccc81a5986dd75314ecda6f",
    ["debian/pool/main/o/openssl/openssl_3.0.20.orig.tar.gz"],
)  # fmt: skip
APT_SOURCES = (Path("/etc/apt/sources.list"), Path("/etc/apt/sources.list.d"))


def debian_archives() -> dict[str, str]:
    """The base URI of each Debian archive (``debian``, ``debian-security``) this machine's apt uses.

    The sources come from whatever mirror the build machine is configured with, as its own
    ``apt-get`` would reach it; the pinned SHA-256 is what makes a download trusted, not the mirror.
    """
    files = [APT_SOURCES[0], *sorted(APT_SOURCES[1].glob("*.list")), *sorted(APT_SOURCES[1].glob("*.sources"))]
    uris: list[str] = []
    for file in files:
        if not file.is_file():
            continue
        for line in file.read_text(errors="replace").splitlines():
            words = line.split("#", 1)[0].split()
            if words[:1] == ["URIs:"]:
                uris += words[1:]
            elif words[:1] in (["deb"], ["deb-src"]):
                uris += [w for w in words[1:] if "://" in w][:1]
    archives: dict[str, str] = {}
    for uri in uris:
        base, _, archive = uri.rstrip("/").rpartition("/")
        archives.setdefault(archive, f"{base}/{archive}")
    return archives


def urls(paths: list[str]) -> list[str]:
    """Candidate URLs for archive-relative paths, at the mirrors apt is configured with."""
    archives = debian_archives()
    found = [f"{archives[p.split('/', 1)[0]]}/{p.split('/', 1)[1]}" for p in paths if p.split("/", 1)[0] in archives]
    if not found:
        wanted = sorted({p.split("/", 1)[0] for p in paths})
        raise SystemExit(
            f"build_python: apt on this machine has no {' or '.join(wanted)} archive configured (/etc/apt)"
        )
    return found


OPENSSL_OPTIONS = [
    "no-shared", "no-tests", "no-engine", "no-comp", "no-dso", "no-module", "no-ui-console",
    "no-idea", "no-mdc2", "no-rc5", "no-whirlpool", "no-camellia", "no-seed", "no-aria", "no-sm2", "no-sm3",
    "no-sm4", "no-siphash", "no-cast", "no-bf", "no-rc2", "no-md4", "no-srp", "no-cms", "no-ts", "no-gost",
    "no-cmp", "no-ec2m", "no-sctp", "no-srtp", "no-rfc3779", "no-ct", "no-dtls", "no-ocsp",
]  # fmt: skip
ENV_CACHE = "NOMAD_DEVICE_LINGJUN_BUILD_CACHE"


def log(message: str) -> None:
    print(f"build_python: {message}", flush=True)


def cache_root() -> Path:
    if os.environ.get(ENV_CACHE):
        return Path(os.environ[ENV_CACHE]).absolute()
    return Path.home() / ".cache" / "nomad-device-lingjun-build"


def jobs() -> str:
    return str(max(1, min(len(os.sched_getaffinity(0)), 8)))


def ensure_zig(root: Path) -> Path:
    """Zig from PyPI, in a venv of its own (reused: keyed by the pinned version)."""
    venv = root / f"zig-{ZIGLANG.split('==')[1]}"
    found = list(venv.glob("lib/python3*/site-packages/ziglang/zig"))
    if found:
        return found[0]
    log(f"installing {ZIGLANG} from PyPI into {venv}")
    shutil.rmtree(venv, ignore_errors=True)
    # A venv with its own pip (as `make venv` needs anyway): the driving python3 may have none.
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check", ZIGLANG], check=True
    )
    return next(venv.glob("lib/python3*/site-packages/ziglang/zig"))


def download(root: Path, source: tuple[str, str, str, list[str]]) -> Path:
    name, version, sha256, paths = source
    dest = root / "sources" / paths[0].rsplit("/", 1)[1]
    if dest.exists() and hashlib.sha256(dest.read_bytes()).hexdigest() == sha256:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    errors = []
    for url in urls(paths):
        try:
            with urllib.request.urlopen(url, timeout=120) as r:  # noqa: S310 (apt's mirror, sha256 below)
                data = r.read()
        except OSError as e:
            errors.append(f"{url}: {e}")
            continue
        if hashlib.sha256(data).hexdigest() != sha256:
            raise SystemExit(f"build_python: {url} does not have the pinned sha256 {sha256}")
        tmp = dest.with_suffix(".part")
        tmp.write_bytes(data)
        tmp.replace(dest)
        return dest
    raise SystemExit(f"build_python: cannot download {name} {version}: " + "; ".join(errors))


def sources(root: Path) -> list[tuple[tuple[str, str, str, list[str]], Path]]:
    out = []
    for source in SOURCES:
        try:
            out.append((source, download(root, source)))
        except SystemExit:
            if source[0] != "openssl":
                raise
            log(f"openssl {source[1]} is no longer in Debian's pool; using {OPENSSL_FALLBACK[1]}")
            out.append((OPENSSL_FALLBACK, download(root, OPENSSL_FALLBACK)))
    return out


def digest(material: object) -> str:
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:16]


def sh(cmd: list[str], cwd: Path, env: dict[str, str], logfile: Path) -> None:
    with logfile.open("a") as out:
        out.write(f"\n$ {' '.join(cmd)}\n")
        out.flush()
        done = subprocess.run(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        tail = logfile.read_text()[-4000:]
        raise SystemExit(f"build_python: {' '.join(cmd[:3])} failed in {cwd} (full log {logfile}):\n{tail}")


def unpack(archive: Path, into: Path) -> Path:
    with tarfile.open(archive) as tar:
        top = tar.getnames()[0].split("/")[0]
        if hasattr(tarfile, "tar_filter"):
            tar.extractall(into, filter="tar")
        else:
            tar.extractall(into)  # noqa: S202 (pinned, checksummed archives)
    return into / top


def toolchain(work: Path, zig: Path, cache: Path, deps: Path) -> dict[str, str]:
    """``cc``/``ar``/``ranlib`` wrappers around zig for the glibc 2.17 target, and the environment using them."""
    bin_ = work / "bin"
    bin_.mkdir(parents=True, exist_ok=True)
    # -fno-sanitize=undefined: zig cc turns UBSan on when no -O is given (configure's probes).
    # -Wno-date-time: zig makes __DATE__/__TIME__ an error (CPython's getbuildinfo.c uses them).
    for name, body in {
        "cc": f'exec "{zig}" cc -target {TARGET} -fno-sanitize=undefined -Wno-date-time "$@"',
        "ar": f'exec "{zig}" ar "$@"',
        "ranlib": f'exec "{zig}" ranlib "$@"',
    }.items():
        (bin_ / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_ / name).chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_}:{os.environ['PATH']}",
        "CC": str(bin_ / "cc"),
        "AR": str(bin_ / "ar"),
        "RANLIB": str(bin_ / "ranlib"),
        "ZIG_GLOBAL_CACHE_DIR": str(cache),
        "ZIG_LOCAL_CACHE_DIR": str(cache),
        # Only the libraries built here: never the build machine's .pc files or headers.
        "PKG_CONFIG_PATH": str(deps / "lib" / "pkgconfig"),
        "PKG_CONFIG_LIBDIR": str(deps / "lib" / "pkgconfig"),
    }
    for name in ("PYTHONPATH", "PYTHONHOME", "CFLAGS", "LDFLAGS", "CPPFLAGS"):
        env.pop(name, None)
    return env


def build_deps(deps: Path, zig: Path, archives: dict[str, Path]) -> None:
    """zlib, libffi and OpenSSL as static -fPIC archives under ``deps``."""
    work = deps.parent / (deps.name + ".work")
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(deps, ignore_errors=True)
    env = toolchain(work, zig, deps.parent / "zig-cache", deps)
    logfile = work / "build.log"
    j = jobs()
    started = time.monotonic()
    pic = {**env, "CFLAGS": "-O2 -fPIC"}

    log(f"building zlib (log {logfile})")
    src = unpack(archives["zlib"], work)
    sh(["./configure", "--static", f"--prefix={deps}"], src, pic, logfile)
    sh(["make", f"-j{j}", "libz.a"], src, env, logfile)
    sh(["make", "install"], src, env, logfile)

    log(f"building libffi ({time.monotonic() - started:.0f} s so far)")
    src = unpack(archives["libffi"], work)
    sh(
        ["./configure", "--disable-shared", "--enable-static", "--with-pic", "--disable-docs",
         "--disable-multi-os-directory", "--disable-exec-static-tramp", f"--prefix={deps}"],
        src, pic, logfile,
    )  # fmt: skip
    sh(["make", f"-j{j}"], src, env, logfile)
    sh(["make", "install"], src, env, logfile)

    log(f"building OpenSSL's libraries ({time.monotonic() - started:.0f} s so far)")
    src = unpack(archives["openssl"], work)
    sh(
        ["./Configure", "linux-x86_64", *OPENSSL_OPTIONS, "-fPIC", "-O2", f"--prefix={deps}",
         "--openssldir=/etc/ssl", "--libdir=lib"],
        src, env, logfile,
    )  # fmt: skip
    sh(["make", f"-j{j}", "build_libs"], src, env, logfile)
    sh(["make", "install_dev"], src, env, logfile)
    shutil.copy(logfile, deps / "build.log")
    shutil.rmtree(work, ignore_errors=True)
    (deps / ".complete").write_text("")
    log(f"built zlib, libffi and OpenSSL in {time.monotonic() - started:.0f} s")


def build_python(prefix: Path, zig: Path, archive: Path, deps: Path) -> None:
    work = prefix.parent / (prefix.name + ".work")
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(prefix, ignore_errors=True)
    env = toolchain(work, zig, prefix.parent / "zig-cache", deps)
    logfile = work / "build.log"
    started = time.monotonic()
    log(f"building CPython (log {logfile})")
    src = unpack(archive, work)
    sh(
        ["./configure", f"--prefix={prefix}", "--enable-shared", "--disable-test-modules", "--without-ensurepip",
         f"--with-openssl={deps}", "--with-openssl-rpath=no", "--without-readline",
         f"CPPFLAGS=-I{deps}/include", f"LDFLAGS=-L{deps}/lib -Wl,-rpath,\\$$ORIGIN/../lib",
         f"LIBFFI_CFLAGS=-I{deps}/include", f"LIBFFI_LIBS=-L{deps}/lib -lffi",
         f"ZLIB_CFLAGS=-I{deps}/include", f"ZLIB_LIBS=-L{deps}/lib -lz"],
        src, env, logfile,
    )  # fmt: skip
    # zig's linker knows -soname but not its short form -h, which CPython's Makefile uses; and zig
    # cannot link a shared library from shared libraries alone (libpython3.so, the stable-ABI
    # forwarder), so that link gets one empty object.
    (src / "Modules" / "_zigstub.c").write_text("int _Py_zig_link_stub;\n")
    sh([env["CC"], "-O2", "-fPIC", "-c", "Modules/_zigstub.c", "-o", "Modules/_zigstub.o"], src, env, logfile)
    # setup.py (which builds the shared extension modules in 3.11) adds /usr/local and the build
    # machine's multiarch include and library directories: its headers and libraries must not mix
    # with zig's glibc 2.17 ones, so only the directories given here are searched.
    setup = src / "setup.py"
    text = setup.read_text()
    for old in (
        "        if not CROSS_COMPILING:\n"
        "            add_dir_to_list(self.compiler.library_dirs, '/usr/local/lib')\n"
        "            add_dir_to_list(self.compiler.include_dirs, '/usr/local/include')\n",
        "        self.add_multiarch_paths()\n",
    ):
        if old not in text:
            raise SystemExit(f"build_python: CPython's setup.py no longer has {old!r}: update this patch")
        text = text.replace(old, "")
    setup.write_text(text)
    makefile = src / "Makefile"
    text = makefile.read_text()
    for old, new in (
        ("-Wl,-h$(INSTSONAME)", "-Wl,-soname,$(INSTSONAME)"),
        ("-Wl,-h$@ $^", "-Wl,-soname,$@ Modules/_zigstub.o $^"),
    ):
        if old not in text:
            raise SystemExit(f"build_python: CPython's Makefile no longer has {old!r}: update this patch")
        text = text.replace(old, new)
    makefile.write_text(text)
    sh(["make", f"-j{jobs()}"], src, env, logfile)
    sh(["make", "install", "COMPILEALL_OPTS=-j0"], src, env, logfile)
    shutil.rmtree(prefix / "lib" / "python3.11" / "test", ignore_errors=True)
    for static in prefix.glob("lib/python3.11/config-*/libpython3.11.a"):  # 34 MiB, never linked against
        static.unlink()
    shutil.copy(logfile, prefix / "build.log")
    shutil.rmtree(work, ignore_errors=True)
    log(f"built CPython in {time.monotonic() - started:.0f} s")


def prune(root: Path, keep: set[Path]) -> None:
    """Earlier keys' builds: only the current ones are kept."""
    for old in [*root.glob("deps-*"), *root.glob("python-*")]:
        if old not in keep and old.is_dir():
            shutil.rmtree(old, ignore_errors=True)


def keyed_builds(root: Path) -> tuple[Path, Path, dict[str, Path]]:
    """This key's static-library and interpreter directories, and the checked source archives."""
    srcs = sources(root)
    archives = {s[0]: archive for s, archive in srcs}
    hashes = {s[0]: s[2] for s, _ in srcs}
    script = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()
    deps_key = digest(
        [
            ZIGLANG,
            TARGET,
            OPENSSL_OPTIONS,
            inspect.getsource(build_deps),
            [hashes[n] for n in ("zlib", "libffi", "openssl")],
        ]
    )
    return root / f"deps-{deps_key}", root / f"python-{digest([deps_key, hashes['python'], script])}", archives


def drop_zig(root: Path, zig: Path) -> None:
    """Zig and its compile cache (about 530 MiB): installed again, from pip's cache, when next needed."""
    for name in ("zig-cache", zig.parents[4].name):
        shutil.rmtree(root / name, ignore_errors=True)


def interpreter() -> Path:
    """The cached interpreter's path, building it (and its libraries) first when its key has none."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with (root / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        deps, prefix, archives = keyed_builds(root)
        python = prefix / "bin" / "python3.11"
        if (prefix / ".complete").exists():
            return python
        zig = ensure_zig(root)
        if not (deps / ".complete").exists():
            build_deps(deps, zig, archives)
        build_python(prefix, zig, archives["python"], deps)
        check = subprocess.run(
            [str(python), "-c", "import ssl, ctypes, zlib, hashlib; print(ssl.OPENSSL_VERSION)"],
            capture_output=True, text=True,
        )  # fmt: skip
        if check.returncode != 0:
            raise SystemExit(f"build_python: the built interpreter lacks ssl, ctypes or zlib:\n{check.stderr}")
        log(f"{python}: {check.stdout.strip()}")
        (prefix / ".complete").write_text("")
        # What is kept: this interpreter, its static libraries (a CPython-only change reuses them)
        # and the checked sources, about 200 MiB.
        prune(root, {deps, prefix})
        drop_zig(root, zig)
        return python


def compile_with_zlib(source: Path, output: Path, flags: list[str]) -> None:
    """``zig cc`` for TARGET on one C file, linked with the static zlib built for the interpreter.

    For the shipped file's launcher (tools/launcher.c), which like the interpreter must ask for no
    glibc symbol newer than 2.17, and must need no library of the node's but libc.
    """
    interpreter()  # its static libraries exist once it is built
    root = cache_root()
    with (root / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        deps, _, _ = keyed_builds(root)
        zig = ensure_zig(root)
        cache = root / "zig-cache"
        env = {**os.environ, "ZIG_GLOBAL_CACHE_DIR": str(cache), "ZIG_LOCAL_CACHE_DIR": str(cache)}
        for name in ("CFLAGS", "LDFLAGS", "CPPFLAGS"):
            env.pop(name, None)
        try:
            subprocess.run(
                [str(zig), "cc", "-target", TARGET, "-O2", "-fno-sanitize=all", "-std=gnu11", "-Wall", "-Wextra",
                 "-Werror", "-s", f"-I{deps / 'include'}", *flags, str(source), str(deps / "lib" / "libz.a"),
                 "-o", str(output)],
                check=True, env=env,
            )  # fmt: skip
        finally:
            drop_zig(root, zig)


if __name__ == "__main__":
    print(interpreter())
