"""Pure arithmetic and parsing behind every benchmark figure.

Why apart from the rig: a figure is only as good as the way it is counted, and counting
(an audit event per request, not per stage; a percentile by linear interpolation; CPU
from clock ticks) is easy to get subtly wrong. Keeping it free of I/O and clocks lets
tests/unit/test_bench.py prove it without a cluster.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

# -- statistics --------------------------------------------------------------------------


def percentile(values: Iterable[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation between closest ranks.

    The same definition as numpy's default: p50 of [1, 2, 3, 4] is 2.5, p100 the maximum.
    """
    ordered = sorted(values)
    if not ordered:
        raise ValueError("percentile of no values")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile {q} outside 0..100")
    rank = (len(ordered) - 1) * q / 100.0
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def median(values: Iterable[float]) -> float:
    return percentile(values, 50.0)


def per_unit(count: float, units: float) -> float | None:
    """count / units, or None when there were no units (a figure that cannot be had)."""
    return count / units if units > 0 else None


def linear_fit(points: list[tuple[float, float]]) -> tuple[float, float] | None:
    """Least-squares (slope, intercept) of y on x; None unless two distinct x."""
    xs = [x for x, _ in points]
    if len(set(xs)) < 2:
        return None
    mx = sum(xs) / len(xs)
    my = sum(y for _, y in points) / len(points)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx
    return slope, my - slope * mx


def bucket_counts(times: Iterable[float], *, start: float, width: float,
                  buckets: int) -> list[int]:
    """How many of ``times`` fall in each of ``buckets`` windows of ``width`` from ``start``."""
    counts = [0] * buckets
    for t in times:
        index = math.floor((t - start) / width)
        if 0 <= index < buckets:
            counts[index] += 1
    return counts


# -- the apiserver's audit log -----------------------------------------------------------


@dataclass(frozen=True)
class AuditEvent:
    """One line of a Metadata-level audit log (the fields the benchmarks count by)."""

    audit_id: str
    stage: str
    username: str
    user_agent: str
    verb: str
    resource: str  # "secrets", "himitsusecrets/status", or the path of a non-resource URL
    namespace: str
    code: int | None
    received: float  # requestReceivedTimestamp, seconds since the epoch
    name: str = ""  # objectRef.name (the soak's checker needs the object written)


