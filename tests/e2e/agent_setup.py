"""Files a real Nomad dev agent needs to load the plugin against a simulator.

Kept apart from test_real_nomad.py (which skips without a nomad binary) so the
integration suite can check them with the conformance host everywhere:
the wrapper script execs and the agent config's plugin block decodes.
"""

from __future__ import annotations

import socket
import sys
from pathlib import Path

from tests.integration.harness import Node

REPO = Path(__file__).resolve().parents[2]
PLUGIN_NAME = "nomad-device-lingjun"
GRACE_S = 2


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def plugin_command() -> str:
    shipped = REPO / "dist" / "nomad-device-lingjun"  # make dist: the self-contained executable
    if shipped.is_file():
        return f'exec {shipped} "$@"'
    console = Path(sys.executable).parent / "nomad-device-lingjun"
    return f'exec {console} "$@"'


def agent_config(node: Node, http_port: int, rpc_port: int, serf_port: int) -> str:
    return f"""
bind_addr = "127.0.0.1"
log_level = "DEBUG"
ports {{
  http = {http_port}
  rpc  = {rpc_port}
  serf = {serf_port}
}}
client {{
  enabled = true
}}
plugin "raw_exec" {{
  config {{
    enabled = true
  }}
}}
plugin "nomad-device-lingjun" {{
  config {{
    backend              = "xdm"
    xdm_socket           = "{node.sim.dp2mgr_path}"
    config_socket        = "{node.sim.config_path}"
    data_dir             = "{node.root / "data"}"
    nvml_enrich          = false
    reconcile            = true
    nomad_address        = "http://127.0.0.1:{http_port}"
    release_grace_period = "{GRACE_S}s"
  }}
}}
"""


def write_agent_files(node: Node, http_port: int, rpc_port: int, serf_port: int) -> tuple[Path, Path]:
    """Write <root>/agent.hcl and <root>/plugins/nomad-device-lingjun; return (config, plugin_dir)."""
    plugin_dir = node.root / "plugins"
    plugin_dir.mkdir(exist_ok=True)
    wrapper = plugin_dir / PLUGIN_NAME
    wrapper.write_text(f"#!/bin/sh\n{plugin_command()}\n")
    wrapper.chmod(0o755)
    config = node.root / "agent.hcl"
    config.write_text(agent_config(node, http_port, rpc_port, serf_port))
    return config, plugin_dir
