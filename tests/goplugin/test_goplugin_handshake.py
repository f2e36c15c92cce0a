"""Pure handshake rules: cookie, protocol negotiation, handshake line, socket directory."""

from __future__ import annotations

import os
import stat
import tempfile

import pytest

from nomad_plugin.goplugin import handshake
from nomad_plugin.goplugin.handshake import MAGIC_COOKIE_KEY, MAGIC_COOKIE_VALUE
from tests.this_thread import in_this_thread


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


def test_too_long_tmpdir_falls_back_to_slash_tmp() -> None:
    """Without the host dir, $TMPDIR is used, unless the socket path would not fit: then /tmp."""
    long_tmp = tempfile.mkdtemp(prefix="y" * 120, dir="/tmp")
    try:
        directory = handshake.make_socket_dir({"TMPDIR": long_tmp})
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


def test_a_negotiation_compares_by_its_three_fields() -> None:
    agreed = handshake.Negotiation(2)
    assert (agreed.version, agreed.warnings, agreed.error) == (2, (), "")
    assert agreed == handshake.Negotiation(2, (), "")
    assert agreed != handshake.Negotiation(2, ("w",))
    assert agreed != handshake.Negotiation(None, (), "no common version")
    assert len({agreed, handshake.Negotiation(2), handshake.Negotiation(None)}) == 2


def test_the_temp_dirs_are_tempfiles_candidates_in_its_order(tmp_path) -> None:
    """$TMPDIR, $TEMP, $TMP (empty means unset), then /tmp: the first that takes the directory."""
    usable = tmp_path / "usable"
    usable.mkdir()
    missing = str(tmp_path / "missing")
    for env, parent in (
        ({"TMPDIR": str(usable), "TEMP": missing, "TMP": missing}, str(usable)),
        ({"TMPDIR": missing, "TEMP": str(usable), "TMP": missing}, str(usable)),
        ({"TMPDIR": "", "TEMP": missing, "TMP": str(usable)}, str(usable)),
        ({"TMPDIR": "", "TEMP": "", "TMP": ""}, "/tmp"),
    ):
        directory = handshake.make_socket_dir(env)
        assert os.path.dirname(directory) == parent, env
        os.rmdir(directory)


def test_an_unusable_temp_dir_falls_through_to_the_next(tmp_path) -> None:
    (tmp_path / "a-file").write_text("")
    env = {"TMPDIR": str(tmp_path / "missing"), "TEMP": str(tmp_path / "a-file"), "TMP": str(tmp_path)}
    directory = handshake.make_socket_dir(env)
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


def test_the_socket_dir_is_private_from_the_moment_it_exists(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """mkdir itself gets 0700 (as tempfile.mkdtemp), so there is no window before make_socket_dir's chmod."""
    modes: list[int] = []
    real_chmod = os.chmod

    def chmod(path: str, mode: int) -> None:
        modes.append(stat.S_IMODE(os.stat(path).st_mode))
        real_chmod(path, mode)

    monkeypatch.setattr(handshake.os, "chmod", in_this_thread(chmod, real_chmod))
    old = os.umask(0)
    try:
        directory = handshake.make_socket_dir({"PLUGIN_UNIX_SOCKET_DIR": str(tmp_path)})
    finally:
        os.umask(old)
    assert modes == [0o700], "the directory was not 0700 when mkdir made it"
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700


def test_a_taken_name_is_skipped_and_100_taken_names_give_up_on_that_parent(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    draws: list[int] = []
    names = iter([bytes(4), bytes(4), bytes([1] * 4)])

    def fake_urandom(n: int) -> bytes:
        draws.append(n)
        return next(names)

    (tmp_path / "plugin00000000").mkdir()
    monkeypatch.setattr(handshake.os, "urandom", in_this_thread(fake_urandom, os.urandom))
    assert handshake.make_socket_dir({"PLUGIN_UNIX_SOCKET_DIR": str(tmp_path)}) == str(tmp_path / "plugin01010101")
    assert draws == [4, 4, 4]

    draws.clear()
    monkeypatch.setattr(handshake.os, "urandom", in_this_thread(lambda n: draws.append(n) or bytes(4), os.urandom))
    with pytest.raises(FileExistsError) as caught:
        handshake.make_socket_dir({"PLUGIN_UNIX_SOCKET_DIR": str(tmp_path)})
    assert str(caught.value) == f"no unused name under {tmp_path}"
    assert len(draws) == 100
    other = tmp_path / "other"
    other.mkdir()
    env = {"TMPDIR": str(tmp_path), "TEMP": str(other)}
    assert handshake.make_socket_dir(env) == str(other / "plugin00000000")
