"""nomad-device-lingjun: a Nomad device plugin for Alibaba Cloud Lingjun (XDM) accelerators."""

__version__ = "0.1.0"
PLUGIN_NAME = "nomad-device-lingjun"
