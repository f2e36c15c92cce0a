"""Plain views of what the plugin shows Nomad; imports nothing of the plugin, so every side can use it."""
