"""The real-Nomad e2e test's files work, checked without Nomad.

tests/e2e/test_real_nomad.py only runs where a nomad binary exists. Its
plugin_dir wrapper and agent config are checked here with the conformance
host instead: the host launches the wrapper exactly as Nomad would
(exec of plugin_dir/nomad-device-lingjun) and decodes the agent config's
plugin block through the same HCL -> cty -> msgpack path.
"""

from __future__ import annotations

from pathlib import Path

from tests.conformance.hostlib import run_host
from tests.e2e.agent_setup import PLUGIN_NAME, free_port, write_agent_files
from tests.integration.harness import assert_conformant, set_of, sim_node


def test_wrapper_and_agent_config_load_the_plugin(conformance_host: Path) -> None:
    with sim_node("h800-8") as node:
        config, plugin_dir = write_agent_files(node, free_port(), free_port(), free_port())
        run = run_host(
            [
                "--plugin", str(plugin_dir / PLUGIN_NAME), "--config", str(config), "--phase", "all",
                "--duration", "1.5", "--reserve-count", "1",
                # No Nomad agent answers here: keep the reconciler from polling a closed port.
                "--set", set_of("reconcile", False),
            ],
            binary=conformance_host,
        )  # fmt: skip
        grants = node.sim.grants()
    assert_conformant(run)
    decoded = run.of("config_decoded")[0]
    assert decoded["ok"] is True
    assert decoded["value"]["xdm_socket"] == str(node.sim.dp2mgr_path)
    assert decoded["value"]["release_grace_period"] == "2s"
    (reserve,) = run.of("reserve")
    assert reserve["ok"] is True, reserve
    assert reserve["envs"]["LINGJUN_GRANT_ID"] in grants
