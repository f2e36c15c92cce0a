"""File-system hardening: the plugin's socket directory and the grant journal."""

from __future__ import annotations

import os
import select
import signal
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from nomad_plugin.goplugin.handshake import MAGIC_COOKIE_KEY, MAGIC_COOKIE_VALUE
from nomad_plugin.journal.store import FILE_NAME, Journal
from tests.conformance.hostlib import REPO, real_plugin


def _launch(socket_parent: str | None) -> tuple[subprocess.Popen[bytes], Path]:
    env = {k: v for k, v in os.environ.items() if k not in (MAGIC_COOKIE_KEY, "PLUGIN_UNIX_SOCKET_DIR")}
    env.update({MAGIC_COOKIE_KEY: MAGIC_COOKIE_VALUE, "PLUGIN_PROTOCOL_VERSIONS": "2"})
    if socket_parent:
        env["PLUGIN_UNIX_SOCKET_DIR"] = socket_parent
    proc = subprocess.Popen(
        [str(real_plugin())],
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 20)
    if not ready:
        proc.kill()
        pytest.fail("no handshake line within 20 s")
    line = proc.stdout.readline().decode().strip()
    parts = line.split("|")
    assert parts[2] == "unix", line
    return proc, Path(parts[3])


@pytest.mark.parametrize("parent", [None, "own"], ids=["tmp", "PLUGIN_UNIX_SOCKET_DIR"])
def test_socket_directory_is_0700_and_removed_on_exit(parent):
    base = tempfile.mkdtemp(prefix="hsk", dir="/tmp") if parent else None
    os.chmod(base, 0o755) if base else None  # a permissive parent must not leak into the socket dir
    proc, sock = _launch(base)
    try:
        directory = sock.parent
        if base:
            assert directory.parent == Path(base)
        mode = stat.S_IMODE(directory.stat().st_mode)
        assert mode == 0o700, f"socket dir {directory} has mode {mode:o}"
        assert directory.stat().st_uid == os.getuid()
        assert stat.S_ISSOCK(sock.stat().st_mode)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        assert not directory.exists(), f"{directory} left behind after exit"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if base:
            os.rmdir(base)


def test_journal_file_0600_and_directory_0700(tmp_path):
    journal = Journal(tmp_path / "data")
    assert stat.S_IMODE(journal.dir.stat().st_mode) == 0o700
    assert stat.S_IMODE(journal.path.stat().st_mode) == 0o600
    # Every rewrite keeps 0600 (the temp file is created 0600 before it is renamed over).
    from tests.fuzz.test_fuzz_journal import ENTRIES

    for entry in ENTRIES:
        journal.put(entry)
        assert stat.S_IMODE(journal.path.stat().st_mode) == 0o600
    assert not [p for p in journal.dir.iterdir() if p.name != FILE_NAME], "temp files left behind"


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o775])
def test_a_shared_journal_directory_is_refused_and_its_mode_kept(tmp_path, mode):
    """The plugin never changes the mode of a directory it did not create: a shared one is refused."""
    from nomad_plugin.journal.datadir import DataDirRefused

    d = tmp_path / "data"
    d.mkdir()
    os.chmod(d, mode)
    with pytest.raises(DataDirRefused, match=r"sticky|writable by other users"):
        Journal(d)
    assert stat.S_IMODE(d.stat().st_mode) == mode


def test_journal_modes_hold_under_a_permissive_umask(tmp_path):
    old = os.umask(0)
    try:
        journal = Journal(tmp_path / "u" / "data")
    finally:
        os.umask(old)
    assert stat.S_IMODE(journal.path.stat().st_mode) == 0o600
    assert stat.S_IMODE(journal.dir.stat().st_mode) == 0o700
