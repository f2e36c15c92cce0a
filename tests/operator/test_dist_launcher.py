"""The shipped file's launcher (tools/launcher.c) on first launches no shell tool could help with.

Each file here is laid out as tools/build_dist.py lays out the real one: the launcher's bytes, taken
from ``dist/nomad-device-lingjun`` itself, then a small gzip'd ustar archive whose
``nomad-device-lingjun`` is a sh script, then the bundle line (``build_dist.trailer``). What the
launcher does with it (read its own end, unpack, exec) is what it does with the real bundle, without
unpacking 60 MiB each time. tests/operator/test_dist.py says when a missing dist file fails or skips.
"""

from __future__ import annotations

import gzip
import io
import os
import shutil
import stat
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from nomad_plugin import PLUGIN_NAME
from tests.operator.test_dist import CACHE_ENV, dist  # noqa: F401 - the fixture

REPO = Path(__file__).resolve().parents[2]
BUNDLE_SCRIPT = b'#!/bin/sh\necho "bundle ran: $*"\n'
BUILD = f"{PLUGIN_NAME}-9.9.9-0123456789abcdef"
# What doctor's identity check needs of a launcher (it reads bytes, runs nothing): an ELF file that
# quotes the bundle line. Tests that run the file use the real launcher instead.
STAND_IN_LAUNCHER = b"\x7fELF" + bytes(60) + f"{PLUGIN_NAME} bundle version=%63[...]".encode() + bytes(8)


def build_dist_module():  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(REPO / "tools"))
    try:
        import build_dist
    finally:
        sys.path.remove(str(REPO / "tools"))
    return build_dist


def archive(entries: list[tuple[tarfile.TarInfo, bytes]]) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for info, data in entries:
            info.size = len(data) if info.isreg() else 0
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return gzip.compress(raw.getvalue(), mtime=0)


def entry(name: str, kind: bytes = tarfile.REGTYPE, mode: int = 0o755, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.linkname = kind, mode, link
    return info


def shipped_file(
    path: Path, version: str = "9.9.9", launcher: bytes = STAND_IN_LAUNCHER, data: bytes | None = None
) -> Path:
    """A file laid out as build_dist.build() lays it out: launcher, gzip'd archive, bundle line."""
    if data is None:
        data = archive([(entry(PLUGIN_NAME), BUNDLE_SCRIPT)])
    line = build_dist_module().trailer(version, "0123456789abcdef", (2, 17), len(launcher), len(data))
    path.write_bytes(launcher + data + line)
    path.chmod(0o755)
    return path


@pytest.fixture(scope="module")
def launcher(dist: Path) -> bytes:  # noqa: F811 - the fixture
    """The launcher's bytes, cut from the shipped file where its bundle line says the archive starts."""
    data = dist.read_bytes()
    line = data[data.rindex(b"\n", 0, len(data) - 1) + 1 :].decode()
    offset = int(line.split(" offset=")[1].split()[0])
    assert data[offset : offset + 2] == b"\x1f\x8b", line
    return data[:offset]


@pytest.fixture
def make(launcher: bytes, tmp_path: Path) -> Callable[..., Path]:
    def made(path: Path | None = None, data: bytes | None = None, version: str = "9.9.9") -> Path:
        return shipped_file(path or tmp_path / PLUGIN_NAME, version, launcher, data)

    return made


def launch(ship: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(ship), *args], env=env, capture_output=True, text=True, timeout=60)


def test_no_path_at_all_still_unpacks_and_runs(make: Callable[..., Path], tmp_path: Path) -> None:
    ship, cache = make(), tmp_path / "cache"
    done = launch(ship, {CACHE_ENV: str(cache)}, "--version")  # no PATH variable: no tool could be found
    assert (done.returncode, done.stdout, done.stderr) == (0, "bundle ran: --version\n", "")
    assert [p.name for p in cache.iterdir()] == [BUILD]
    assert stat.S_IMODE((cache / BUILD / PLUGIN_NAME).stat().st_mode) == 0o700  # unpacked under umask 077
    again = launch(ship, {CACHE_ENV: str(cache), "PATH": ""}, "x", "y z")
    assert (again.returncode, again.stdout, again.stderr) == (0, "bundle ran: x y z\n", "")


