"""Entry point: ``python3 hack/himitsu_standin serve ...`` or ``python3 -m himitsu_standin``.

Why the sys.path line: run as a directory (which is also how a ConfigMap-mounted copy runs
in a Pod), Python executes this file outside its package, so the package's relative
imports would fail; putting the parent directory first lets it import itself by name.
"""

import os
import sys

if not __package__:
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from himitsu_standin.cli import main

raise SystemExit(main())
