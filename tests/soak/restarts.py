"""Rule: each data change of a target restarts the workloads that name it exactly once.

Watch streams of different kinds arrive in no common order, so restarts are judged after
the run, by resourceVersion (one etcd orders every write): the data a restart rolled out
is the target's last version written before the Deployment's. A restart whose data equals
what the pods last started with is a duplicate; a quiet phase that ends with the target
holding data the workload never restarted for is a missed restart. The pods of a new
workload start with the target's first data (no restart on create).
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from .records import Quiet, Violation, Watched, secret_data
from .world import Key, target_name

RESTARTED_AT = "himitsu.io/restartedAt"


def restarted_at(obj: Mapping[str, Any]) -> str | None:
    tpl = ((obj.get("spec") or {}).get("template") or {}).get("metadata") or {}
    value = (tpl.get("annotations") or {}).get(RESTARTED_AT)
    return str(value) if value is not None else None


def _rv(rec: Watched) -> int:
    try:
        return int(rec.rv)
    except ValueError:
        return 0


def check(watched: Sequence[Watched], quiets: Sequence[Quiet]) -> list[Violation]:
    target_of: dict[Key, Key] = {}  # Deployment -> target Secret (the last word)
    for rec in watched:
        if rec.kind == "HimitsuSecret" and rec.type != "DELETED":
            for ref in (rec.obj.get("spec") or {}).get("rolloutRestartTargets") or []:
                if ref.get("kind") == "Deployment":
                    target_of[(rec.namespace, str(ref.get("name")))] = (
                        rec.namespace, target_name(rec.obj))
    wanted = set(target_of.values())
    history: dict[Key, list[tuple[int, float, dict[str, str]]]] = defaultdict(list)
    restarts: dict[Key, list[tuple[int, float]]] = defaultdict(list)
    last_stamp: dict[Key, str | None] = {}
    for rec in sorted(watched, key=_rv):
        if rec.kind == "Secret" and rec.key in wanted and rec.type != "DELETED":
            history[rec.key].append((_rv(rec), rec.time, secret_data(rec.obj)))
        elif rec.kind == "Deployment" and rec.key in target_of and rec.type != "DELETED":
            stamp = restarted_at(rec.obj)
            if rec.key in last_stamp and stamp != last_stamp[rec.key] and stamp is not None:
                restarts[rec.key].append((_rv(rec), rec.time))
            last_stamp[rec.key] = stamp
    found: list[Violation] = []
    for dep, target in sorted(target_of.items()):
        versions = history.get(target, [])
        if not versions:
            continue
        rvs = [rv for rv, _, _ in versions]
        started = versions[0][2]
        ends = sorted(q.end for q in quiets)
        events = sorted([(t, "restart", rv) for rv, t in restarts.get(dep, [])]
                        + [(t, "quiet-end", 0) for t in ends])
        for time, what, rv in events:
            objects = (f"{dep[0]}/{dep[1]}", f"{target[0]}/{target[1]}")
            if what == "restart":
                index = bisect.bisect_left(rvs, rv) - 1
                data = versions[index][2] if index >= 0 else started
                if data == started:
                    found.append(Violation(
                        "restart-without-change", time, objects,
                        "the workload was restarted though its target's data is what its "
                        "pods last started with"))
                started = data
                continue
            current = [d for _, t, d in versions if t <= time]
            if current and current[-1] != started:
                found.append(Violation(
                    "change-not-restarted", time, objects,
                    "at the end of a quiet phase the target holds data the workload was "
                    "never restarted for"))
    return found