def test_a_root_with_only_sh_and_libc_unpacks_and_runs(make: Callable[..., Path], tmp_path: Path) -> None:
    """No coreutils, tar or gzip anywhere: only /bin/sh (the tiny bundle is a sh script) and libc."""
    chroot = shutil.which("chroot")
    if os.geteuid() != 0 or chroot is None:
        pytest.skip("needs root and chroot")
    root = tmp_path / "root"
    sh = Path(os.path.realpath("/bin/sh"))
    libs = subprocess.run(["ldd", str(sh)], capture_output=True, text=True, check=True).stdout.split()
    for path in [str(sh), *(word for word in libs if word.startswith("/"))]:
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(os.path.realpath(path), target)
    (root / "bin").mkdir(exist_ok=True)
    if not (root / "bin" / "sh").exists():
        (root / "bin" / "sh").symlink_to(sh.name if sh.parent == Path("/bin") else str(sh))
    tools = [
        p.name for p in root.rglob("*") if p.is_file() and not p.is_symlink() and not p.name.startswith(("ld-", "lib"))
    ]
    assert tools == [sh.name], tools
    make(root / PLUGIN_NAME)
    env = {"PATH": "/bin:/usr/bin", CACHE_ENV: "/cache/nested", "HOME": "/"}
    done = subprocess.run(
        [chroot, str(root), f"/{PLUGIN_NAME}", "--version"], env=env, capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "bundle ran: --version\n", "")
    assert [p.name for p in (root / "cache" / "nested").iterdir()] == [BUILD]


