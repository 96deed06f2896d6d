"""Print the image's dependencies: pyproject.toml's, less what the image leaves out."""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

# The operator imports no module of these in a cluster (tests/unit/test_image_lock.py).
LEFT_OUT = {"kubernetes"}
PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def name_of(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement.strip())
    if match is None:
        raise ValueError(f"not a requirement: {requirement!r}")
    return re.sub(r"[-_.]+", "-", match.group(0)).lower()


def image_requirements(pyproject: Path = PYPROJECT) -> list[str]:
    with pyproject.open("rb") as fh:
        dependencies: list[str] = tomllib.load(fh)["project"]["dependencies"]
    return [r for r in dependencies if name_of(r) not in LEFT_OUT]


if __name__ == "__main__":
    sys.stdout.write("".join(f"{r}\n" for r in image_requirements()))
