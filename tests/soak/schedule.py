"""The soak's timetable: chaos phases with faults, quiet phases without, all from one seed.

Pure: ``draw(seed, minutes, ...)`` returns the same Schedule for the same arguments, so a
printed seed replays the same faults at the same offsets (the user driver's choices come
from the same seed too, but their effect depends on timing). Faults overlap, but never
two of one family at once (one control-plane fault, one process fault, one connection
fault per replica), and every fault ends before its chaos phase does.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

QUIET_SECONDS = 75.0  # the longest refreshInterval (30 s) + a bound (45 s)
CHAOS_SECONDS = 120.0
END_MARGIN = 5.0  # every fault is over this long before its quiet phase
FAULTS_PER_CHAOS_MINUTE = 4.0
REPLICAS = ("a", "b")

# kind -> (family, shortest, longest seconds); a family runs one fault at a time.
FAULT_KINDS: dict[str, tuple[str, float, float]] = {
    "apiserver-restart": ("control-plane", 2.0, 10.0),
    "etcd-pause": ("control-plane", 2.0, 8.0),
    "watch-expiry": ("control-plane", 3.0, 8.0),
    "leader-sigkill": ("process", 0.0, 0.0),
    "leader-sigterm": ("process", 0.0, 0.0),
    "restart-mid-sync": ("process", 0.0, 0.0),
    "conn-hang": ("connection", 5.0, 25.0),
    "conn-cut": ("connection", 2.0, 8.0),
    "himitsu-5xx": ("himitsu", 5.0, 30.0),
    "himitsu-429": ("himitsu", 5.0, 30.0),
    "himitsu-slow": ("himitsu", 5.0, 30.0),
    "himitsu-hang": ("himitsu", 5.0, 20.0),
    "token-revoke": ("token", 5.0, 30.0),
}
# A process fault keeps its family busy while the replica restarts and a leader returns.
PROCESS_SETTLE = 15.0


@dataclass(frozen=True)
class Phase:
    start: float  # seconds from the start of the soak
    end: float
    quiet: bool


@dataclass(frozen=True)
class Fault:
    at: float  # seconds from the start of the soak
    seconds: float  # how long it lasts (0: an instant act, e.g. a SIGKILL)
    kind: str
    target: str  # a replica ("a", "b"), "leader", "all", an environment or token index
    params: tuple[tuple[str, float], ...] = ()

    @property
    def end(self) -> float:
        return self.at + self.seconds

    def param(self, name: str, default: float = 0.0) -> float:
        return dict(self.params).get(name, default)

    def describe(self) -> str:
        extra = "".join(f" {k}={v:g}" for k, v in self.params)
        return (f"t+{self.at:7.1f}s  {self.kind:<17} {self.seconds:5.1f}s  "
                f"target={self.target}{extra}")


@dataclass(frozen=True)
class Schedule:
    seed: int
    minutes: float
    phases: tuple[Phase, ...]
    faults: tuple[Fault, ...] = field(default=())

    def describe(self) -> list[str]:
        lines = [f"schedule: seed={self.seed} minutes={self.minutes:g} "
                 f"phases={len(self.phases)} faults={len(self.faults)}"]
        for phase in self.phases:
            lines.append(f"  {'quiet' if phase.quiet else 'chaos'} t+{phase.start:.0f}s.."
                         f"t+{phase.end:.0f}s")
        lines += [f"  {fault.describe()}" for fault in self.faults]
        return lines


def plan_phases(total: float, *, chaos: float = CHAOS_SECONDS,
                quiet: float = QUIET_SECONDS) -> tuple[Phase, ...]:
    """Chaos then quiet, repeated to fill ``total`` seconds (at least one of each)."""
    cycles = max(1, round(total / (chaos + quiet)))
    chaos_each = max(30.0, total / cycles - quiet)
    phases: list[Phase] = []
    at = 0.0
    for _ in range(cycles):
        phases.append(Phase(at, at + chaos_each, quiet=False))
        phases.append(Phase(at + chaos_each, at + chaos_each + quiet, quiet=True))
        at += chaos_each + quiet
    return tuple(phases)


def draw(seed: int, minutes: float, *, environments: int, tokens: int,
         rate: float = FAULTS_PER_CHAOS_MINUTE, kinds: tuple[str, ...] = ()) -> Schedule:
    """The faults of a soak of ``minutes``, drawn from ``seed`` (among ``kinds`` only,
    when given: to study one fault at a time)."""
    unknown = set(kinds) - set(FAULT_KINDS)
    if unknown:
        raise ValueError(f"unknown fault kinds {sorted(unknown)}; known: {sorted(FAULT_KINDS)}")
    rng = random.Random(seed)
    phases = plan_phases(minutes * 60.0)
    faults: list[Fault] = []
    kinds = tuple(sorted(kinds or FAULT_KINDS))
    for phase in phases:
        if phase.quiet:
            continue
        busy: dict[str, float] = {}  # family (or family/replica) -> busy until
        span = phase.end - END_MARGIN - phase.start
        wanted = max(1, round(rate * span / 60.0))
        starts = sorted(phase.start + rng.uniform(0.0, span * 0.9) for _ in range(wanted))
        for at in starts:
            for _ in range(len(kinds)):  # a few tries for a family that is free
                kind = rng.choice(kinds)
                fault = _make(rng, kind, at, environments=environments, tokens=tokens)
                family = _family(fault)
                latest_end = phase.end - END_MARGIN
                if busy.get(family, -1.0) <= at and fault.end <= latest_end:
                    settle = PROCESS_SETTLE if FAULT_KINDS[kind][0] == "process" else 1.0
                    busy[family] = fault.end + settle
                    faults.append(fault)
                    break
    return Schedule(seed, minutes, phases, tuple(faults))


def _family(fault: Fault) -> str:
    family = FAULT_KINDS[fault.kind][0]
    if family == "connection":
        return f"{family}/{fault.target}"
    if family in ("himitsu", "token"):
        return f"{family}/{fault.target}"
    return family


def _make(rng: random.Random, kind: str, at: float, *, environments: int,
          tokens: int) -> Fault:
    _, shortest, longest = FAULT_KINDS[kind]
    seconds = round(rng.uniform(shortest, longest), 1)
    params: list[tuple[str, float]] = []
    target = "all"
    if kind.startswith("leader-") or kind == "restart-mid-sync":
        target = "leader"
    elif kind.startswith("conn-"):
        target = rng.choice(REPLICAS)
    elif kind.startswith("himitsu-"):
        target = "all" if rng.random() < 0.4 else f"env-{rng.randrange(environments)}"
        if kind == "himitsu-429":
            params.append(("retry_after", float(rng.randint(1, 10))))
        elif kind == "himitsu-5xx":
            params.append(("status", float(rng.choice((500, 502, 503, 504)))))
        elif kind == "himitsu-slow":
            params.append(("delay", round(rng.uniform(1.0, 4.0), 1)))
        elif kind == "himitsu-hang":
            params.append(("delay", 30.0))
    elif kind == "token-revoke":
        target = f"token-{rng.randrange(tokens)}"
    return Fault(round(at, 1), seconds, kind, target, tuple(params))