def fake_glibc(tmp_path: Path, version: str) -> dict[str, str]:
    """LD_PRELOAD of a library whose gnu_get_libc_version() says ``version``: the node's glibc as the launcher asks it."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        if os.environ.get("CI"):
            pytest.fail("no C compiler (cc) to build the glibc-version shim", pytrace=False)
        pytest.skip("no C compiler (cc) to build the glibc-version shim")
    source, shim = tmp_path / "glibc.c", tmp_path / f"glibc-{version}.so"
    source.write_text(f'const char *gnu_get_libc_version(void) {{ return "{version}"; }}\n')
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(shim), str(source)], check=True, timeout=60)
    return {"LD_PRELOAD": str(shim)}


def test_an_older_glibc_is_named_before_anything_is_unpacked(make: Callable[..., Path], tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    old = launch(make(), {CACHE_ENV: str(cache), **fake_glibc(tmp_path, "2.16")}, "--version")
    assert (old.returncode, old.stdout) == (1, "")
    assert old.stderr == f"{PLUGIN_NAME}: needs glibc >= 2.17, this node has 2.16\n"
    assert not cache.exists()


def test_glibc_2_17_is_let_through(make: Callable[..., Path], tmp_path: Path) -> None:
    """The floor is manylinux2014's, not the build machine's (Debian 12: 2.36)."""
    ok = launch(make(), {CACHE_ENV: str(tmp_path / "cache"), **fake_glibc(tmp_path, "2.17")}, "--version")
    assert (ok.returncode, ok.stdout, ok.stderr) == (0, "bundle ran: --version\n", "")


def test_an_archive_that_ends_with_its_last_record_unpacks(make: Callable[..., Path], tmp_path: Path) -> None:
    """One file of 8704 bytes: header, data and the two end blocks fill tarfile's 10240-byte record exactly,
    so the gzip stream ends right after the last end block (no zero padding to read past)."""
    script = BUNDLE_SCRIPT + b"#" * (8704 - len(BUNDLE_SCRIPT) - 1) + b"\n"
    data = archive([(entry(PLUGIN_NAME), script)])
    assert len(gzip.decompress(data)) == tarfile.RECORDSIZE
    done = launch(make(data=data), {CACHE_ENV: str(tmp_path / "cache")}, "--version")
    assert (done.returncode, done.stdout, done.stderr) == (0, "bundle ran: --version\n", "")


@pytest.mark.parametrize("damage", ["flipped", "cut"])
def test_a_damaged_archive_is_named_and_leaves_nothing(damage: str, make: Callable[..., Path], tmp_path: Path) -> None:
    data = bytearray(archive([(entry("_internal", tarfile.DIRTYPE), b""), (entry(PLUGIN_NAME), BUNDLE_SCRIPT * 400)]))
    if damage == "flipped":
        data[len(data) // 2] ^= 0xFF  # the gzip stream's CRC (or its blocks) no longer agree
    else:
        del data[len(data) // 2 :]  # the stream stops early (the bundle line says this shorter size)
    ship, cache = make(data=bytes(data)), tmp_path / "cache"
    broken = launch(ship, {CACHE_ENV: str(cache)}, "--version")
    assert (broken.returncode, broken.stdout) == (1, "")
    assert broken.stderr == (
        f"{PLUGIN_NAME}: cannot unpack {ship}: the file is truncated or damaged "
        f"(compare it with {PLUGIN_NAME}.sha256)\n"
    )
    assert list(cache.iterdir()) == []  # the partial unpack was removed


def test_a_truncated_file_is_named_before_anything_is_made(make: Callable[..., Path], tmp_path: Path) -> None:
    ship, cache = make(), tmp_path / "cache"
    ship.write_bytes(ship.read_bytes()[:-10])
    cut = launch(ship, {CACHE_ENV: str(cache)}, "--version")
    assert (cut.returncode, cut.stdout) == (1, "")
    assert cut.stderr == (
        f"{PLUGIN_NAME}: {ship} is truncated or damaged: no bundle at its end (compare it with {PLUGIN_NAME}.sha256)\n"
    )
    assert not cache.exists()


@pytest.mark.parametrize(
    "bad",
    [
        entry(f"../{PLUGIN_NAME}"),
        entry(f"/tmp/{PLUGIN_NAME}"),
        entry("_internal", tarfile.SYMTYPE, link="/"),
        entry("_internal", tarfile.LNKTYPE, link=PLUGIN_NAME),
    ],
    ids=["parent", "absolute", "symlink", "hardlink"],
)
def test_an_archive_entry_that_could_write_elsewhere_is_refused(
    bad: tarfile.TarInfo, make: Callable[..., Path], tmp_path: Path
) -> None:
    """The archive is the build's own, but a damaged or altered file must not write outside its directory."""
    data = archive([(entry(PLUGIN_NAME), BUNDLE_SCRIPT), (bad, BUNDLE_SCRIPT)])
    cache = tmp_path / "deep" / "cache"
    ship = make(data=data)
    refused = launch(ship, {CACHE_ENV: str(cache)}, "--version")
    assert refused.returncode == 1 and "the file is truncated or damaged" in refused.stderr, refused.stderr
    assert list(cache.iterdir()) == []
    assert sorted(p.name for p in (tmp_path / "deep").iterdir()) == ["cache"]


