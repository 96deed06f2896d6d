"""Re-run the checker on a finished soak's records: ``python -m soak.recheck <workdir>``.

For working on the checker itself: the records (watch events, audit writes, requests,
acts, faults) are kept in ``<workdir>/records.pickle``, written by the soak itself.
"""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

from .checker import Config, check
from .records import Text
from .rig import LEASE, SA_PREFIX
from .schedule import REPLICAS


def main(argv: list[str]) -> int:
    workdir = Path(argv[1])
    with open(workdir / "records.pickle", "rb") as fh:
        records = pickle.load(fh)  # noqa: S301 - our own file, written by the soak
    users = frozenset(f"system:serviceaccount:himitsu-system:{SA_PREFIX}{r}" for r in REPLICAS)
    issued: frozenset[str] = frozenset()  # values are not kept on disk; the marker scan runs
    findings = check([r for r in records if not isinstance(r, Text) or len(argv) > 2],
                     Config(operator_users=users, lease=LEASE, issued=issued))
    for v in findings.violations:
        print(f"{v.rule} at {v.time:.2f}: {', '.join(v.objects)}\n    {v.detail}\n"
              f"    faults: {'; '.join(v.faults[-5:])}")
    print(f"{len(findings.violations)} violations; convergence {findings.convergence}")
    return 1 if findings.violations else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
