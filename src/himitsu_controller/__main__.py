"""``python -m himitsu_controller``: the same entry point as the console script."""

import sys

from himitsu_controller.cli import main

sys.exit(main())
