"""The shipped executable, ``dist/nomad-device-lingjun`` (``make dist``), run with no Python reachable.

Nothing here builds the file: ``make test`` (what CI runs) builds it first
through ``make dist``. In CI (``CI`` set) a missing file fails these tests;
elsewhere they skip and say how to build it. Every launch gets a PATH that
is an empty directory (the launcher unpacks with no other program, and no
``python3`` can be found) and ``PYTHONHOME``/``PYTHONPATH`` pointing at an
empty directory; the plugin must still load libpython and its libraries
from its own unpacked bundle.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from nomad_plugin import PLUGIN_NAME, __version__
from nomad_plugin.cli.main import SUBCOMMANDS
from nomad_plugin.launcher.config import full_config, msgpack_config
from nomad_plugin.launcher.process import PluginProcess
from nomad_plugin.util.bundle import restore_child_environment
from tests.conformance.hostlib import REPO, built_host, real_plugin, run_host, start_host

DIST = REPO / "dist" / PLUGIN_NAME
CACHE_ENV = "NOMAD_DEVICE_LINGJUN_CACHE_DIR"
SOURCES = [
    *REPO.glob("nomad_plugin/**/*.py"), REPO / "pyproject.toml", REPO / "tools/build_dist.py", REPO / "tools/build_python.py",
    REPO / "tools/launcher.c",
]  # fmt: skip
# The glibc the shipped file must run on (tools/build_python.py: manylinux2014's level), and the
# node's own libraries it must never carry a copy of: the build machine's would need its glibc.
GLIBC_FLOOR = (2, 17)
NODE_LIBRARIES = (
    "libc.so",
    "libm.so",
    "libpthread.so",
    "libdl.so",
    "librt.so",
    "ld-linux",
    "libstdc++.so",
    "libgcc_s.so",
)


@pytest.fixture(scope="module")
def dist() -> Path:
    if not DIST.is_file():
        message = f"{DIST} is missing: `make dist` builds it (`make test` does so first)"
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    if not os.environ.get("CI"):
        stale = [p for p in SOURCES if p.stat().st_mtime > DIST.stat().st_mtime]
        if stale:
            pytest.skip(f"{DIST} is older than {stale[0].relative_to(REPO)}: run `make dist` to test the current code")
    return DIST


@pytest.fixture
def no_python(tmp_path: Path) -> dict[str, str]:
    """An environment in which no Python can be found; the cache goes to $HOME/.cache (the default)."""
    bin_dir, empty, home = tmp_path / "bin", tmp_path / "empty", tmp_path / "home"
    for d in (bin_dir, empty, home):
        d.mkdir()
    env = {
        "PATH": str(bin_dir),
        "PYTHONHOME": str(empty),
        "PYTHONPATH": str(empty),
        "HOME": str(home),
        "XDG_CACHE_HOME": "",
        CACHE_ENV: "",
        "LANG": "C.UTF-8",
    }
    assert shutil.which("python3", path=env["PATH"]) is None and shutil.which("python", path=env["PATH"]) is None
    return env


def builds(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.iterdir()) if cache.is_dir() else []


def run(cmd: list[str], env: dict[str, str], cwd: Path, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=cwd, stdin=subprocess.DEVNULL
    )


def test_one_executable_with_its_checksum(dist: Path) -> None:
    assert dist.stat().st_mode & 0o111
    data = dist.read_bytes()
    assert data[:4] == b"\x7fELF"  # the launcher (tools/launcher.c)
    line = data[data.rindex(b"\n", 0, len(data) - 1) + 1 :].decode()
    fields = dict(word.split("=") for word in line.split()[2:])
    assert line.startswith(f"{PLUGIN_NAME} bundle version={__version__} key=") and fields["glibc"] == "2.17", line
    offset, size = int(fields["offset"]), int(fields["size"])
    assert offset + size + len(line) + 1 == len(data) and data[offset : offset + 2] == b"\x1f\x8b", line
    assert 8 * 2**20 < dist.stat().st_size < 64 * 2**20, dist.stat().st_size
    digest, name = (REPO / "dist" / f"{PLUGIN_NAME}.sha256").read_text().split()
    assert name == PLUGIN_NAME
    assert digest == hashlib.sha256(dist.read_bytes()).hexdigest(), "dist/*.sha256 does not match the file"


def test_conformance_host_passes_the_dist_file_without_python(
    dist: Path, no_python: dict[str, str], tmp_path: Path
) -> None:
    """The issue's 'Done when': Nomad's three launches, Go go-plugin client, no Python reachable."""
    if shutil.which("go") is None and not os.environ.get("CI"):
        pytest.skip("`go` is not installed (the conformance host needs it; `make test` installs it)")
    host = start_host(
        ["--plugin", str(dist), "--config", str(REPO / "plugin.hcl"),
         "--phase", "all", "--duration", "0", "--stats-interval", "0.5",
         "--set", f'data_dir="{tmp_path / "data"}"'],  # never plugin.hcl's default, a real node's journal
        env=no_python, binary=built_host(), cwd=tmp_path,
    )  # fmt: skip
    try:
        # The Stats stream keeps delivering: wait (with a deadline, not a fixed run time) for a second message.
        host.wait_for(lambda e: e.get("event") == "stats", timeout=60)
        host.wait_for(lambda e: e.get("event") == "stats", timeout=60)
    finally:
        run_ = host.finish(timeout=60)
    assert run_.returncode == 0, run_.describe()
    assert run_.summary["violations"] == 0
    info = run_.of("plugin_info")[0]
    assert (info["type"], info["name"], info["api_version_selected"]) == ("DEVICE", PLUGIN_NAME, "v0.1.0")
    assert [s["ok"] for s in run_.of("set_config")] == [True, True, True]
    assert run_.of("fingerprint")[0]["valid"] is True
    assert len(run_.of("stats")) >= 2, run_.describe()
    assert [s["graceful"] for s in run_.of("shutdown")] == [True, True, True], run_.describe()
    cache = Path(no_python["HOME"]) / ".cache" / PLUGIN_NAME
    (build,) = builds(cache)
    assert build.startswith(f"{PLUGIN_NAME}-{__version__}-")


def test_runs_its_own_interpreter_and_libraries(dist: Path, no_python: dict[str, str]) -> None:
    """After the handshake and a SetConfig, every Python library mapped into the plugin comes from its unpacked
    bundle (msgpack's C extension loads with the first SetConfig)."""
    proc = PluginProcess([str(dist)], env=no_python, handshake_timeout=60)
    with proc:
        assert proc.handshake is not None
        info = proc.plugin_info()
        assert (info.type, info.name, info.version) == ("DEVICE", PLUGIN_NAME, __version__)
        proc.set_config(msgpack_config(full_config({"enabled": False})))
        assert proc.proc is not None
        maps = Path(f"/proc/{proc.proc.pid}/maps").read_text()
        status = Path(f"/proc/{proc.proc.pid}/status").read_text()
    assert proc.extra_stdout == []  # the handshake line only: the launcher prints nothing
    ours = os.umask(0o022)
    os.umask(ours)
    # This was the build's first launch: the launcher's umask for unpacking was put back before the exec.
    assert f"Umask:\t{ours:04o}" in status, status
    (build,) = builds(Path(no_python["HOME"]) / ".cache" / PLUGIN_NAME)
    bundle = str(Path(no_python["HOME"]) / ".cache" / PLUGIN_NAME / build)
    mapped = {
        line.split()[-1] for line in maps.splitlines() if len(line.split()) >= 6 and line.split()[-1].startswith("/")
    }
    python_libs = {p for p in mapped if "libpython" in p or "cygrpc" in p or "_upb" in p or "_cmsgpack" in p}
    assert len(python_libs) >= 4, sorted(mapped)
    assert all(p.startswith(bundle + "/") for p in python_libs), sorted(python_libs)


def test_doctor_knows_the_shipped_file(dist: Path, tmp_path: Path) -> None:
    """The plugin-file check reads the file tools/build_dist.py wrote, not a stand-in's."""
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / PLUGIN_NAME).symlink_to(dist)
    done = subprocess.run(
        [str(real_plugin()), "doctor", "--json", "--plugin-dir", str(plugins), "--set", f'data_dir="{tmp_path / "d"}"'],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    (found,) = [f for f in json.loads(done.stdout)["findings"] if f["check"] == "plugin file"]
    assert found["status"] == "ok" and f"is the shipped file, version {__version__}," in found["summary"], found


def test_usage_version_and_operator_commands(dist: Path, no_python: dict[str, str], tmp_path: Path) -> None:
    usage = run([str(dist)], no_python, tmp_path)
    assert usage.returncode == 1 and "This binary is a plugin" in usage.stderr and usage.stdout == ""
    version = run([str(dist), "--version"], no_python, tmp_path)
    assert version.stdout.strip() == f"{PLUGIN_NAME} {__version__}", version.stderr
    for name in SUBCOMMANDS:  # each subcommand's module (imported by name) is in the bundle
        helped = run([str(dist), name, "--help"], no_python, tmp_path)
        assert helped.returncode == 0 and "usage: nomad-device-lingjun" in helped.stdout + helped.stderr, (
            name,
            helped.stderr[-2000:],
        )
    check = run(
        [str(dist), "check-job", str(REPO / "examples/jobs/raw-exec-env.nomad.hcl"), "--profile", "h800-8",
         "--node-value", "node.pool=default"],
        no_python, tmp_path,
    )  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    assert "served by nvidia/gpu/NVIDIA H800" in check.stdout


def test_binds_the_official_proto_without_python(dist: Path, no_python: dict[str, str], tmp_path: Path) -> None:
    """xdm_schema = "<.proto dir>" compiles with the bundled protoc and well-known types."""
    import tempfile

    from nomad_plugin.sim import Simulator
    from tests.doubles.drifted_schemas import served_schema

    root = Path(tempfile.mkdtemp(prefix="dist-", dir="/tmp"))  # short: Unix socket paths
    try:
        with Simulator(root / "s", "h800-8", schema=served_schema("foreign")) as sim:
            sim.schema.emit(root / "official")
            probe = run(
                [str(dist), "xdm-probe", "--socket-dir", str(root / "s"), "--set", f'xdm_schema="{root / "official"}"'],
                no_python, tmp_path,
            )  # fmt: skip
    finally:
        shutil.rmtree(root, ignore_errors=True)
    out = probe.stdout + probe.stderr
    assert probe.returncode == 0, out
    assert "rpc ListAndWatch -> /ljrk.dp2mgr.v1.XpuDeviceManagerService/ListAndWatch" in out and "verdict: ok" in out


def test_nvml_bindings_are_bundled(dist: Path, no_python: dict[str, str], tmp_path: Path) -> None:
    """backend = "nvml" reaches NVML itself: no 'install nvidia-ml-py' hint (this box has no NVIDIA driver)."""
    fp = run([str(dist), "fingerprint", "--set", 'backend="nvml"', "--timeout", "5"], no_python, tmp_path)
    out = fp.stdout + fp.stderr
    assert "nvidia-ml-py" not in out, out
    assert fp.returncode == 0 or "NVML Shared Library Not Found" in out, out


def test_unpacks_once_keeps_one_previous_build_and_never_touches_other_files(
    dist: Path, no_python: dict[str, str], tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    old = time.time() - 7200
    for i, name in enumerate((f"{PLUGIN_NAME}-0.0.1-{'a' * 16}", f"{PLUGIN_NAME}-0.0.2-{'b' * 16}")):
        (cache / name).mkdir()
        os.utime(cache / name, (old + i, old + i))  # 0.0.2 is the more recent
    (cache / "operator-notes").mkdir()
    stale = cache / f".{PLUGIN_NAME}-0.0.3-{'c' * 16}.Ab12Cd"  # a first launch killed mid-unpack
    stale.mkdir()
    os.utime(stale, (old, old))
    env = {**no_python, CACHE_ENV: str(cache)}

    first = run([str(dist), "--version"], env, tmp_path)
    assert first.returncode == 0, first.stderr
    ours = [b for b in builds(cache) if b.startswith(f"{PLUGIN_NAME}-{__version__}-")]
    assert len(ours) == 1
    assert builds(cache) == sorted([ours[0], f"{PLUGIN_NAME}-0.0.2-{'b' * 16}", "operator-notes"])

    # Later launches exec the unpacked bundle, and leave the other builds alone.
    again = run([str(dist), "--version"], env, tmp_path)
    assert again.returncode == 0 and again.stdout.strip() == f"{PLUGIN_NAME} {__version__}", again.stderr


def test_concurrent_first_launches_install_one_copy(dist: Path, no_python: dict[str, str], tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    env = {**no_python, CACHE_ENV: str(cache)}
    results: list[subprocess.CompletedProcess[str]] = []
    threads = [
        threading.Thread(target=lambda: results.append(run([str(dist), "--version"], env, tmp_path))) for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r.returncode for r in results] == [0, 0, 0, 0], [r.stderr for r in results]
    assert all(r.stdout.strip() == f"{PLUGIN_NAME} {__version__}" for r in results)
    assert len(builds(cache)) == 1, builds(cache)  # no second copy, no partial unpack left behind


def test_damaged_file_and_bad_cache_dir_fail_clearly(dist: Path, no_python: dict[str, str], tmp_path: Path) -> None:
    truncated = tmp_path / PLUGIN_NAME
    data = dist.read_bytes()
    truncated.write_bytes(data[: len(data) // 2])
    truncated.chmod(0o755)
    cache = tmp_path / "cache"
    broken = run([str(truncated), "--version"], {**no_python, CACHE_ENV: str(cache)}, tmp_path)
    assert broken.returncode == 1 and broken.stdout == ""
    assert "truncated or damaged" in broken.stderr, broken.stderr
    assert builds(cache) == []  # the partial unpack was removed

    relative = run([str(dist), "--version"], {**no_python, CACHE_ENV: "relative/dir"}, tmp_path)
    assert relative.returncode == 1 and relative.stdout == ""
    assert f"must be an absolute path, got 'relative/dir' (set {CACHE_ENV})" in relative.stderr


def glibc_needed(path: Path) -> tuple[int, int] | None:
    """The newest GLIBC_x.y symbol version ``path`` asks for (None: not ELF, or none needed)."""
    from elftools.elf.elffile import ELFFile
    from elftools.elf.gnuversions import GNUVerNeedSection

    with path.open("rb") as f:
        if f.read(4) != b"\x7fELF":
            return None
        f.seek(0)
        elf = ELFFile(f)
        needed: list[tuple[int, int]] = []
        for section in elf.iter_sections():
            if isinstance(section, GNUVerNeedSection):
                for _, auxiliaries in section.iter_versions():
                    for aux in auxiliaries:
                        name = aux.name
                        if name.startswith("GLIBC_2."):
                            needed.append((2, int(name.split(".")[1])))
        return max(needed, default=None)


def test_every_bundled_elf_file_needs_glibc_2_17_at_most(dist: Path, no_python: dict[str, str], tmp_path: Path) -> None:
    """Read the version-needs section of every ELF file the build unpacks (pyelftools, not a string scan)."""
    cache = tmp_path / "cache"
    assert run([str(dist), "--version"], {**no_python, CACHE_ENV: str(cache)}, tmp_path).returncode == 0
    (build,) = builds(cache)
    root = cache / build
    files = sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink())
    needs = {p.relative_to(root).as_posix(): glibc_needed(p) for p in files}
    elf = {name: v for name, v in needs.items() if v is not None}
    # Not vacuous: the bootloader, libpython, the ssl/ctypes modules and the gRPC/protobuf wheels' modules.
    names = " ".join(elf)
    for part in (PLUGIN_NAME, "libpython3.11.so", "_ssl.", "_ctypes.", "cygrpc.", "_message."):
        assert part in names, (part, sorted(elf))
    too_new = {name: v for name, v in elf.items() if v > GLIBC_FLOOR}
    assert too_new == {}, f"need a glibc newer than {GLIBC_FLOOR}: {too_new}"
    carried = [n for n in needs if any(n.rsplit("/", 1)[-1].startswith(lib) for lib in NODE_LIBRARIES)]
    assert carried == [], f"the bundle carries the build machine's system libraries: {carried}"


def test_the_launcher_needs_glibc_2_17_at_most_and_no_other_library(dist: Path) -> None:
    """It runs before anything is unpacked, on the node's own libraries: zlib is linked in, not the node's."""
    from elftools.elf.dynamic import DynamicSection
    from elftools.elf.elffile import ELFFile

    needed = glibc_needed(dist)
    assert needed is not None and needed <= GLIBC_FLOOR, needed
    with dist.open("rb") as f:
        sections = [s for s in ELFFile(f).iter_sections() if isinstance(s, DynamicSection)]
        libraries = [tag.needed for s in sections for tag in s.iter_tags() if tag.entry.d_tag == "DT_NEEDED"]
    assert libraries == ["libc.so.6"], libraries


def test_the_glibc_reader_sees_a_newer_glibc() -> None:
    """The check above can fail: this machine's own libstdc++ asks for its (newer) glibc."""
    import ctypes

    libc = ctypes.CDLL(None)
    libc.gnu_get_libc_version.restype = ctypes.c_char_p
    host = tuple(int(x) for x in libc.gnu_get_libc_version().decode().split(".")[:2])
    candidates = [Path(p) for p in ("/usr/lib/x86_64-linux-gnu/libstdc++.so.6", "/usr/lib64/libstdc++.so.6")]
    found = next((p for p in candidates if p.exists()), None)
    if found is None or host <= GLIBC_FLOOR:
        pytest.skip("no libstdc++ built for a glibc newer than 2.17 on this machine")
    needed = glibc_needed(found.resolve())
    assert needed is not None and needed > GLIBC_FLOOR, needed


def test_self_check_ssl_ctypes_nvml_inside_the_bundle(dist: Path, no_python: dict[str, str], tmp_path: Path) -> None:
    """The bundled interpreter (built for glibc 2.17) has a working ssl, ctypes, zlib and the NVML bindings."""
    done = run([str(dist), "--self-check"], no_python, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] is True and report["frozen"] is True, report
    assert report["openssl"].startswith("OpenSSL 3.0."), report
    assert report["tls_minimum"] == "TLSv1_2" and report["pynvml"] is True, report
    assert report["re2"] is True, report  # check-job's RE2 regexps work in the shipped file


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory to another user")
def test_refuses_a_build_directory_owned_by_someone_else(dist: Path, no_python: dict[str, str], tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    env = {**no_python, CACHE_ENV: str(cache)}
    assert run([str(dist), "--version"], env, tmp_path).returncode == 0
    (build,) = builds(cache)
    os.chown(cache / build, 65534, 65534)
    refused = run([str(dist), "--version"], env, tmp_path)
    assert refused.returncode == 1 and refused.stdout == ""
    assert "is not owned by this user; refusing to run it" in refused.stderr, refused.stderr


def test_children_get_the_nodes_library_path_not_the_bundles(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unit test of what the dist file's entry does before anything else (no dist file needed)."""
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    env = {"LD_LIBRARY_PATH": "/cache/b/_internal:/opt/x", "LD_LIBRARY_PATH_ORIG": "/opt/x", "HOME": "/root"}
    restore_child_environment(env)
    assert env == {"LD_LIBRARY_PATH": "/opt/x", "PYINSTALLER_RESET_ENVIRONMENT": "1", "HOME": "/root"}
    env = {"LD_LIBRARY_PATH": "/cache/b/_internal"}
    restore_child_environment(env)
    assert env == {"PYINSTALLER_RESET_ENVIRONMENT": "1"}
    monkeypatch.delattr(sys, "frozen")
    env = {"LD_LIBRARY_PATH": "/opt/x"}
    restore_child_environment(env)
    assert env == {"LD_LIBRARY_PATH": "/opt/x"}  # the console script leaves it alone


def test_cache_location_honours_xdg_cache_home(dist: Path, no_python: dict[str, str], tmp_path: Path) -> None:
    xdg = tmp_path / "xdg"
    done = run([str(dist), "--version"], {**no_python, "XDG_CACHE_HOME": str(xdg)}, tmp_path)
    assert done.returncode == 0, done.stderr
    assert len(builds(xdg / PLUGIN_NAME)) == 1
    assert not (Path(no_python["HOME"]) / ".cache").exists()
    assert oct((xdg / PLUGIN_NAME).stat().st_mode & 0o777) == "0o700"


def test_xdm_schema_from_proto_files_compiles_inside_the_bundle(
    dist: Path, no_python: dict[str, str], tmp_path: Path
) -> None:
    """xdm_schema = "<.proto path>" runs grpcio-tools' protoc in-process, with its bundled well-known types."""
    if shutil.which("go") is None and not os.environ.get("CI"):
        pytest.skip("`go` is not installed (the conformance host needs it; `make test` installs it)")
    host = built_host()
    base = ["--plugin", str(dist), "--phase", "validate"]
    good = run_host(
        [*base, "--set", f'xdm_schema="{REPO / "proto" / "lingjun"}"'], env=no_python, binary=host, cwd=tmp_path
    )
    assert good.returncode == 0, good.describe()
    assert [c["ok"] for c in good.of("set_config")] == [True, True], good.describe()

    broken = tmp_path / "api_outer.proto"
    broken.write_text('syntax = "proto3";\nmessage Device { int32 minor = 1 }\n')
    bad = run_host(
        [*base, "--set", f'xdm_schema="{broken}"', "--expect-set-config", "error"],
        env=no_python, binary=host, cwd=tmp_path,
    )  # fmt: skip
    assert bad.returncode == 0, bad.describe()
    (call,) = bad.of("set_config")
    assert call["code"] == "InvalidArgument" and 'Expected ";"' in call["message"], call  # protoc's own message


def extension_modules(cmd: list[str], env: dict[str, str]) -> set[str]:
    """Names of the Python extension modules mapped into the plugin once it has settled after its handshake.

    The handshake goes out as soon as gRPC listens and the Nomad services (protobuf's ``_message``) are
    imported right after it, so wait for that import with a deadline instead of reading the maps at once.
    """

    def mapped(pid: int) -> set[str]:
        maps = Path(f"/proc/{pid}/maps").read_text()
        files = {line.split()[-1].rsplit("/", 1)[-1] for line in maps.splitlines() if line.rstrip().endswith(".so")}
        return {f.split(".", 1)[0] for f in files if ".cpython-" in f or f.endswith(".abi3.so")}

    proc = PluginProcess(cmd, env=env, handshake_timeout=60)
    with proc:
        assert proc.proc is not None
        pid = proc.proc.pid
        deadline = time.monotonic() + 60
        while not {"cygrpc", "_message"} <= (found := mapped(pid)):
            assert time.monotonic() < deadline, (
                f"the plugin never imported grpc and protobuf after its handshake: {found}"
            )
            time.sleep(0.05)
        time.sleep(0.5)  # what else start-up maps right after the services
        return mapped(pid)


def test_launch_imports_nothing_the_console_script_does_not(dist: Path, no_python: dict[str, str]) -> None:
    """Start-up guard without timing: PyInstaller start-up hooks for bundled-but-unused packages
    (setuptools, multiprocessing) once made each launch import hashlib, csv, ctypes... (x1.36)."""
    console_env = {k: v for k, v in os.environ.items() if k not in ("NOMAD_PLUGIN_MAGIC_COOKIE", "PYTHONPATH")}
    console = extension_modules([str(real_plugin())], console_env)
    shipped = extension_modules([str(dist)], no_python)
    assert {"cygrpc", "_message"} <= console & shipped, (console, shipped)
    # _ctypes: PyInstaller's bootstrap hooks ctypes so bundled libraries resolve (NVML needs ctypes anyway).
    assert shipped - console <= {"_ctypes"}, sorted(shipped - console)


def test_xdm_sim_and_capture_bundle_from_the_dist_file(dist: Path, no_python: dict[str, str], tmp_path: Path) -> None:
    """The simulator and `xdm-probe --capture` (reflection client, package versions) work from the bundle."""
    sockets, out = tmp_path / "xdm", tmp_path / "capture"
    sim = subprocess.Popen(
        [str(dist), "xdm-sim", "--socket-dir", str(sockets)],
        env=no_python, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not (sockets / "dp2mgr.sock").exists():
            assert sim.poll() is None, f"xdm-sim exited: {sim.communicate()[1][-2000:]}"
            assert time.monotonic() < deadline, "xdm-sim made no dp2mgr.sock within 60 s"
            time.sleep(0.1)
        probe = run([str(dist), "xdm-probe", "--socket-dir", str(sockets), "--capture", str(out)], no_python, tmp_path)
    finally:
        sim.terminate()
        sim.communicate(timeout=30)
    assert probe.returncode == 0, probe.stdout + probe.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["ok"] is True
    assert set(manifest["reflection"]) == {"dp2mgr", "config-daemon"}
    for dist_name in ("grpcio", "protobuf", "grpcio-reflection"):
        assert manifest["versions"][dist_name] != "not installed", manifest["versions"]


def test_runs_on_an_older_glibc_in_a_chroot(dist: Path) -> None:
    """The best proof of the floor: the file itself, run on an older distribution's glibc (opt-in).

    ``tools/check_old_glibc.sh ROOT`` makes a Debian 11 chroot (glibc 2.31, older than Alibaba
    Cloud Linux 3's 2.32) with debootstrap and runs --self-check, check-job and the conformance
    host there. It needs root and Debian's archive, so it runs only when
    NOMAD_DEVICE_LINGJUN_OLD_GLIBC_ROOT names such a root (made once by that script).
    """
    root = os.environ.get("NOMAD_DEVICE_LINGJUN_OLD_GLIBC_ROOT", "")
    if not root or not (Path(root) / "bin" / "sh").exists() or os.geteuid() != 0:
        pytest.skip("set NOMAD_DEVICE_LINGJUN_OLD_GLIBC_ROOT to a root made by tools/check_old_glibc.sh (as root)")
    built_host()
    done = subprocess.run(
        ["sh", str(REPO / "tools" / "check_old_glibc.sh"), root], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    report = json.loads(lines[lines.index("== --self-check") + 1])
    assert report["ok"] is True and report["frozen"] is True, report
    node = tuple(int(x) for x in report["glibc"].split("."))
    host = tuple(int(x) for x in (os.confstr("CS_GNU_LIBC_VERSION") or "glibc 0.0").split()[1].split("."))
    assert node < host, f"the chroot's glibc {report['glibc']} is not older than this machine's {host}"
    summary = json.loads(lines[lines.index("== conformance host") + 1])
    assert summary["violations"] == 0 and summary["event_counts"]["shutdown"] == 3, summary
