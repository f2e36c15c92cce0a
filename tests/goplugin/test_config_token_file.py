"""The Nomad ACL token out of the agent configuration, through the real plugin process.

``nomad_token_file`` is judged at SetConfig (a file others may read is refused, naming the option and the
mode), and read again when it changes: a rotated token reaches the Nomad API without a restart. A token
that the local agent's ``/v1/agent/self`` shows (the plugin block's ``config`` is in it, unredacted) is
reported by exactly one warning naming ``nomad_token``, never the token.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import grpc
import msgpack
import pytest
from goplugin_harness import Plugin, launch

from nomad_plugin import PLUGIN_NAME
from nomad_plugin._proto.goplugin import grpc_controller_pb2, grpc_controller_pb2_grpc
from nomad_plugin._proto.nomad import base_pb2, base_pb2_grpc, device_pb2, device_pb2_grpc
from tests.doubles.nomad_api import NomadApiDouble
from tests.waiting import wait_until

FIRST = "f1rst-7d0c-4a53-token-in-file"
SECOND = "s3cond-91be-4f0e-rotated-token"


@pytest.fixture
def plugin() -> Iterator[Plugin]:
    p = launch()
    try:
        yield p
    finally:
        p.close()


@pytest.fixture
def api() -> Iterator[NomadApiDouble]:
    with NomadApiDouble() as double:
        yield double


def _write_token(path: Path, token: str, mode: int = 0o600) -> None:
    """As a rotating tool does: a new file renamed over the old one."""
    new = path.with_name(path.name + ".new")
    new.write_text(token + "\n")
    new.chmod(mode)
    os.replace(new, path)


def _set_config(plugin: Plugin, **options: object) -> None:
    request = base_pb2.SetConfigRequest(msgpack_config=msgpack.packb(options), plugin_api_version="v0.1.0")
    base_pb2_grpc.BasePluginStub(plugin.channel()).SetConfig(request, timeout=10)


def _node_config(tmp_path: Path, api: NomadApiDouble, **options: object) -> dict[str, object]:
    """A plugin on no hardware (an XDM socket that does not exist) reconciling against the API double."""
    return {
        "backend": "xdm",
        "xdm_socket": str(tmp_path / "no-xdm" / "dp2mgr.sock"),
        "config_socket": str(tmp_path / "no-xdm" / "config-daemon.sock"),
        "nvml_enrich": False,
        "data_dir": str(tmp_path / "data"),
        "nomad_address": api.address,
        "container_mounts": "never",
        **options,
    }


def _start_engines(plugin: Plugin) -> grpc.Call:
    """The engines (reconciler included) start on the first Fingerprint call."""
    call = device_pb2_grpc.DevicePluginStub(plugin.channel()).Fingerprint(device_pb2.FingerprintRequest())
    next(call)
    return call


def _stop(plugin: Plugin, call: grpc.Call) -> str:
    call.cancel()
    grpc_controller_pb2_grpc.GRPCControllerStub(plugin.channel()).Shutdown(grpc_controller_pb2.Empty(), timeout=5)
    plugin.wait_exit(10)
    return plugin.stderr_text()


def _warnings(stderr: str) -> list[dict[str, object]]:
    entries = [json.loads(line) for line in stderr.splitlines() if line.strip()]
    return [e for e in entries if e["@level"] == "warn" and "/v1/agent/self" in str(e["@message"])]


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604])
def test_a_token_file_others_may_read_is_refused_at_set_config(plugin: Plugin, tmp_path: Path, mode: int) -> None:
    token_file = tmp_path / "nomad.token"
    _write_token(token_file, FIRST, mode)
    with pytest.raises(grpc.RpcError) as err:
        _set_config(plugin, nomad_token_file=str(token_file))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = err.value.details()
    assert details == (
        f'config option "nomad_token_file": value {str(token_file)!r} can be read or changed by other users '
        f"(mode {mode:04o}); allowed: a regular file holding the token, owned by the plugin's user "
        f"(uid {os.geteuid()}), mode 0600 or 0400"
    )
    assert FIRST not in details and FIRST not in plugin.stderr_text()
    token_file.chmod(0o600)
    _set_config(plugin, nomad_token_file=str(token_file))  # the same file, once only its owner may read it


@pytest.mark.parametrize(
    ("options", "shown"),
    [
        ({"nomad_token_file": "nomad.token"}, "value 'nomad.token' is relative"),
        ({"nomad_token_file": "/nonexistent/nomad.token"}, "cannot be opened (No such file or directory)"),
        ({"nomad_token_file": "/dev/null"}, "is not a regular file"),
    ],
)
def test_a_token_file_that_cannot_be_read_is_refused_naming_why(
    plugin: Plugin, options: dict[str, object], shown: str
) -> None:
    with pytest.raises(grpc.RpcError) as err:
        _set_config(plugin, **options)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith('config option "nomad_token_file": value ') and shown in err.value.details()


def test_token_and_token_file_together_are_refused(plugin: Plugin, tmp_path: Path) -> None:
    token_file = tmp_path / "nomad.token"
    _write_token(token_file, FIRST)
    with pytest.raises(grpc.RpcError) as err:
        _set_config(plugin, nomad_token=SECOND, nomad_token_file=str(token_file))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "nomad_token and nomad_token_file are both set" in err.value.details()
    assert SECOND not in err.value.details()


@pytest.mark.timeout(90)
def test_a_rotated_token_file_is_used_without_a_restart(plugin: Plugin, api: NomadApiDouble, tmp_path: Path) -> None:
    token_file = tmp_path / "nomad.token"
    _write_token(token_file, FIRST)
    api.require_token(FIRST)
    _set_config(plugin, **_node_config(tmp_path, api, nomad_token_file=str(token_file)))
    call = _start_engines(plugin)
    wait_until(lambda: any("/allocations" in p and t == FIRST for p, t in api.requests), "a request with the token")

    api.require_token(SECOND)  # the old token is revoked as the new one is written
    _write_token(token_file, SECOND)
    api.add_alloc("a1", ["GPU-x"])  # ends the reconciler's blocking query now
    wait_until(
        lambda: any("/allocations" in p and t == SECOND for p, t in api.requests),
        "the reconciler to send the rotated token",
    )
    stderr = _stop(plugin, call)
    assert f"nomad_token_file {token_file} changed" in stderr
    assert FIRST not in stderr and SECOND not in stderr
    assert not _warnings(stderr), "a token kept in a file is not in /v1/agent/self"


@pytest.mark.timeout(90)
def test_a_token_the_agent_shows_gets_one_warning_naming_the_option(
    plugin: Plugin, api: NomadApiDouble, tmp_path: Path
) -> None:
    api.agent_plugins = [{"Name": PLUGIN_NAME, "Args": None, "Config": {"enabled": True, "nomad_token": FIRST}}]
    api.require_token(FIRST)
    _set_config(plugin, **_node_config(tmp_path, api, nomad_token=FIRST))
    call = _start_engines(plugin)
    wait_until(lambda: _warnings(plugin.stderr_text()), "the warning about the token in /v1/agent/self")
    # The reconciler asks /v1/agent/self as well (this node's ID): let it get past that to its allocations.
    wait_until(lambda: any("/allocations" in p for p, _ in api.requests), "the reconciler's allocations query")
    stderr = _stop(plugin, call)
    (warning,) = _warnings(stderr)
    message = str(warning["@message"])
    assert "the Nomad ACL token from nomad_token" in message
    assert "config.Plugins[0].Config.nomad_token" in message and "agent:read" in message
    assert "nomad_token_file" in message and "NOMAD_TOKEN" in message
    assert FIRST not in stderr and FIRST[:12] not in stderr


@pytest.mark.timeout(90)
def test_the_agent_api_coming_up_after_the_plugin_is_asked_again(
    plugin: Plugin, api: NomadApiDouble, tmp_path: Path
) -> None:
    # Nomad starts its plugins before its HTTP API: the first question finds no answer.
    api.agent_plugins = [{"Name": PLUGIN_NAME, "Args": None, "Config": {"nomad_token": FIRST}}]
    api.set_down(True)
    _set_config(plugin, **_node_config(tmp_path, api, nomad_token=FIRST, reconcile=False))
    call = _start_engines(plugin)
    wait_until(lambda: any(p == "/v1/agent/self" for p, _ in api.requests), "the plugin's first question")
    assert not _warnings(plugin.stderr_text())
    api.set_down(False)
    wait_until(lambda: _warnings(plugin.stderr_text()), "the warning once the agent answers")
    stderr = _stop(plugin, call)
    assert len(_warnings(stderr)) == 1 and FIRST not in stderr
