"""Pure handshake rules: cookie, protocol negotiation, handshake line, socket directory."""

from __future__ import annotations

import os
import stat
import tempfile

import pytest

from nomad_plugin.goplugin import handshake
from nomad_plugin.goplugin.handshake import MAGIC_COOKIE_KEY, MAGIC_COOKIE_VALUE


def test_cookie() -> None:
    assert handshake.cookie_error({MAGIC_COOKIE_KEY: MAGIC_COOKIE_VALUE}) == ""
    assert "not meant to be executed directly" in handshake.cookie_error({})
    assert "does not hold" in handshake.cookie_error({MAGIC_COOKIE_KEY: "x"})


def test_negotiation() -> None:
    assert handshake.negotiate({}).version == 2
    assert handshake.negotiate({"PLUGIN_PROTOCOL_VERSIONS": ""}).version == 2
    assert handshake.negotiate({"PLUGIN_PROTOCOL_VERSIONS": "1,2,3"}).version == 2
    bad = handshake.negotiate({"PLUGIN_PROTOCOL_VERSIONS": "2, two"})
    assert bad.version == 2 and "'two'" in bad.warnings[0]
    refused = handshake.negotiate({"PLUGIN_PROTOCOL_VERSIONS": "1,3"})
    assert refused.version is None and "'1,3'" in refused.error


def test_handshake_line_has_five_fields_and_no_certificate() -> None:
    assert handshake.handshake_line("/tmp/p/plugin.sock") == "1|2|unix|/tmp/p/plugin.sock|grpc\n"


def test_socket_dir_is_private_and_honours_the_host_dir() -> None:
    with tempfile.TemporaryDirectory(dir="/tmp") as parent:
        directory = handshake.make_socket_dir({"PLUGIN_UNIX_SOCKET_DIR": parent})
        assert os.path.dirname(directory) == parent
        assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
        os.rmdir(directory)
    long_parent = tempfile.mkdtemp(prefix="x" * 120, dir="/tmp")
    try:
        directory = handshake.make_socket_dir({"PLUGIN_UNIX_SOCKET_DIR": long_parent})
        assert len(os.path.join(directory, handshake.SOCKET_NAME)) <= handshake.MAX_SOCKET_PATH
        os.rmdir(directory)
    finally:
        os.rmdir(long_parent)


def test_refusal_keeps_the_warnings_about_bad_entries() -> None:
    refused = handshake.negotiate({"PLUGIN_PROTOCOL_VERSIONS": "1, x"})
    assert refused.version is None
    assert refused.warnings == ("ignoring bad entry 'x' in PLUGIN_PROTOCOL_VERSIONS='1, x'",)


def test_socket_dir_named_like_go_plugins_own() -> None:
    """go-plugin names its socket directories ``plugin*``; ours look the same to an operator."""
    with tempfile.TemporaryDirectory(dir="/tmp") as parent:
        directory = handshake.make_socket_dir({"PLUGIN_UNIX_SOCKET_DIR": parent})
        assert os.path.basename(directory).startswith("plugin")
        os.rmdir(directory)


def test_socket_path_of_exactly_the_limit_stays_under_the_host_dir() -> None:
    # mkdtemp("plugin") adds 8 random characters: <parent>/pluginXXXXXXXX/plugin.sock
    suffix = len("/pluginXXXXXXXX/") + len(handshake.SOCKET_NAME)
    base = tempfile.mkdtemp(dir="/tmp")
    parent = os.path.join(base, "p" * (handshake.MAX_SOCKET_PATH - suffix - len(base) - 1))
    os.mkdir(parent)
    try:
        directory = handshake.make_socket_dir({"PLUGIN_UNIX_SOCKET_DIR": parent})
        assert len(os.path.join(directory, handshake.SOCKET_NAME)) == handshake.MAX_SOCKET_PATH
        assert os.path.dirname(directory) == parent
        os.rmdir(directory)
    finally:
        os.rmdir(parent)
        os.rmdir(base)


