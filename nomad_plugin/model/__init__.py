"""Pure domain types: cards, topology, grants, metric samples. No I/O here.

Data flows one way: a backend (XDM or NVML) produces these types, the Nomad
mapping layer consumes them. Nothing in this package imports generated
protobuf code, so the official XDM proto can replace the reconstruction
without touching anything but ``nomad_plugin/xdm/``.
"""
