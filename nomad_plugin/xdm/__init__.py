"""Everything XDM-specific: the only package that knows XDM's (reconstructed) proto.

- ``schema_source``: where XDM's schema comes from (reflection, the operator's
  ``.proto`` files or descriptor set, the built-in reconstruction);
- ``binder``: binds that schema by RPC and field name (the only module importing
  the generated ``nomad_plugin._proto.lingjun`` code, as the reconstruction);
- ``guards``: plausibility checks on decoded data ("XDM schema mismatch");
- ``adapter``: wire <-> model mapping through a binding.
- ``client``: ``XdmClient``, gRPC over the Unix sockets, error classification,
  service-name probing (R1, R13).
- ``verify``: grant verification (R3, R4).
- ``backend``: ``XdmBackend``, the ``nomad_plugin.model.backend_port.Backend`` for XDM.
"""
