"""Live per-instance stats for Nomad: the feed fills the cache from XDM or NVML, the engine answers Stats from it."""
