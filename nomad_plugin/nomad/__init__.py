"""Nomad's plugin services (BasePlugin, DevicePlugin) on top of ``PluginApp``."""
