"""Entry point of the benchmarks: ``python bench/run.py [flags]`` (``make bench``).

Why the sys.path line: run as a script, Python puts bench/ itself first on the path, so
the ``bench`` package (and, through it, hack/ and the operator) would not be importable
by name; the repository root goes first instead. ``--help`` lists the flags and
bench/README.md explains each figure.
"""

import sys
from pathlib import Path

if not __package__:
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
