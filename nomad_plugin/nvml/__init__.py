"""The NVML backend and the NVML companion of XDM nodes; ``pynvml`` is imported only when used."""
