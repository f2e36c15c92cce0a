"""A stand-in Nomad agent: launches the real plugin as go-plugin does, configures it, reserves, then waits.

    python -m tests.hardening.agent_stub '<config as JSON>' [<device id to reserve>]

``AGENT_STUB_PLUGIN`` names the executable to launch (default: ``python -m nomad_plugin``).

Unlike the Go conformance host (which sets ``Pdeathsig`` on the plugin, so a
killed host never leaves it behind), nothing here ends the plugin when this
process dies: a test SIGKILLs this process to play an agent killed by the
OOM killer or an operator, and then sees whether the plugin notices on its
own. One JSON line per step on stdout: ``{"pid", "socket"}`` after the
handshake, ``{"devices": [...]}`` at the first fingerprint with devices,
``{"reserve": {...envs}}`` or ``{"reserve_error": "..."}``; then it sleeps.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import grpc
import msgpack

from nomad_plugin._proto.nomad import base_pb2, base_pb2_grpc, device_pb2, device_pb2_grpc
from nomad_plugin.goplugin.handshake import MAGIC_COOKIE_KEY, MAGIC_COOKIE_VALUE


def say(**fields: object) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def main(argv: list[str]) -> int:
    config = json.loads(argv[0])
    reserve_id = argv[1] if len(argv) > 1 else ""
    env = dict(os.environ, PLUGIN_PROTOCOL_VERSIONS="2")
    env[MAGIC_COOKIE_KEY] = MAGIC_COOKIE_VALUE
    command = os.environ.get("AGENT_STUB_PLUGIN")  # the shipped executable, or the interpreter's module
    plugin = subprocess.Popen(
        [command] if command else [sys.executable, "-m", "nomad_plugin"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=open(os.environ.get("AGENT_STUB_PLUGIN_STDERR", os.devnull), "wb"),
    )
    assert plugin.stdout is not None
    line = plugin.stdout.readline().decode().strip()
    socket_path = line.split("|")[3]
    say(pid=plugin.pid, socket=socket_path)
    channel = grpc.insecure_channel(f"unix:{socket_path}")
    base_pb2_grpc.BasePluginStub(channel).SetConfig(
        base_pb2.SetConfigRequest(msgpack_config=msgpack.packb(config), plugin_api_version="0.1.0"), timeout=30
    )
    device = device_pb2_grpc.DevicePluginStub(channel)
    stream = device.Fingerprint(device_pb2.FingerprintRequest())
    for response in stream:
        ids = [d.ID for g in response.device_group for d in g.devices]
        if ids:
            say(devices=ids)
            break
    # Nomad keeps the stream open for the plugin's life: so does this stand-in.
    threading.Thread(target=lambda: [None for _ in stream], daemon=True).start()
    if reserve_id:
        try:
            answer = device.Reserve(device_pb2.ReserveRequest(device_ids=[reserve_id]), timeout=60)
            say(reserve=dict(answer.container_res.envs))
        except grpc.RpcError as exc:
            say(reserve_error=str(exc.details()), code=exc.code().name)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
