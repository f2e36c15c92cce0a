"""NVML backend: plain NVIDIA nodes, real health from NVML events, XDM enrichment.

Nothing in this package imports ``pynvml`` at module import time: the
bindings are loaded only when an NVML backend, probe or enricher is used.
"""
