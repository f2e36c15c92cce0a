"""The plugin's typed configuration: one option table (``options.py``, the source of ConfigSchema, the
decoder, ``plugin.hcl`` and the README reference), one frozen object (``model.py``)."""
