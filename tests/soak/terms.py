"""Rule: no two replicas write in overlapping terms (audit-log writes against the Lease).

Each replica has a ServiceAccount of its own, so the audit log names the writer. A term
begins with a replica's first successful Lease write after another replica's: from then
on, any write by the replica that led before (received by the apiserver after that
moment, and before it writes the Lease again) is a split brain. A write by a replica
that never held the Lease is one too. The longest gap between two Lease writes is the
longest time the cluster went without a renewing leader.
"""

from __future__ import annotations

from collections.abc import Iterable

from .records import Violation, Written


def check(writes: Iterable[Written], *, users: frozenset[str],
          lease: str) -> tuple[list[Violation], float]:
    ours = sorted((w for w in writes if w.user in users), key=lambda w: w.time)
    holder: str | None = None
    deposed: dict[str, float] = {}  # replica -> when another replica took the Lease
    last_lease_write: float | None = None
    longest = 0.0
    found: list[Violation] = []
    for write in ours:
        if write.resource == "leases" and write.name == lease:
            if last_lease_write is not None:
                longest = max(longest, write.time - last_lease_write)
            last_lease_write = write.time
            if holder is not None and holder != write.user:
                deposed[holder] = write.time
            holder = write.user
            deposed.pop(write.user, None)
            continue
        what = f"{write.verb} {write.resource}/{write.subresource or '-'} " \
               f"{write.namespace}/{write.name}"
        if write.user in deposed:
            found.append(Violation(
                "write-outside-term", write.time, (write.user, what),
                f"written {write.time - deposed[write.user]:.2f} s after another replica "
                "took the Lease"))
        elif holder != write.user:
            found.append(Violation(
                "write-outside-term", write.time, (write.user, what),
                f"written while the Lease was held by {holder or 'nobody yet'}"))
    return found, longest