def test_a_cache_directory_that_cannot_be_made_is_named(make: Callable[..., Path], tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    failed = launch(make(), {CACHE_ENV: str(blocker / "cache")}, "--version")
    assert (failed.returncode, failed.stdout) == (1, "")
    assert failed.stderr == (
        f"{PLUGIN_NAME}: cannot create the cache directory {blocker}/cache: Not a directory "
        f"(set {CACHE_ENV} to a writable local directory)\n"
    )


def test_the_cache_location_rules(make: Callable[..., Path], tmp_path: Path) -> None:
    """A relative cache directory is refused; XDG_CACHE_HOME comes before HOME (here "/", which is never used)."""
    ship = make()
    relative = launch(ship, {CACHE_ENV: "rel/dir"}, "--version")
    assert (
        relative.stderr
        == f"{PLUGIN_NAME}: the cache directory must be an absolute path, got 'rel/dir' (set {CACHE_ENV})\n"
    )
    assert launch(ship, {"HOME": "/", "XDG_CACHE_HOME": str(tmp_path / "xdg")}, "v").stdout == "bundle ran: v\n"
    assert [p.name for p in (tmp_path / "xdg" / PLUGIN_NAME).iterdir()] == [BUILD]


def test_a_build_directory_without_its_plugin_is_named(make: Callable[..., Path], tmp_path: Path) -> None:
    ship, cache = make(), tmp_path / "cache"
    (cache / BUILD / "_internal").mkdir(parents=True)  # a build directory someone emptied
    failed = launch(ship, {CACHE_ENV: str(cache)}, "--version")
    assert (failed.returncode, failed.stdout) == (1, "")
    assert failed.stderr == (
        f"{PLUGIN_NAME}: cannot install the bundle into {cache / BUILD}: that directory exists but holds no "
        f"{PLUGIN_NAME} (delete it; the next launch unpacks again)\n"
    )
    assert [p.name for p in cache.iterdir()] == [BUILD]  # this launch's own unpack was removed
    shutil.rmtree(cache / BUILD)
    assert launch(ship, {CACHE_ENV: str(cache)}, "--version").stdout == "bundle ran: --version\n"


def test_a_cache_on_a_noexec_mount_is_named(make: Callable[..., Path], tmp_path: Path) -> None:
    """Unpacked once, then each launch says why it cannot run the plugin (not "holds no plugin", not a re-unpack)."""
    mount = shutil.which("mount")
    if os.geteuid() != 0 or mount is None:
        pytest.skip("needs root and mount")
    point = tmp_path / "noexec"
    point.mkdir()
    if subprocess.run([mount, "-t", "tmpfs", "-o", "noexec,size=16m", "tmpfs", str(point)]).returncode != 0:
        pytest.skip("this machine does not allow mounting a tmpfs")
    try:
        ship, cache = make(), point / "cache"
        for _ in range(2):
            failed = launch(ship, {CACHE_ENV: str(cache)}, "--version")
            assert (failed.returncode, failed.stdout) == (1, "")
            assert failed.stderr == (
                f"{PLUGIN_NAME}: cannot run {cache / BUILD / PLUGIN_NAME}: Permission denied (is the cache on a "
                f"noexec file system? set {CACHE_ENV} to a directory on one that is not)\n"
            )
            assert [p.name for p in cache.iterdir()] == [BUILD]
    finally:
        subprocess.run(["umount", str(point)], check=True)


def test_garbled_archive_headers_never_crash_it_or_write_elsewhere(make: Callable[..., Path], tmp_path: Path) -> None:
    """A valid gzip stream around a tar whose bytes were changed at random: the launcher's own tar reader
    must end with 0 or 1 (never a signal), say "damaged" when it fails, and write only inside the cache."""
    import random

    tar = bytearray(
        gzip.decompress(
            archive(
                [
                    (entry("_internal", tarfile.DIRTYPE), b""),
                    (entry("_internal/lib.so", mode=0o644), b"x" * 700),
                    (entry(PLUGIN_NAME), BUNDLE_SCRIPT),
                ]
            )
        )
    )
    rng = random.Random(20261207)
    outcomes = set()
    for case in range(150):
        garbled = bytearray(tar)
        for _ in range(rng.randint(1, 6)):
            at = rng.randrange(0, 2048)  # the headers and the first data blocks
            garbled[at] = rng.choice([0, 0x2F, 0x2E, 0x30, 0x37, 0xFF, rng.randrange(256)])
        root = tmp_path / str(case)
        root.mkdir()
        ship = make(root / PLUGIN_NAME, data=gzip.compress(bytes(garbled), mtime=0))
        done = launch(ship, {CACHE_ENV: str(root / "cache")}, "--version")
        assert done.returncode in (0, 1), (case, done)
        if done.returncode == 1:
            assert done.stderr.endswith(f"(compare it with {PLUGIN_NAME}.sha256)\n"), (case, done.stderr)
        outcomes.add(done.returncode)
        assert sorted(p.name for p in root.iterdir()) == sorted([PLUGIN_NAME, "cache"]), case
    assert outcomes == {0, 1}  # both kinds of case were reached
