"""Everything XDM-specific: the only package that knows XDM's (reconstructed) proto.

- ``adapter``: wire <-> model mapping; the only module importing the generated
  ``nomad_plugin._proto.lingjun`` code. Swap the official proto in here.
- ``client``: ``XdmClient``, gRPC over the Unix sockets, error classification,
  service-name probing (R1, R13).
- ``verify``: grant verification (R3, R4).
- ``backend``: ``XdmBackend``, the ``nomad_plugin.backend.Backend`` for XDM.
"""