def test_too_long_tmpdir_falls_back_to_slash_tmp(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the host dir, $TMPDIR is used, unless the socket path would not fit: then /tmp."""
    long_tmp = tempfile.mkdtemp(prefix="y" * 120, dir="/tmp")
    monkeypatch.delenv("PLUGIN_UNIX_SOCKET_DIR", raising=False)
    monkeypatch.setenv("TMPDIR", long_tmp)
    try:
        directory = handshake.make_socket_dir({})
        assert os.path.dirname(directory) == "/tmp"
        assert os.path.basename(directory).startswith("plugin")
        assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
        os.rmdir(directory)
    finally:
        os.rmdir(long_tmp)


def test_without_an_env_mapping_the_process_environment_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    with tempfile.TemporaryDirectory(dir="/tmp") as parent:
        monkeypatch.setenv("PLUGIN_UNIX_SOCKET_DIR", parent)
        directory = handshake.make_socket_dir()
        assert os.path.dirname(directory) == parent
        os.rmdir(directory)


def test_a_negotiation_compares_and_hashes_by_its_three_fields() -> None:
    agreed = handshake.Negotiation(2)
    assert (agreed.version, agreed.warnings, agreed.error) == (2, (), "")
    assert agreed == handshake.Negotiation(2, (), "")
    assert agreed != handshake.Negotiation(2, ("w",))
    assert agreed != handshake.Negotiation(None, (), "no common version")
    assert agreed != (2, (), "")  # another type is never equal
    assert hash(agreed) == hash(handshake.Negotiation(2, (), ""))
    assert len({agreed, handshake.Negotiation(2), handshake.Negotiation(None)}) == 2
    assert repr(agreed) == "Negotiation(version=2, warnings=(), error='')"


def test_the_temp_dirs_are_tempfiles_candidates_in_its_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TMPDIR", "/a")
    monkeypatch.setenv("TEMP", "/b")
    monkeypatch.setenv("TMP", "/c")
    assert handshake._temp_dirs() == ["/a", "/b", "/c", "/tmp", "/var/tmp", "/usr/tmp", os.getcwd()]
    for name in ("TMPDIR", "TEMP", "TMP"):
        monkeypatch.setenv(name, "")  # empty means unset, as for tempfile
    assert handshake._temp_dirs() == ["/tmp", "/var/tmp", "/usr/tmp", os.getcwd()]


def test_an_unusable_temp_dir_falls_through_to_the_next(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.delenv("PLUGIN_UNIX_SOCKET_DIR", raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path / "missing"))
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("TEMP", str(tmp_path / "a-file"))
    monkeypatch.setenv("TMP", str(tmp_path))
    directory = handshake.make_socket_dir({})
    assert os.path.dirname(directory) == str(tmp_path)
    os.rmdir(directory)


def test_an_unusable_host_dir_raises_the_mkdir_error_naming_it(tmp_path) -> None:
    missing = str(tmp_path / "missing")
    with pytest.raises(FileNotFoundError) as caught:
        handshake.make_socket_dir({"PLUGIN_UNIX_SOCKET_DIR": missing})
    assert caught.value.filename.startswith(missing + "/plugin")
    (tmp_path / "a-file").write_text("")
    with pytest.raises(NotADirectoryError):
        handshake.make_socket_dir({"PLUGIN_UNIX_SOCKET_DIR": str(tmp_path / "a-file")})


def test_with_no_candidate_dir_the_error_says_so() -> None:
    with pytest.raises(FileNotFoundError) as caught:
        handshake._mkdtemp([])
    assert str(caught.value) == "no directory to make the plugin socket in"


def test_the_socket_dir_is_private_from_the_moment_it_exists(tmp_path) -> None:
    """mkdir itself gets 0700 (as tempfile.mkdtemp), so there is no window before make_socket_dir's chmod."""
    old = os.umask(0)
    try:
        directory = handshake._mkdtemp([str(tmp_path)])
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700


def test_a_taken_name_is_skipped_and_100_taken_names_give_up_on_that_parent(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    draws: list[int] = []
    names = iter([bytes(8), bytes(8), bytes([1] * 8)])

    def fake_urandom(n: int) -> bytes:
        draws.append(n)
        return next(names)

    (tmp_path / "pluginaaaaaaaa").mkdir()
    monkeypatch.setattr(handshake.os, "urandom", fake_urandom)
    assert handshake._mkdtemp([str(tmp_path)]) == str(tmp_path / "pluginbbbbbbbb")
    assert draws == [8, 8, 8]

    draws.clear()
    monkeypatch.setattr(handshake.os, "urandom", lambda n: draws.append(n) or bytes(8))
    with pytest.raises(FileExistsError) as caught:
        handshake._mkdtemp([str(tmp_path)])
    assert str(caught.value) == f"no unused name under {tmp_path}"
    assert len(draws) == 100
    other = tmp_path / "other"
    other.mkdir()
    assert handshake._mkdtemp([str(tmp_path), str(other)]) == str(other / "pluginaaaaaaaa")
