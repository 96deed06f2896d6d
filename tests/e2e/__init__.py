"""End-to-end suite: the operator as a process against a real kube-apiserver.

A package (rather than a bare directory of test files) so its helper modules have
unambiguous names (``e2e.kubehelp``) next to tests/unit for pytest and mypy alike.

hack/ holds scripts, not packages; the suite imports two of them (``localcluster`` and
the ``himitsu_standin`` package), so hack/ goes on sys.path before any e2e module loads.
"""

import sys
from pathlib import Path

_HACK = str(Path(__file__).resolve().parents[2] / "hack")
if _HACK not in sys.path:
    sys.path.insert(0, _HACK)
