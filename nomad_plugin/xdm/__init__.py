"""Everything XDM-specific: the only package that knows XDM's (reconstructed) proto.

``binder`` binds XDM's schema by name; ``adapter`` maps its messages to the model and judges them;
``client`` speaks gRPC; ``backend`` is the ``model.card.Backend``; ``capture`` writes
bug-report bundles; ``runtime_switch`` is the operator's Enable/Disable; ``guesses`` holds what is
guessed rather than known.
"""
