"""Test doubles: Nomad's agent API, NVML, a small XDM server and in-process fakes (see tests/README.md)."""
