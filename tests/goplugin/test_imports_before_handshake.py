"""Before its handshake line the plugin imports grpcio and next to nothing of its own.

Nomad launches the plugin three times at every agent start and waits for
the line each time, so everything imported before it is start-up latency.
The real plugin runs in a subprocess (as Nomad runs it, with the cookie);
a wrapper records ``sys.modules`` at the moment the line is written. Two
checks: none of the named heavy modules is loaded, and what is loaded
beyond ``import grpc, concurrent.futures`` (the floor any grpcio server
pays) is only the short list below. A new import on the launch path fails
here: move it after the handshake (``goplugin/serve.py``'s ``_services``) or,
if serving really needs it first, add it to the list with the reason.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from nomad_plugin.goplugin.handshake import MAGIC_COOKIE_KEY, MAGIC_COOKIE_VALUE

#: Heavy or clearly post-handshake modules (any submodule counts too).
HEAVY = (
    "google.protobuf",
    "grpc_health.v1.health",
    "nomad_plugin._proto",
    "nomad_plugin.app",
    "nomad_plugin.nomad",
    "nomad_plugin.xdm",
    "nomad_plugin.nvml",
    "nomad_plugin.stats",
    "nomad_plugin.config",
    "nomad_plugin.journal",
    "nomad_plugin.reconcile",
    "nomad_plugin.metrics",
    "nomad_plugin.model",
    "httpx",
    "prometheus_client",
    "hcl2",
    "lark",
    "pynvml",
    "msgpack",
    "tempfile",
    "shutil",
    "json",
    "datetime",
    "dataclasses",
)

#: Beyond grpcio's own import, what serving needs before the line: our launch path and a gRPC server.
ALLOWED_EXTRA = frozenset(
    {
        "nomad_plugin",
        "nomad_plugin.cli",
        "nomad_plugin.cli.main",
        "nomad_plugin.goplugin",
        "nomad_plugin.goplugin.handshake",
        "nomad_plugin.goplugin.logging",
        "nomad_plugin.goplugin.serve",
        "nomad_plugin.util",
        "nomad_plugin.util.text",  # the log handler's secret spellings (re, posixpath)
        "grpc._server",  # grpc.server()
        "grpc._interceptor",
        "concurrent.futures.thread",  # its thread pool
        "queue",
        "_queue",
    }
)

WRAPPER = """
import os, sys
from nomad_plugin.goplugin import serve
announce = serve.announce
def recording(line):
    with open(os.environ["MODULES_AT_HANDSHAKE"], "w") as out:
        out.write("\\n".join(sorted(sys.modules)))
    announce(line)
serve.announce = recording
from nomad_plugin.cli.main import main
sys.exit(main())
"""


def _modules_at_handshake(tmp_path: Path) -> set[str]:
    record = tmp_path / "modules.txt"
    env = dict(os.environ, MODULES_AT_HANDSHAKE=str(record), PLUGIN_PROTOCOL_VERSIONS="2")
    env[MAGIC_COOKIE_KEY] = MAGIC_COOKIE_VALUE
    proc = subprocess.Popen(
        [sys.executable, "-c", WRAPPER], env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # written after the record: no race
        assert line.startswith("1|2|unix|"), f"no handshake line, got {line!r}"
        return set(record.read_text().split())
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


def _grpc_floor() -> set[str]:
    code = "import sys, concurrent.futures, grpc; print('\\n'.join(sorted(sys.modules)))"
    return set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split())


def test_nothing_heavy_is_imported_before_the_handshake(tmp_path: Path) -> None:
    loaded = _modules_at_handshake(tmp_path)
    assert "grpc" in loaded and "nomad_plugin.goplugin.serve" in loaded, "the record is not the plugin's"
    heavy = sorted(m for m in loaded if any(m == h or m.startswith(h + ".") for h in HEAVY))
    assert heavy == [], f"imported before the handshake line: {heavy}"
    extra = sorted(loaded - _grpc_floor() - ALLOWED_EXTRA)
    assert extra == [], f"beyond grpcio and the launch path, imported before the handshake: {extra}"
