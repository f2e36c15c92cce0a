"""The one-line source `fingerprint` and `check-job` print names the backend the plugin really uses."""

from __future__ import annotations

from pathlib import Path

from nomad_plugin.launcher.process import LiveNode


def test_nvml_backend_is_named_nvml_not_xdm() -> None:
    node = LiveNode(plugin_config="/etc/nomad.d/plugin.hcl", config={"backend": "nvml"})
    assert node.source == "NVML (backend = nvml from /etc/nomad.d/plugin.hcl)"


def test_auto_without_an_xdm_socket_is_nvml(tmp_path: Path) -> None:
    missing = tmp_path / "dp2mgr.sock"
    node = LiveNode(config={"backend": "auto", "xdm_socket": str(missing)})
    assert node.source == f"NVML (backend = auto from the default config: no XDM socket at {missing})"


def test_auto_with_an_xdm_socket_is_xdm(tmp_path: Path) -> None:
    sock = tmp_path / "dp2mgr.sock"
    sock.touch()
    node = LiveNode(config={"backend": "auto", "xdm_socket": str(sock)})
    assert node.source == f"XDM socket {sock} (backend = auto from the default config)"


def test_embedded_simulator_and_socket_dir_keep_their_wording() -> None:
    assert LiveNode(profile="h800-8").source == "embedded simulator, profile h800-8"
    assert LiveNode(socket_dir="/run/x").source == "XDM sockets in /run/x"
