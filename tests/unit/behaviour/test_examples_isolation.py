"""A derandomized property test draws the same examples whatever else the run imported.

CI derandomizes every property test (conftest.py) and the model-based test always, so a
run is reproducible and a test passes or fails on its own, not by the company it keeps.
Hypothesis also draws constants found in local modules' source; conftest.py pins that
pool to the operator's package. Before, the model-based test drew other examples after
the whole suite than alone (bench/ and hack/ had been imported) and failed only there.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings


def test_examples_do_not_depend_on_the_local_modules_imported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    drawn: list[int] = []

    @settings(derandomize=True, database=None, max_examples=300)
    @given(st.integers(0, 2**16))
    def draw(n: int) -> None:
        drawn.append(n)

    draw()
    alone, drawn[:] = drawn[:], []
    # A local module full of integers in the drawn range, as bench/ and hack/ hold.
    (tmp_path / "many_constants.py").write_text(
        "VALUES = [" + ", ".join(str(n) for n in range(1000, 60000, 97)) + "]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(sys.modules, "many_constants",
                        importlib.import_module("many_constants"))
    draw()
    assert drawn == alone
