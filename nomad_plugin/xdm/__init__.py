"""Everything XDM-specific: the only package that knows XDM's (reconstructed) proto.

``binder`` binds XDM's schema by name (the only module importing the generated
``nomad_plugin._proto.lingjun`` code, as the reconstruction); ``adapter`` maps its messages to the
model; ``guards`` judges what was decoded; ``client`` speaks gRPC; ``backend`` is the
``model.backend_port.Backend``; ``capture`` writes bug-report bundles; ``runtime_switch`` is the
operator's Enable/Disable. ``guesses`` holds all that is guessed rather than known.
"""
