"""The shipped file's sh header (tools/build_dist.py) on a first launch whose PATH lacks its tools.

The header is the one tools/build_dist.py writes, with its offset computed the same way, in front
of a small gzip'd tar whose ``nomad-device-lingjun`` is a sh script: what the header does (find its
tools, unpack, exec) is what it does for the real bundle, without the minutes a real build takes.
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
from pathlib import Path

import pytest

from nomad_plugin import PLUGIN_NAME

REPO = Path(__file__).resolve().parents[2]
CACHE_ENV = "NOMAD_DEVICE_LINGJUN_CACHE_DIR"
BUNDLE_SCRIPT = b'#!/bin/sh\necho "bundle ran: $*"\n'


def build_dist_module():  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(REPO / "tools"))
    try:
        import build_dist
    finally:
        sys.path.remove(str(REPO / "tools"))
    return build_dist


def shipped_file(path: Path, version: str = "9.9.9") -> Path:
    """A file laid out as build_dist.build() lays it out: header, then the gzip'd tar at OFFSET."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo(PLUGIN_NAME)
        info.size, info.mode = len(BUNDLE_SCRIPT), 0o755
        tar.addfile(info, io.BytesIO(BUNDLE_SCRIPT))
    data = gzip.compress(raw.getvalue(), mtime=0)
    build_dist = build_dist_module()
    offset = 1
    while True:
        head = build_dist.header(version, "0123456789abcdef", (2, 17), offset)
        if len(head) + 1 == offset:
            break
        offset = len(head) + 1
    path.write_bytes(head + data)
    path.chmod(0o755)
    return path


def test_a_path_without_coreutils_still_unpacks_and_runs(tmp_path: Path) -> None:
    ship = shipped_file(tmp_path / PLUGIN_NAME)
    cache, empty = tmp_path / "cache", tmp_path / "empty-bin"
    empty.mkdir()
    env = {"PATH": str(empty), CACHE_ENV: str(cache), "HOME": str(tmp_path)}
    done = subprocess.run([str(ship), "--version"], env=env, capture_output=True, text=True, timeout=60)
    assert done.stderr == "" and done.returncode == 0
    assert done.stdout == "bundle ran: --version\n"
    assert [p.name for p in cache.iterdir()] == [f"{PLUGIN_NAME}-9.9.9-0123456789abcdef"]
    again = subprocess.run([str(ship), "x"], env={**env, "PATH": ""}, capture_output=True, text=True, timeout=60)
    assert (again.returncode, again.stdout, again.stderr) == (0, "bundle ran: x\n", "")


def test_a_system_without_the_tools_is_told_which_are_missing(tmp_path: Path) -> None:
    """A root holding only sh and its libraries: the header names the missing tools, not the cache."""
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
    (root / "dev").mkdir()
    os.mknod(root / "dev" / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    shipped_file(root / PLUGIN_NAME)
    env = {"PATH": "/bin", CACHE_ENV: "/cache", "HOME": "/"}
    done = subprocess.run(
        [chroot, str(root), f"/{PLUGIN_NAME}", "--version"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == (
        f"{PLUGIN_NAME}: cannot unpack /{PLUGIN_NAME} on its first launch: no mkdir mktemp tail tar gzip mv rm on "
        "PATH or in /usr/sbin, /usr/bin, /sbin, /bin (install coreutils, tar and gzip, or unpack it once where they "
        "exist, into the same cache directory /cache)\n"
    )
    assert not (root / "cache").exists()
