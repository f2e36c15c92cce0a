"""Pure handshake rules: cookie, protocol negotiation, handshake line, socket directory."""

from __future__ import annotations

import os
import stat
import tempfile

from nomad_plugin.cli.main import MAGIC_COOKIE_KEY, MAGIC_COOKIE_VALUE
from nomad_plugin.goplugin import handshake


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
