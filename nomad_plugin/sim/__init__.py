"""The XDM simulator: a stand-in for Lingjun's XDM service on Unix sockets.

``Simulator(socket_dir, profile)`` serves the reconstructed ``xdm`` and
``config`` protos, enforces XDM's allocation rules, produces metrics and can
inject faults and schema drift. See ``nomad-device-lingjun xdm-sim --help``.
"""

from __future__ import annotations

from nomad_plugin.sim.allocation import GrantedSlot, GrantRecord
from nomad_plugin.sim.profiles import ALIASES, PROFILES
from nomad_plugin.sim.simulator import Simulator

__all__ = ["ALIASES", "PROFILES", "GrantRecord", "GrantedSlot", "Simulator"]
