"""Rule on the stand-in's request log: every source is polled on time.

Cadence is timed in quiet phases (Himitsu healthy, no fault, no change), after a grace
that lets a leader settle: every source (environment, token) a HimitsuSecret names is
polled at least once per its shortest refreshInterval + ``bound``. (The other rule on
requests, no needless full fetch, needs the cluster's state: checker.py.)
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Mapping, Sequence

from .records import Polled, Quiet, Violation

Source = tuple[str, str]


def check_cadence(polled: Sequence[Polled], quiets: Sequence[tuple[Quiet, Mapping[Source, float]]],
                  *, bound: float, grace: float) -> list[Violation]:
    by_source: dict[Source, list[float]] = defaultdict(list)
    for poll in polled:
        by_source[(poll.environment, poll.token)].append(poll.time)
    found: list[Violation] = []
    for quiet, sources in quiets:
        start = quiet.time + grace
        for source, refresh in sorted(sources.items()):
            limit = refresh + bound
            if quiet.end - start < limit:
                continue  # too short a window to judge this source
            times = [t for t in by_source.get(source, []) if start <= t <= quiet.end]
            points = [start, *times, quiet.end]
            gaps = [b - a for a, b in itertools.pairwise(points)]
            worst = max(gaps)
            if worst > limit:
                at = points[gaps.index(worst)]
                found.append(Violation(
                    "poll-overdue", at + limit, (f"environment {source[0]}", f"token {source[1]}"),
                    f"no poll for {worst:.1f} s in a quiet phase (refreshInterval {refresh:g} s"
                    f" + {bound:g} s allowed)"))
    return found
