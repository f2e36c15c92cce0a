"""``python -m nomad_plugin`` runs the same entry point as the console script."""

import sys

from nomad_plugin.cli.main import main

sys.exit(main())
