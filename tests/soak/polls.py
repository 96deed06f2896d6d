"""Rules on the stand-in's request log: poll cadence, and no needless full fetch.

Cadence is timed in quiet phases (Himitsu healthy, no fault, no change), after a grace
that lets a leader settle: every source (environment, token) a HimitsuSecret names is
polled at least once per its shortest refreshInterval + ``bound``. A full fetch (no
If-None-Match) right after a 304 for the same source needs a reason: a user act on a
HimitsuSecret, target or token of that environment, or a fault, in between (or just
before); the excused ones are counted by reason.
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence

from .records import Injected, Polled, Quiet, Violation

Source = tuple[str, str]
REASON_SLACK = 2.0  # an act this long before the 304 still explains the fetch after it


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


def check_full_fetches(polled: Sequence[Polled], reasons: Mapping[str, Sequence[float]],
                       faults: Sequence[Injected]) -> tuple[list[Violation], Counter[str]]:
    last: dict[Source, Polled] = {}
    excused: Counter[str] = Counter()
    found: list[Violation] = []
    for poll in sorted(polled, key=lambda p: p.time):
        source = (poll.environment, poll.token)
        before = last.get(source)
        last[source] = poll
        if poll.conditional or before is None or before.status != 304:
            continue
        since = before.time - REASON_SLACK
        if any(since <= t <= poll.time for t in reasons.get(poll.environment, ())):
            excused["a user act on its environment's objects"] += 1
            continue
        fault = next((f for f in faults if f.time <= poll.time and f.end >= since), None)
        if fault is not None:
            excused[f"fault {fault.kind}"] += 1
            continue
        found.append(Violation(
            "needless-full-fetch", poll.time, (f"environment {source[0]}", f"token {source[1]}"),
            f"a full fetch {poll.time - before.time:.1f} s after a 304, with no user act or "
            "fault in between"))
    return found, excused
