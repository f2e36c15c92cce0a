"""Everything XDM-specific: the only package that knows XDM's proto (``docs/xdm-risks.md`` maps it)."""
