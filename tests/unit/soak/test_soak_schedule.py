"""The soak's fault schedule: one seed, one schedule; faults bounded and kept apart.

A printed seed must replay the same faults at the same offsets, or a violation found by
a soak could never be looked at again.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parents[2]
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

from soak.schedule import END_MARGIN, FAULT_KINDS, draw  # noqa: E402


def test_the_same_seed_draws_the_same_schedule_and_another_seed_another() -> None:
    first = draw(1234, 30, environments=20, tokens=23)
    assert draw(1234, 30, environments=20, tokens=23) == first
    assert draw(1234, 30, environments=20, tokens=23).describe() == first.describe()
    assert draw(1235, 30, environments=20, tokens=23).faults != first.faults


def test_thirty_minutes_draw_at_least_fifty_faults_of_every_kind() -> None:
    schedule = draw(7, 30, environments=20, tokens=23)
    assert len(schedule.faults) >= 50
    assert {f.kind for f in schedule.faults} == set(FAULT_KINDS)


def test_every_fault_ends_before_its_quiet_phase_and_quiet_phases_last() -> None:
    for seed in range(20):
        schedule = draw(seed, 30, environments=20, tokens=23)
        chaos = [p for p in schedule.phases if not p.quiet]
        for fault in schedule.faults:
            phase = next(p for p in chaos if p.start <= fault.at < p.end)
            assert fault.end <= phase.end - END_MARGIN
        assert all(p.end - p.start >= 75.0 for p in schedule.phases if p.quiet)
        assert schedule.phases[-1].end == 30 * 60


def test_faults_of_one_family_never_overlap() -> None:
    for seed in range(20):
        busy: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for fault in draw(seed, 30, environments=20, tokens=23).faults:
            family = FAULT_KINDS[fault.kind][0]
            if family in ("connection", "himitsu", "token"):
                family += "/" + fault.target
            for start, end in busy[family]:
                assert not start <= fault.at < end, (seed, fault)
            busy[family].append((fault.at, fault.end + 1.0))
