"""The layer contract (docs/development/layout.md) holds on the real tree, and its checker can fail.

hack/check_layers.py is what `make lint` runs; these tests run it on the package and on
small synthetic trees that each break one rule, so a checker that always passes would
fail here.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HACK = Path(__file__).resolve().parents[2] / "hack"
SRC = HACK.parent / "src"
sys.path.insert(0, str(HACK))

from check_layers import breaches  # noqa: E402


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in {"himitsu_controller/__init__.py": "__version__ = '0'\n", **files}.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        for parent in path.relative_to(tmp_path).parents:
            init = tmp_path / parent / "__init__.py"
            if parent.parts and not init.exists():
                init.write_text("")
        path.write_text(text)
    return tmp_path


def test_the_package_keeps_its_layer_contract() -> None:
    assert breaches(SRC) == []


@pytest.mark.parametrize(("files", "expected"), [
    ({"himitsu_controller/runtime/informer.py": "from himitsu_controller import api\n",
      "himitsu_controller/api.py": ""}, "runtime/ must not import"),
    ({"himitsu_controller/himitsu/client.py": "from himitsu_controller.sync import polls\n",
      "himitsu_controller/sync/polls.py": ""}, "himitsu/ must not import"),
    ({"himitsu_controller/himitsu/client.py": "import kubernetes.client\n"},
     "know nothing of Kubernetes"),
    ({"himitsu_controller/sync/reconciler.py": "from himitsu_controller import kube\n",
      "himitsu_controller/kube.py": ""}, "adapter or the CLI"),
    ({"himitsu_controller/sync/reconciler.py":
      "from himitsu_controller.runtime.controller import Result, Controller\n",
      "himitsu_controller/runtime/controller.py": ""}, "only runtime.controller.Result"),
    ({"himitsu_controller/kube.py": "from himitsu_controller.sync.reconciler import X\n",
      "himitsu_controller/sync/reconciler.py": ""}, "only sync.ports"),
    ({"himitsu_controller/sync/status.py":
      "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
      "    from himitsu_controller.sync.reconciler import Kube\n",
      "himitsu_controller/sync/reconciler.py": "from himitsu_controller.sync import status\n"},
     "import cycle"),
    ({"himitsu_controller/sync/a.py": "from . import b\n",
      "himitsu_controller/sync/b.py": "from .a import thing\n"}, "import cycle"),
    # an attribute chain reaches a module another import happened to load
    ({"himitsu_controller/sync/reconciler.py":
      "import himitsu_controller\nK = lambda: himitsu_controller.kube.KubeClient\n",
      "himitsu_controller/kube.py": ""}, "adapter or the CLI"),
    ({"himitsu_controller/runtime/controller.py":
      "import importlib\nR = importlib.import_module('himitsu_controller.sync.reconciler')\n",
      "himitsu_controller/sync/reconciler.py": ""}, "runtime/ must not import"),
    ({"himitsu_controller/sync/reconciler.py": "K = __import__('himitsu_controller.cli')\n",
      "himitsu_controller/cli.py": ""}, "adapter or the CLI"),
    # importing sync.ports runs sync/__init__: a re-export there is an import of the reconciler
    ({"himitsu_controller/sync/__init__.py": "from himitsu_controller.sync.reconciler import R\n",
      "himitsu_controller/sync/reconciler.py": "R = 1\n",
      "himitsu_controller/kube.py": "from himitsu_controller.sync.ports import Kube\n",
      "himitsu_controller/sync/ports.py": ""}, "only sync.ports"),
    ({"himitsu_controller/sync/status.py":
      "from himitsu_controller import sync\ndef f():\n    return sync.reconciler\n",
      "himitsu_controller/sync/reconciler.py": "from himitsu_controller.sync import status\n"},
     "import cycle"),
])
def test_each_breach_of_the_contract_is_reported(
    tmp_path: Path, files: dict[str, str], expected: str,
) -> None:
    found = breaches(_tree(tmp_path, files))
    assert any(expected in line for line in found), found


def test_the_result_type_and_the_version_are_the_allowed_exceptions(tmp_path: Path) -> None:
    tree = _tree(tmp_path, {
        "himitsu_controller/sync/reconciler.py":
            "from himitsu_controller.runtime.controller import Result\n",
        "himitsu_controller/runtime/controller.py": "",
        "himitsu_controller/himitsu/client.py": "from himitsu_controller import __version__\n",
        "himitsu_controller/kube.py": "from himitsu_controller.sync.ports import Kube\n",
        "himitsu_controller/sync/ports.py": "",
    })
    assert breaches(tree) == []
