"""A Python go-plugin client that launches the plugin exactly as a Nomad client does (``process.py``),
with the config an agent would send it (``config.py``)."""

from nomad_plugin.launcher.config import LauncherConfigError
from nomad_plugin.launcher.process import LaunchError

__all__ = ["LaunchError", "LauncherConfigError"]
