"""The layer contract (pyproject.toml's [tool.importlinter]) holds, and breaking it fails.

`make lint` runs ``lint-imports``; these tests run it on the package, and on a copy of
the package with one forbidden import added per rule, so a contract that always passes
would fail here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "himitsu_controller"
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def lint_imports(root: Path, src: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` with ``root``'s pyproject.toml on the package under ``src``."""
    if not LINT_IMPORTS.exists():
        pytest.skip("needs import-linter (pip install -e '.[dev]')")
    env = {**os.environ, "PYTHONPATH": str(src)}
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def test_the_package_keeps_its_layer_contract() -> None:
    done = lint_imports(ROOT, ROOT / "src")
    assert done.returncode == 0, done.stdout[-3000:]
    assert "0 broken" in done.stdout


@pytest.mark.parametrize(("module", "line", "broken"), [
    ("runtime/cache/informer.py", "from himitsu_controller import api", "runtime/ imports"),
    ("himitsu/client.py", "from himitsu_controller.sync import polling", "himitsu/ imports"),
    ("himitsu/client.py", "import kubernetes.client", "nothing of Kubernetes"),
    ("httpdeadline.py", "from himitsu_controller.runtime import parts", "is a leaf"),
    ("sync/reconciler.py", "from himitsu_controller import kube", "the adapter nor the CLI"),
    ("sync/reconciler.py", "from himitsu_controller.runtime.client import rest",
     "only runtime.controller"),
    ("kube.py", "from himitsu_controller.sync import reconciler", "only sync.ports"),
    ("sync/ports.py", "if False:\n    from himitsu_controller.sync import reconciler",
     "no import cycle"),
    ("runtime/parts.py", "def later() -> None:\n    from himitsu_controller.runtime import manager",
     "no import cycle"),
])
def test_each_breach_of_the_contract_fails_the_lint(tmp_path: Path, module: str, line: str,
                                                    broken: str) -> None:
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    copy = tmp_path / "src" / "himitsu_controller"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    path = copy / module
    path.write_text(path.read_text() + f"\n{line}\n")
    done = lint_imports(tmp_path, tmp_path / "src")
    assert done.returncode == 1, done.stdout[-3000:]
    broken_lines = done.stdout.split("Broken contracts", 1)[-1]
    assert broken in " ".join(broken_lines.split()), done.stdout[-3000:]
