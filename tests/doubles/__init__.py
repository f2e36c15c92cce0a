"""Test doubles: Nomad's agent API, NVML, a small XDM server, drifted XDM schemas and in-process fakes (see
tests/README.md)."""
