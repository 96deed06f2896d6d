"""Targets, PASS/MISS verdicts, and the table the benchmark prints.

Why verdicts and no asserts: the figures depend on the machine (2 shared cores here), so
a benchmark that failed on a slow day would teach people to ignore it. Each figure is
printed next to its target with PASS or MISS, and the JSON keeps the raw numbers.

A figure is compared with its target at the precision it is printed with: a row that
reads "1.00 <= 1" is a PASS, as a reader of the table would judge it.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

_OPS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le, "<": operator.lt, ">=": operator.ge, ">": operator.gt,
    "==": operator.eq,
}


@dataclass(frozen=True)
class Target:
    """``value <op> limit``, e.g. Target("<=", 20.0)."""

    op: str
    limit: float

    def __post_init__(self) -> None:
        if self.op not in _OPS:
            raise ValueError(f"unknown comparison {self.op!r}")

    def holds(self, value: float) -> bool:
        return _OPS[self.op](value, self.limit)

    def __str__(self) -> str:
        limit = f"{self.limit:g}"
        return f"{self.op} {limit}"


@dataclass
class Row:
    """One line of the table: a figure, its unit, and (optionally) its target."""

    scenario: str
    figure: str
    value: float | None
    unit: str = ""
    digits: int = 2
    target: Target | None = None
    note: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def verdict(self) -> str:
        if self.target is None:
            return ""
        if self.value is None:
            return "n/a"
        return "PASS" if self.target.holds(round(self.value, self.digits)) else "MISS"

    def shown_value(self) -> str:
        if self.value is None:
            return "n/a"
        text = f"{self.value:.{self.digits}f}"
        return f"{text} {self.unit}".rstrip()

    def shown_target(self) -> str:
        if self.target is None:
            return ""
        return f"{self.target} {self.unit}".rstrip()

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["target"] = str(self.target) if self.target else None
        out["verdict"] = self.verdict or None
        return out


HEADERS = ("scenario", "figure", "measured", "target", "", "note")


def format_table(rows: Sequence[Row]) -> str:
    """A plain-text table, columns padded to their widest cell; the note column is last
    and not padded so long notes do not widen everything else."""
    cells = [HEADERS] + [
        (r.scenario, r.figure, r.shown_value(), r.shown_target(), r.verdict, r.note)
        for r in rows
    ]
    widths = [max(len(c[i]) for c in cells) for i in range(len(HEADERS) - 1)]
    lines = []
    for index, cell in enumerate(cells):
        padded = [text.ljust(widths[i]) if i < len(widths) else text
                  for i, text in enumerate(cell)]
        lines.append("  ".join(padded).rstrip())
        if index == 0:
            lines.append("  ".join("-" * w for w in widths) + "  ----")
    return "\n".join(lines)


def summary_counts(rows: Iterable[Row]) -> dict[str, int]:
    counts = {"PASS": 0, "MISS": 0, "n/a": 0}
    for row in rows:
        if row.verdict:
            counts[row.verdict] += 1
    return counts


def document(rows: Sequence[Row], *, meta: Mapping[str, Any],
             scenarios: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON written to bench/results/: settings, every row, raw scenario results."""
    return {"meta": dict(meta), "summary": summary_counts(rows),
            "rows": [r.to_json() for r in rows], "scenarios": dict(scenarios)}


def write_json(path: Path, doc: Mapping[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=2, sort_keys=False, default=str) + "\n")
    tmp.replace(path)
    return path
