"""backend = "auto": the XDM socket decides first; NVML only where XDM is absent.

The real plugin does the same end to end in
tests/integration/test_production_defaults.py; this is the fast check of the
rule itself, with real files standing in for the socket.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from nomad_plugin.backend_select import choose_backend_name
from nomad_plugin.config.model import PluginConfig


class Probe:
    """nvml_usable double that records whether it was asked."""

    def __init__(self, usable: bool) -> None:
        self.usable = usable
        self.asked = 0

    def __call__(self) -> bool:
        self.asked += 1
        return self.usable


@pytest.mark.parametrize("nvml", [True, False])
def test_auto_with_the_xdm_socket_is_xdm_without_probing_nvml(tmp_path: Path, nvml: bool) -> None:
    socket = tmp_path / "dp2mgr.sock"
    socket.touch()
    probe = Probe(nvml)
    assert choose_backend_name(PluginConfig(backend="auto", xdm_socket=str(socket)), probe) == "xdm"
    assert probe.asked == 0, "NVML was probed although the XDM socket exists"


@pytest.mark.parametrize(("nvml", "expected"), [(True, "nvml"), (False, "xdm")])
def test_auto_without_the_socket_uses_nvml_when_it_works(tmp_path: Path, nvml: bool, expected: str) -> None:
    config = PluginConfig(backend="auto", xdm_socket=str(tmp_path / "absent.sock"))
    assert choose_backend_name(config, Probe(nvml)) == expected


@pytest.mark.parametrize("backend", ["xdm", "nvml"])
def test_an_explicit_backend_is_taken_as_is(tmp_path: Path, backend: str) -> None:
    probe = Probe(backend != "nvml")
    assert choose_backend_name(PluginConfig(backend=backend, xdm_socket=str(tmp_path / "x.sock")), probe) == backend
    assert probe.asked == 0