def parse_timestamp(text: str) -> float:
    """RFC 3339 with a Z, as the apiserver writes it, to seconds since the epoch."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def parse_audit_line(line: str) -> AuditEvent | None:
    """An audit event, or None for a blank, partial or foreign line."""
    try:
        raw = json.loads(line)
    except ValueError:
        return None
    if not isinstance(raw, dict) or raw.get("kind") != "Event" or "auditID" not in raw:
        return None
    ref = raw.get("objectRef") or {}
    if ref.get("resource"):
        resource = str(ref["resource"])
        if ref.get("subresource"):
            resource += f"/{ref['subresource']}"
    else:
        resource = str(raw.get("requestURI", "")).split("?", 1)[0]
    try:
        received = parse_timestamp(str(raw["requestReceivedTimestamp"]))
    except (KeyError, ValueError):
        return None
    code = (raw.get("responseStatus") or {}).get("code")
    return AuditEvent(
        audit_id=str(raw["auditID"]), stage=str(raw.get("stage", "")),
        username=str((raw.get("user") or {}).get("username", "")),
        user_agent=str(raw.get("userAgent", "")), verb=str(raw.get("verb", "")),
        resource=resource, namespace=str(ref.get("namespace", "")),
        code=int(code) if isinstance(code, int) else None, received=received,
        name=str(ref.get("name", "")),
    )


def parse_audit_lines(lines: Iterable[str]) -> Iterator[AuditEvent]:
    for line in lines:
        event = parse_audit_line(line)
        if event is not None:
            yield event


def unique_requests(events: Iterable[AuditEvent]) -> list[AuditEvent]:
    """One event per request: a watch logs ResponseStarted and ResponseComplete under one
    auditID, and counting stages would count it twice. The last stage seen wins (it has
    the final response code)."""
    latest: dict[str, AuditEvent] = {}
    for event in events:
        latest[event.audit_id] = event
    return list(latest.values())


def select(events: Iterable[AuditEvent], *, username: str | None = None,
           since: float | None = None, until: float | None = None,
           namespaces: Iterable[str] | None = None) -> list[AuditEvent]:
    """Requests of ``username`` received in [since, until), optionally in some namespaces."""
    wanted_ns = set(namespaces) if namespaces is not None else None
    return [
        e for e in unique_requests(events)
        if (username is None or e.username == username)
        and (since is None or e.received >= since)
        and (until is None or e.received < until)
        and (wanted_ns is None or e.namespace in wanted_ns)
    ]


def by_verb(events: Iterable[AuditEvent]) -> Counter[str]:
    """Counts keyed "verb resource", e.g. "patch himitsusecrets/status"."""
    return Counter(f"{e.verb} {e.resource}" for e in events)


def count_status(events: Iterable[AuditEvent], code: int) -> int:
    return sum(1 for e in events if e.code == code)


# -- Prometheus text exposition ------------------------------------------------------------

Sample = tuple[str, frozenset[tuple[str, str]]]


def parse_prometheus(text: str) -> dict[Sample, float]:
    """Samples of the text format: {(name, labels): value}. Comments are skipped.

    Label values here never hold a comma, a quote or a brace (ours are bounded
    identifiers), so a simple split suffices.
    """
    samples: dict[Sample, float] = {}
    for raw_line in text.splitlines():
        line = raw_line.strip()
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        labels: frozenset[tuple[str, str]] = frozenset()
        name = head
        if "{" in head:
            name, _, rest = head.partition("{")
            pairs = [p for p in rest.rstrip("}").split(",") if p]
            labels = frozenset((k.strip(), v.strip().strip('"'))
                               for k, _, v in (p.partition("=") for p in pairs))
        try:
            samples[(name, labels)] = float(value)
        except ValueError:
            continue
    return samples


def metric_sum(samples: Mapping[Sample, float], name: str, **match: str) -> float:
    """Sum of ``name`` over every series whose labels include ``match``."""
    want = set(match.items())
    return sum(v for (n, labels), v in samples.items() if n == name and want <= labels)


def metric_delta(before: Mapping[Sample, float], after: Mapping[Sample, float], name: str,
                 **match: str) -> float:
    return metric_sum(after, name, **match) - metric_sum(before, name, **match)


# -- /proc ---------------------------------------------------------------------------------


def cpu_ticks(stat_text: str) -> int:
    """utime + stime (fields 14 and 15 of /proc/<pid>/stat), in clock ticks, all threads.

    Split after the last ')' because the command name may itself hold spaces or parens.
    """
    fields = stat_text[stat_text.rindex(")") + 2:].split()
    return int(fields[11]) + int(fields[12])


def status_kib(status_text: str, field: str = "VmRSS") -> int:
    """A kB field of /proc/<pid>/status (VmRSS, VmHWM), in KiB."""
    for line in status_text.splitlines():
        name, _, rest = line.partition(":")
        if name == field:
            return int(rest.split()[0])
    raise ValueError(f"no {field} in /proc status")


def mib(kib: float) -> float:
    return kib / 1024.0


def summarize(values: Sequence[float]) -> dict[str, float | int | None]:
    """n, p50, p99 and max of a latency sample (None figures when it is empty)."""
    if not values:
        return {"n": 0, "p50": None, "p99": None, "max": None}
    return {"n": len(values), "p50": percentile(values, 50), "p99": percentile(values, 99),
            "max": max(values)}


# -- py-spy's collapsed stacks ---------------------------------------------------------------


def top_frames(collapsed: str, *, limit: int = 15) -> dict[str, list[tuple[str, float]]]:
    """Where the samples of a ``py-spy record --format raw`` profile went.

    Each line is ``frame;frame;...;leaf count``. "self" counts a frame when it is the
    leaf (time spent in it), "total" when it is anywhere on the stack (counted once per
    stack even under recursion). Figures are shares of all samples, in percent.
    """
    self_counts: Counter[str] = Counter()
    total_counts: Counter[str] = Counter()
    samples = 0
    for line in collapsed.splitlines():
        stack, _, count_text = line.rstrip().rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        samples += count
        self_counts[frames[-1]] += count
        for frame in set(frames):
            total_counts[frame] += count
    if samples == 0:
        return {"self": [], "total": []}
    return {
        "self": [(f, 100.0 * n / samples) for f, n in self_counts.most_common(limit)],
        "total": [(f, 100.0 * n / samples) for f, n in total_counts.most_common(limit)],
    }
