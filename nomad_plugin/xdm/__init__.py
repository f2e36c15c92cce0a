"""Everything XDM-specific: the only package that knows XDM's (reconstructed) proto.

``docs/xdm-risks.md`` maps its modules; ``guesses`` holds what is guessed rather than known.
"""
