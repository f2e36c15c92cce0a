"""Render ``plugin.hcl``: the agent's ``plugin`` block with every option and its default.

``python -m nomad_plugin.config.hcl_render`` prints it; the repository's
``plugin.hcl`` is this output (a test keeps them equal), so the example an
operator copies can never drift from the option table.
"""

from __future__ import annotations

import sys

from nomad_plugin import PLUGIN_NAME
from nomad_plugin.config.options import CARD_BLOCK, CARD_OPTIONS, OPTIONS
from nomad_plugin.config.schema import hcl_literal

HEADER = f"""\
# Nomad agent configuration for the {PLUGIN_NAME} device plugin.
#
# Put the executable in the agent's plugin_dir as "{PLUGIN_NAME}" and add this
# block to the client's agent configuration. Every option is shown with its
# default; delete the ones you do not change.
#
# Generated from nomad_plugin/config/options.py by
#   python -m nomad_plugin.config.hcl_render > plugin.hcl
# (do not edit by hand: a test compares this file with the rendering).
"""

CARD_EXAMPLE = f"""\
    # {CARD_BLOCK} blocks (repeatable) override the mode of single cards or models.
    # match is a card minor, a card UUID, or an exact model name.
    #
    # {CARD_BLOCK} {{
    #   match = "NVIDIA A100-SXM4-80GB"
    #   mode  = "mig"
    # }}
    # {CARD_BLOCK} {{
    #   match  = "3"
    #   mode   = "tdm"
    #   shares = 4
    # }}
    # {CARD_BLOCK} {{
    #   match         = "GPU-1b2c3d4e-0000-0000-0000-000000000000"
    #   mode          = "tdm"
    #   share_percent = 25
    # }}
"""


def render() -> str:
    lines = [HEADER, f'plugin "{PLUGIN_NAME}" {{', "  config {"]
    for index, opt in enumerate(OPTIONS):
        if index:
            lines.append("")
        lines.append(f"    # {opt.doc}")
        lines.append(f"    {opt.name} = {hcl_literal(opt.default)}")
    lines.append("")
    lines.append(CARD_EXAMPLE.rstrip("\n"))
    lines.append("    # Card block options:")
    for opt in CARD_OPTIONS:
        lines.append(f"    #   {opt.name} (default {hcl_literal(opt.default)}): {opt.doc}")
    lines.append("  }")
    lines.append("}")
    return "\n".join(lines) + "\n"


def main() -> int:
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
