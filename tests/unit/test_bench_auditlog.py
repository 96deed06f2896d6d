"""bench/auditlog.py: the audit-log reader counts every request across log rotations.

kube-apiserver rotates its audit log the lumberjack way: the file is closed, renamed to
``audit-<UTC time>.log`` and a new ``audit.log`` is created. These tests play the writer
with temporary files (no cluster) and hold the reader to its contract: every line of the
operator is seen exactly once, in order, whenever the rotation falls between or inside
reads; what may have been missed is reported in ``gaps``, never silently dropped.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.auditlog import AuditGap, AuditLog, check_complete  # noqa: E402
from test_bench import OPERATOR, audit_line  # noqa: E402


class Writer:
    """An apiserver's audit log writer: appends whole lines, rotates like lumberjack."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / "audit.log"
        self.path.touch()
        self.count = 0
        self.backups: list[Path] = []

    def write(self, n: int, *, user: str = OPERATOR) -> list[str]:
        ids = []
        with open(self.path, "a") as fh:
            for _ in range(n):
                self.count += 1
                ids.append(f"{user[-3:]}-{self.count:05d}")
                fh.write(compact(audit_line(ids[-1], user=user)) + "\n")
        return ids

    def rename(self) -> Path:
        backup = self.path.with_name(f"audit-2026-12-01T12-00-{len(self.backups):02d}.000.log")
        os.rename(self.path, backup)
        self.backups.append(backup)
        return backup

    def create(self) -> None:
        self.path.touch()

    def rotate(self) -> Path:
        backup = self.rename()
        self.create()
        return backup


def compact(line: str) -> str:
    """As kube-apiserver writes it: no spaces after separators."""
    return json.dumps(json.loads(line), separators=(",", ":"))


def ids(log: AuditLog) -> list[str]:
    return [e.audit_id for e in log.refresh()]


def test_without_rotation_each_line_is_read_once(tmp_path: Path) -> None:
    writer = Writer(tmp_path)
    log = AuditLog(writer.path, username=OPERATOR)
    first = writer.write(3)
    assert ids(log) == first
    second = writer.write(2)
    writer.write(4, user="himitsu-local-admin")
    assert ids(log) == first + second
    assert (log.lines, log.rotations, log.gaps) == (9, 0, [])


def test_a_rotation_between_reads_loses_nothing(tmp_path: Path) -> None:
    writer = Writer(tmp_path)
    log = AuditLog(writer.path, username=OPERATOR)
    before = writer.write(3)
    assert ids(log) == before
    late = writer.write(2)  # written to the old file after the last read
    writer.rotate()
    after = writer.write(4)
    assert ids(log) == before + late + after
    assert (log.lines, log.rotations, log.gaps) == (9, 1, [])


def test_the_new_file_may_be_larger_than_the_old_offset(tmp_path: Path) -> None:
    """The old reader's failure: it kept an offset into the path. Here the new file
    outgrows that offset before the next read; nothing is skipped or read twice."""
    writer = Writer(tmp_path)
    log = AuditLog(writer.path, username=OPERATOR)
    before = writer.write(2)
    assert ids(log) == before
    writer.rotate()
    after = writer.write(10)
    assert ids(log) == before + after
    assert log.gaps == []


def test_several_rotations_between_reads_are_read_oldest_first(tmp_path: Path) -> None:
    writer = Writer(tmp_path)
    log = AuditLog(writer.path, username=OPERATOR)
    expected = writer.write(1)
    assert ids(log) == expected
    for _ in range(3):
        expected += writer.write(2)
        writer.rotate()
    expected += writer.write(1)
    assert ids(log) == expected
    assert (log.lines, log.rotations, log.gaps) == (8, 3, [])


def test_a_read_between_rename_and_create_picks_up_later(tmp_path: Path) -> None:
    writer = Writer(tmp_path)
    log = AuditLog(writer.path, username=OPERATOR)
    expected = writer.write(2)
    writer.rename()  # no audit.log for a moment
    assert ids(log) == expected
    writer.create()
    expected += writer.write(2)
    writer.rotate()  # and one more rotation before the next read
    expected += writer.write(3)
    assert ids(log) == expected
    assert (log.rotations, log.gaps) == (2, [])


def test_a_partial_last_line_waits_for_its_end(tmp_path: Path) -> None:
    writer = Writer(tmp_path)
    log = AuditLog(writer.path, username=OPERATOR)
    line = compact(audit_line("half", user=OPERATOR)) + "\n"
    with open(writer.path, "a") as fh:
        fh.write(line[:50])
    assert ids(log) == [] and log.lines == 0
    with open(writer.path, "a") as fh:
        fh.write(line[50:])
    assert ids(log) == ["half"] and log.lines == 1


def test_rotated_files_from_before_the_reader_are_not_counted(tmp_path: Path) -> None:
    writer = Writer(tmp_path)
    writer.write(5)
    writer.rotate()
    log = AuditLog(writer.path, username=OPERATOR)
    fresh = writer.write(2)
    writer.rotate()
    fresh += writer.write(1)
    assert ids(log) == fresh
    assert log.gaps == []


def test_a_truncated_log_is_a_gap(tmp_path: Path) -> None:
    writer = Writer(tmp_path)
    log = AuditLog(writer.path, username=OPERATOR)
    writer.write(4)
    ids(log)
    writer.path.write_text("")  # truncated in place: lines may be lost
    again = writer.write(1)
    assert ids(log)[-1:] == again
    assert len(log.gaps) == 1 and "shrank" in log.gaps[0]


def test_a_rotated_file_gone_before_its_turn_is_a_gap(tmp_path: Path) -> None:
    writer = Writer(tmp_path)
    log = AuditLog(writer.path, username=OPERATOR)
    writer.write(1)
    ids(log)
    ours = writer.rotate()
    writer.write(2)
    writer.rotate()
    ours.unlink()  # deleted (a backup limit): the reader cannot place the other one
    writer.write(1)
    ids(log)
    assert len(log.gaps) == 1 and "cannot tell" in log.gaps[0]


# -- the completeness check ----------------------------------------------------------------


def test_a_complete_log_passes_the_check(tmp_path: Path) -> None:
    writer = Writer(tmp_path)
    log = AuditLog(writer.path, username=OPERATOR)
    writer.write(3)
    writer.rotate()
    writer.write(2, user="himitsu-local-admin")
    log.refresh()
    check_complete(log, logged=5, errors=0)  # exactly what the apiserver counted
    check_complete(log, logged=4, errors=0)  # more read than counted: requests since


def test_fewer_lines_than_the_apiserver_logged_fail_loudly(tmp_path: Path) -> None:
    """The old reader's silent zero: here the lines it would have missed are named."""
    writer = Writer(tmp_path)
    log = AuditLog(writer.path, username=OPERATOR)
    writer.write(3)
    log.refresh()
    with pytest.raises(AuditGap, match="2 of the 5 audit events"):
        check_complete(log, logged=5, errors=0)


@pytest.mark.parametrize("damage", ["errors", "gap"])
def test_write_errors_or_gaps_fail_the_check(tmp_path: Path, damage: str) -> None:
    writer = Writer(tmp_path)
    log = AuditLog(writer.path, username=OPERATOR)
    writer.write(2)
    log.refresh()
    if damage == "gap":
        writer.path.write_text("")
        writer.write(1)
        log.refresh()
    with pytest.raises(AuditGap):
        check_complete(log, logged=0, errors=1 if damage == "errors" else 0)
