"""The soak's report: the figures of issue 26, and every violation with its context."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

from .checker import Findings
from .records import Injected


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1)]


def render(*, start: float, seed: int, minutes: float, objects: int, changes: Mapping[str, int],
           failed: Mapping[str, int], injected: Sequence[Injected], findings: Findings,
           operator_restarts: int,
           peak_rss_mib: Mapping[str, float], fault_errors: Sequence[str]) -> str:
    faults = Counter(f.kind for f in injected)
    converge = [c for c in findings.convergence if not math.isinf(c)]
    never = sum(1 for c in findings.convergence if math.isinf(c))
    per_poll = (findings.quiet_requests / findings.hsec_polls_due if findings.hsec_polls_due
                else math.nan)
    lines = [
        "=" * 72,
        f"soak report  seed={seed}  (rerun: SOAK_SEED={seed} SOAK_MINUTES={minutes:g} "
        f"SOAK_OBJECTS={objects} make soak)",
        "=" * 72,
        f"minutes                      {minutes:g}",
        f"objects (HimitsuSecrets)     {objects} at the start",
        f"changes made                 {sum(changes.values())}: "
        + ", ".join(f"{k} {v}" for k, v in sorted(changes.items())),
    ]
    if failed:
        lines.append("  refused while faults ran  "
                     + ", ".join(f"{k} {v}" for k, v in sorted(failed.items())))
    lines += [
        f"faults injected              {sum(faults.values())}: "
        + ", ".join(f"{k} {v}" for k, v in sorted(faults.items())),
        f"violations                   {len(findings.violations)}",
        f"quiet phases                 {len(findings.convergence)}"
        + (f" ({never} never converged)" if never else ""),
        f"longest convergence          {max(converge, default=math.nan):.1f} s after a quiet "
        "phase began",
        f"propagation of a change      p50 {percentile(findings.propagation, 50):.1f} s, "
        f"p99 {percentile(findings.propagation, 99):.1f} s, max "
        f"{max(findings.propagation, default=math.nan):.1f} s "
        f"({len(findings.propagation)} measured, {findings.unpropagated} superseded or unseen)",
        f"longest time without leader  {findings.leaderless:.1f} s (longest gap between "
        "Lease writes)",
        f"operator restarts            {operator_restarts}",
        f"Himitsu requests per poll    {per_poll:.2f} in quiet phases: "
        f"{findings.quiet_requests} requests for {findings.hsec_polls_due:.0f} polls due "
        "(each HimitsuSecret once per refreshInterval)",
        f"                             ({findings.polls_due:.0f} if each source (environment, "
        "token) were asked once per its shortest refreshInterval)",
        "peak RSS                     " + ", ".join(
            f"replica {k} {v:.0f} MiB" for k, v in sorted(peak_rss_mib.items())),
    ]
    if findings.full_fetches:
        lines.append("full fetches after a 304    "
                     + ", ".join(f"{v} for {k}" for k, v in findings.full_fetches.items()))
    for error in fault_errors:
        lines.append(f"fault not carried out: {error}")
    for v in findings.violations:
        stamp = datetime.fromtimestamp(v.time, UTC).strftime("%H:%M:%S.%f")[:-3]
        lines += [f"VIOLATION {v.rule} seed={seed} at t+{v.time - start:.1f}s ({stamp} UTC): "
                  f"{', '.join(v.objects)}",
                  f"    {v.detail}",
                  f"    last faults: {'; '.join(v.faults[-5:]) or 'none'}"]
    lines.append("=" * 72)
    return "\n".join(lines)
