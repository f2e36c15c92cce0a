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
