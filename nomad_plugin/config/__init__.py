"""The plugin's typed configuration: one option table, one frozen object.

``options.py`` is the single source of truth: ConfigSchema, the decoder,
``plugin.hcl`` and the README's configuration reference all derive from it.
"""
