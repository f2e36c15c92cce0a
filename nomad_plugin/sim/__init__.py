"""The XDM simulator: a stand-in for Lingjun's XDM service on real Unix sockets (README.md here)."""

from __future__ import annotations

from nomad_plugin.sim.allocation import GrantRecord
from nomad_plugin.sim.profiles import ALIASES, PROFILES
from nomad_plugin.sim.simulator import Simulator

__all__ = ["ALIASES", "PROFILES", "GrantRecord", "Simulator"]
