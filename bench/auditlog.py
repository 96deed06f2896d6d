"""The apiserver's audit log, read incrementally and across rotations.

Why a reader of its own: kube-apiserver writes the log through lumberjack, which at
``--audit-log-maxsize`` (100 MB when unset) renames ``audit.log`` to
``audit-<UTC time>.log`` and starts a new ``audit.log``. A reader that only remembers an
offset into the path then seeks past the end of the new, smaller file and silently sees
nothing: every later window counts 0 requests. This one holds the file it reads open (a
rename does not disturb an open file), reads it to its end once the path names another
file, then the rotated files that came after it, oldest first, then the new file.

What it cannot see, it says: ``gaps`` names every way lines may have gone unread (a
file truncated under it, a rotated file it cannot place, a torn last line), and
``lines`` counts every whole line of every user, which the rig compares with the
apiserver's own count of audit events (``apiserver_audit_event_total``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO

from . import figures


class AuditGap(RuntimeError):
    """Requests may have gone uncounted: every figure from the audit log is suspect."""


def check_complete(log: AuditLog, *, logged: float, errors: float) -> None:
    """Raise AuditGap unless ``log`` has read every event the apiserver says it logged.

    ``logged`` is ``apiserver_audit_event_total`` (events sent to the audit backend,
    stages omitted by the policy excluded), ``errors`` its ``apiserver_audit_error_total``;
    both scraped before the log was last read, so ``log.lines`` may exceed ``logged`` (the
    requests since) but never fall short of it.
    """
    problems = list(log.gaps)
    if errors > 0:
        problems.append(f"the apiserver failed to write {errors:.0f} audit events")
    if log.lines < logged:
        problems.append(f"{logged - log.lines:.0f} of the {logged:.0f} audit events the "
                        f"apiserver logged were not read ({log.rotations} rotations followed)")
    if problems:
        raise AuditGap("audit log incomplete, kube request counts would be wrong: "
                       + "; ".join(problems))


class AuditLog:
    """The operator's requests from the audit log (every line is counted, only lines of
    ``username`` are decoded: the log also holds the benchmark's own requests)."""

    def __init__(self, path: Path, *, username: str, prefix: bool = False) -> None:
        self.path = Path(path)
        self.username = username
        # prefix: decode the lines of every user whose name starts with ``username``
        closing = "" if prefix else '"'
        self._needle = f'"username":"{username}{closing}'.encode()
        self._fh: BinaryIO | None = None
        self._ino: int | None = None
        self._partial = b""
        # Inodes of files read to their end; rotated files older than the reader are not
        # its business (a fresh cluster has none).
        self._done: set[int] = {ino for ino in map(_inode, self._backups()) if ino is not None}
        self.events: list[figures.AuditEvent] = []
        self.lines = 0
        self.rotations = 0
        self.gaps: list[str] = []
        self._open_current()  # from now on nothing written is missed, rotated or not

    # -- reading ---------------------------------------------------------------------------
    def refresh(self) -> list[figures.AuditEvent]:
        """Read whatever was written since the last call; every event of ``username``."""
        while True:
            if self._fh is None:
                if self._ino is not None:  # a file was finished: the rotated ones after it
                    for backup in self._rotated_after_ours():
                        self._read_whole(backup)
                if not self._open_current():
                    break
            assert self._fh is not None
            self._drain()
            try:
                current = os.stat(self.path)
            except FileNotFoundError:  # between lumberjack's rename and its create
                break
            if current.st_ino != self._ino:
                self._finish_rotated()
                continue
            if current.st_size < self._fh.tell():
                self.gaps.append(f"{self.path} shrank to {current.st_size} bytes under "
                                 f"the reader at {self._fh.tell()}")
                self._fh.seek(0)
                self._partial = b""
                continue
            break
        return self.events

    def window(self, since: float, until: float) -> list[figures.AuditEvent]:
        return figures.select(self.refresh(), username=self.username, since=since,
                              until=until)

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    # -- internals ---------------------------------------------------------------------------
    def _open_current(self) -> bool:
        try:
            fh = open(self.path, "rb")  # noqa: SIM115 - held open across calls on purpose
        except FileNotFoundError:
            return False
        ino = os.fstat(fh.fileno()).st_ino
        if ino in self._done:  # a file already read to its end (not lumberjack's way)
            fh.close()
            return False
        self._fh, self._ino, self._partial = fh, ino, b""
        return True

    def _drain(self) -> None:
        assert self._fh is not None
        self._take(self._fh.read())

    def _take(self, chunk: bytes) -> None:
        data = self._partial + chunk
        end = data.rfind(b"\n") + 1  # only whole lines; a partial one is kept for later
        self._partial = data[end:]
        lines = data[:end].splitlines()
        self.lines += sum(1 for line in lines if line.strip())
        mine = [line.decode("utf-8", "replace") for line in lines if self._needle in line]
        self.events.extend(figures.parse_audit_lines(mine))

    def _finish_rotated(self) -> None:
        """The path names a new file: ours was renamed (lumberjack closes a file before it
        renames it, so reading it to its end now reads all of it)."""
        assert self._fh is not None and self._ino is not None
        self._drain()
        if self._partial:
            self.gaps.append(f"a rotated audit file ended in a partial line "
                             f"({len(self._partial)} bytes)")
        self._fh.close()
        self._done.add(self._ino)  # _ino stays: the rotated files after it come next
        self._fh, self._partial = None, b""
        self.rotations += 1

    def _backups(self) -> list[Path]:
        """Rotated files of this log, oldest first: lumberjack names them
        ``<stem>-<UTC time>.<ext>`` with a sortable time."""
        stem, suffix = self.path.stem, self.path.suffix
        return sorted(p for p in self.path.parent.glob(f"{stem}-*{suffix}") if p.is_file())

    def _rotated_after_ours(self) -> list[Path]:
        backups = self._backups()
        inodes = [_inode(p) for p in backups]
        ours = [i for i, ino in enumerate(inodes) if ino == self._ino]
        if not ours:
            unread = [p for p, ino in zip(backups, inodes, strict=True)
                      if ino is not None and ino not in self._done]
            if unread:
                self.gaps.append(f"the rotated file being read is gone from "
                                 f"{self.path.parent}: cannot tell whether "
                                 f"{', '.join(p.name for p in unread)} came after it")
            return []
        return [p for p, ino in zip(backups[ours[0] + 1:], inodes[ours[0] + 1:], strict=True)
                if ino is not None and ino not in self._done]

    def _read_whole(self, path: Path) -> None:
        try:
            with open(path, "rb") as fh:
                ino = os.fstat(fh.fileno()).st_ino
                self._partial = b""
                self._take(fh.read())
        except FileNotFoundError:
            self.gaps.append(f"rotated audit file {path.name} vanished before it was read")
            return
        if self._partial:
            self.gaps.append(f"{path.name} ended in a partial line")
            self._partial = b""
        self._done.add(ino)
        self.rotations += 1


def _inode(path: Path) -> int | None:
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return None
