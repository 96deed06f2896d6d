"""The chaos soak (``make soak``, issue 26): a real control plane, two leader-elected
operator replicas, the Himitsu stand-in, a fleet, a user driver and seeded faults, with a
black-box invariant checker and a report of figures at the end.

A package next to tests/e2e (whose helpers it reuses, as ``e2e.*``); hack/ goes on
sys.path first, as the e2e package does, for ``localcluster`` and ``himitsu_standin``.
"""

import sys
from pathlib import Path

_HACK = str(Path(__file__).resolve().parents[2] / "hack")
if _HACK not in sys.path:
    sys.path.insert(0, _HACK)
