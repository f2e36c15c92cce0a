"""``python -m nomad_plugin`` runs the same entry point as the console script.

It is also the shipped executable's entry script (tools/build_dist.py), hence
the child-environment fix-up, which does nothing outside that bundle.
"""

import os
import sys

from nomad_plugin.cli.main import main
from nomad_plugin.util.bundle import restore_child_environment

restore_child_environment(os.environ)
sys.exit(main())
