"""The black-box invariant checker: replays a soak's records in time order.

Fed only by watch events, the audit log, the stand-in's request log, the user driver's
own acts and the faults it injected, never by the operator's internals. The rules are
those of issue 26; each violation names the rule, the time, the objects and the faults
active in the minute before. Poll cadence, leader terms and leaks live in polls.py,
terms.py and leaks.py; this module runs the replay and the rules that need its state.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from . import leaks, polls, restarts, terms
from .records import (
    Acted,
    Injected,
    Polled,
    Quiet,
    Text,
    Violation,
    Watched,
    Written,
    annotations_of,
    secret_data,
)
from .world import FOREIGN_PREFIX, Key, World, refresh_seconds, target_name

Record = Watched | Written | Polled | Acted | Injected | Quiet | Text
CONFIG_VERSION = "himitsu.io/config-version"
REASON_SLACK = 2.0  # an act this long before the 304 still explains the fetch after it


@dataclass(frozen=True)
class Config:
    operator_users: frozenset[str]
    lease: str = "himitsu-operator.himitsu.io"
    excuse_window: float = 90.0  # a loss this long after a user act or Himitsu change is theirs
    poll_bound: float = 15.0
    poll_grace: float = 20.0  # after a quiet phase begins, before polls are timed
    issued: frozenset[str] = frozenset()  # secret values and tokens: none may leak
    start: float = 0.0  # the soak's start: fault times are printed from it


@dataclass
class Findings:
    violations: list[Violation] = field(default_factory=list)
    convergence: list[float] = field(default_factory=list)  # per quiet phase; inf: never
    propagation: list[float] = field(default_factory=list)
    unpropagated: int = 0
    leaderless: float = 0.0
    full_fetches: Counter[str] = field(default_factory=Counter)  # excused, by reason
    quiet_requests: int = 0  # Himitsu requests during quiet phases
    polls_due: float = 0.0  # polls due then: each source once per refreshInterval
    hsec_polls_due: float = 0.0  # each HimitsuSecret once per refreshInterval (no sharing)


@dataclass(frozen=True)
class _End:
    """A quiet phase's end, as a record of its own in the replay."""

    time: float
    quiet: Quiet


def check(records: Iterable[Record], config: Config) -> Findings:
    return _Replay(list(records), config).run()


class _Replay:
    def __init__(self, records: list[Record], config: Config) -> None:
        self.records, self.config = records, config
        self.world = World()
        self.found = Findings()
        self.faults = sorted((r for r in records if isinstance(r, Injected)),
                             key=lambda r: r.time)
        acts = [r for r in records if isinstance(r, Acted)]
        self.user_rvs = {a.rv for a in acts if a.rv}
        self.acts_on: dict[Key, list[float]] = defaultdict(list)  # Secret or HimitsuSecret
        for act in acts:
            if act.name:
                self.acts_on[(act.namespace, act.name)].append(act.time)
        self.ever_targets = {(r.namespace, target_name(r.obj)) for r in records
                             if isinstance(r, Watched) and r.kind == "HimitsuSecret"}
        self.recent_targets: dict[Key, tuple[Key, float]] = {}  # no longer a target: since
        self.quiet: Quiet | None = None
        self.quiet_open: set[Key] = set()
        self.quiet_sources: list[tuple[Quiet, dict[tuple[str, str], float]]] = []
        self.pending: dict[Key, list[tuple[float, int]]] = defaultdict(list)
        self.reasons: dict[str, list[float]] = defaultdict(list)  # env -> user acts on it
        self.converged_at: float | None = None
        self.last_poll: dict[tuple[str, str], Polled] = {}
        self.hsec_rates: list[float] = []  # per quiet phase: HimitsuSecret polls due a second

    # -- driving ---------------------------------------------------------------------------
    def run(self) -> Findings:
        ends = [_End(r.end, r) for r in self.records if isinstance(r, Quiet)]
        timeline: list[Record | _End] = [*self.records, *ends]
        timeline.sort(key=lambda r: (r.time, isinstance(r, _End)))
        for rec in timeline:
            if isinstance(rec, Watched):
                self._watched(rec)
            elif isinstance(rec, Acted):
                self._acted(rec)
            elif isinstance(rec, Written):
                self._written(rec)
            elif isinstance(rec, Polled):
                self._polled(rec)
            elif isinstance(rec, Quiet):
                self._quiet_begins(rec)
            elif isinstance(rec, _End):
                self._quiet_ends(rec.quiet)
        self.found.unpropagated = sum(len(v) for v in self.pending.values())
        writes = [r for r in self.records if isinstance(r, Written)]
        polled = [r for r in self.records if isinstance(r, Polled)]
        texts = [r for r in self.records if isinstance(r, Text)]
        watched = [r for r in self.records if isinstance(r, Watched)]
        term_violations, self.found.leaderless = terms.check(
            writes, users=self.config.operator_users, lease=self.config.lease)
        self._add(term_violations)
        self._add(polls.check_cadence(polled, self.quiet_sources, bound=self.config.poll_bound,
                                      grace=self.config.poll_grace))
        for (quiet, sources), rate in zip(self.quiet_sources, self.hsec_rates, strict=True):
            length = quiet.end - quiet.time
            self.found.hsec_polls_due += length * rate
            self.found.polls_due += sum(length / refresh for refresh in sources.values())
            self.found.quiet_requests += sum(1 for p in polled if quiet.time <= p.time <= quiet.end)
        self._add(leaks.check(texts, watched, self.config.issued))
        self._add(restarts.check(watched, [q for q, _ in self.quiet_sources]))
        self.found.violations.sort(key=lambda v: v.time)
        return self.found

    def _add(self, violations: Iterable[Violation]) -> None:
        for v in violations:
            self.violation(v.rule, v.time, v.objects, v.detail)

    def violation(self, rule: str, time: float, objects: Iterable[str], detail: str) -> None:
        recent = tuple(f"{f.kind} {f.target} at t+{f.time - self.config.start:.1f}s"
                       for f in self.faults
                       if f.time <= time and f.end >= time - 60.0)
        self.found.violations.append(Violation(rule, time, tuple(objects), detail, recent))

    def acted_within(self, key: Key, since: float, until: float) -> bool:
        return any(since <= t <= until for t in self.acts_on.get(key, ()))

    # -- records ---------------------------------------------------------------------------
    def _polled(self, poll: Polled) -> None:
        """A full fetch right after a 304 for the same source needs a reason: a user act
        on a HimitsuSecret, target or token of that environment since just before the 304,
        or one the contract gives for a full fetch, seen on a HimitsuSecret polling that
        source (target missing, its config-version not the status's, spec or force-sync
        not yet observed), or HimitsuSecrets sharing the source at different versions."""
        source = (poll.environment, poll.token)
        before = self.last_poll.get(source)
        self.last_poll[source] = poll
        if poll.conditional or before is None or before.status != 304:
            return
        since = before.time - REASON_SLACK
        if any(since <= t <= poll.time for t in self.reasons.get(poll.environment, ())):
            self.found.full_fetches["a user act on its environment's objects"] += 1
            return
        users = [(k, h) for k, h in self.world.hsecs().items()
                 if self.world.environment(h) == poll.environment
                 and self.world.token_fingerprint(h) == poll.token]
        for _, hsec in users:
            unsafe = self.world.unsafe_for_conditional(hsec, user_rvs=self.user_rvs)
            if unsafe is not None:
                self.found.full_fetches[unsafe] += 1
                return
        if len({str((h.get("status") or {}).get("configVersion")) for _, h in users}) > 1:
            # one of them is behind: its data must come in full (a conditional request
            # with its older version would be answered 200 just the same)
            self.found.full_fetches["HimitsuSecrets of the source at different versions"] += 1
            return
        self.violation("needless-full-fetch", poll.time,
                       [f"environment {poll.environment}", f"token {poll.token}",
                        *(f"{k[0]}/{k[1]}" for k, _ in users)],
                       f"a full fetch {poll.time - before.time:.1f} s after a 304, with no user "
                       "act since and every HimitsuSecret of the source in a state that allows "
                       "a conditional request")

    def _acted(self, act: Acted) -> None:
        self.world.apply_act(act)
        if act.kind.startswith("himitsu-") and act.version:
            for key, hsec in self.world.hsecs().items():
                if self.world.environment(hsec) == act.environment:
                    self.pending[key].append((act.time, act.version))
        acted_on = self.world.hsecs().get((act.namespace, act.name))
        if acted_on is not None:
            self.pending.pop((act.namespace, act.name), None)
            self.reasons[self.world.environment(acted_on)].append(act.time)
        if act.environment and not act.kind.startswith("himitsu-"):
            self.reasons[act.environment].append(act.time)
        owner = self.world.targets.get((act.namespace, act.name))
        if owner is not None and owner in self.world.hsecs():
            self.reasons[self.world.environment(self.world.hsecs()[owner])].append(act.time)

    def _written(self, rec: Written) -> None:
        if rec.user not in self.config.operator_users or rec.resource != "secrets":
            return
        if (rec.namespace, rec.name) not in self.ever_targets:
            self.violation("foreign-secret-written", rec.time, [f"{rec.namespace}/{rec.name}"],
                           f"{rec.user} did {rec.verb} on a Secret no HimitsuSecret names")

    def _watched(self, rec: Watched) -> None:
        if rec.kind == "HimitsuSecret":
            old = self.world.hsecs().get(rec.key)
            if old is not None and (rec.type == "DELETED"
                                    or target_name(old) != target_name(rec.obj)):
                self.recent_targets[(rec.namespace, target_name(old))] = (rec.key, rec.time)
            if rec.type == "DELETED":
                self.pending.pop(rec.key, None)
        owner_before = self.world.targets.get(rec.key) if rec.kind == "Secret" else None
        old = self.world.apply_watch(rec)
        if rec.kind == "Secret":
            self._secret_changed(rec, old, owner_before)
        if self.quiet is not None:
            self._recheck_quiet(rec)

    def _owner(self, key: Key, time: float, current: Key | None) -> Key | None:
        if current is not None:
            return current
        recent = self.recent_targets.get(key)
        if recent is not None and time - recent[1] <= self.config.excuse_window:
            return recent[0]
        return None

    def _secret_changed(self, rec: Watched, old: Mapping[str, Any] | None,
                        owner_before: Key | None) -> None:
        owner = self._owner(rec.key, rec.time, owner_before)
        since = rec.time - self.config.excuse_window
        what = f"{rec.namespace}/{rec.name}"
        if owner is not None and rec.type != "DELETED":
            self._propagated(owner, rec)
        if owner is None or old is None:
            return
        excused = (self.acted_within(rec.key, since, rec.time)
                   or self.acted_within(owner, since, rec.time))
        if rec.type == "DELETED":
            if not excused:
                self.violation("target-deleted", rec.time, [what, f"{owner[0]}/{owner[1]}"],
                               "a target Secret was deleted with no user act on it or its "
                               "HimitsuSecret")
            return
        if rec.rv in self.user_rvs:
            return  # the user's own write
        before, after = secret_data(old), secret_data(rec.obj)
        for key, value in before.items():
            if key.startswith(FOREIGN_PREFIX) and after.get(key) != value:
                self.violation("foreign-key-written", rec.time, [what],
                               f"foreign key {key} was {'changed' if key in after else 'removed'}"
                               " by a write that was not the user's")
        hsec = self.world.hsecs().get(owner)
        lost = sorted(k for k in before if k not in after and not k.startswith(FOREIGN_PREFIX))
        if not lost or excused:
            return
        env = self.world.environment(hsec) if hsec is not None else ""
        unexcused = [k for k in lost if not self.world.key_absent_since(env, k, since)]
        if unexcused:
            self.violation("target-lost-keys", rec.time, [what, f"{owner[0]}/{owner[1]}"],
                           f"keys {unexcused} left the target while Himitsu held them, with "
                           "no user act on the target or its HimitsuSecret")

    def _propagated(self, owner: Key, rec: Watched) -> None:
        waiting = self.pending.get(owner)
        if not waiting:
            return
        try:
            version = int(annotations_of(rec.obj).get(CONFIG_VERSION, "0"))
        except ValueError:
            return
        done = [(t, v) for t, v in waiting if v <= version]
        self.found.propagation += [rec.time - t for t, _ in done]
        self.pending[owner] = [(t, v) for t, v in waiting if v > version]

    # -- quiet phases ----------------------------------------------------------------------
    def _quiet_begins(self, quiet: Quiet) -> None:
        self.quiet = quiet
        hsecs = self.world.hsecs()
        self.quiet_open = {k for k in hsecs if self.world.converged(k) is not None}
        sources: dict[tuple[str, str], float] = {}
        rate = 0.0
        for hsec in hsecs.values():
            token = self.world.token_fingerprint(hsec)
            refresh = refresh_seconds(hsec)
            if token is None or refresh <= 0:
                continue
            rate += 1.0 / refresh
            source = (self.world.environment(hsec), token)
            sources[source] = min(refresh, sources.get(source, math.inf))
        self.quiet_sources.append((quiet, sources))
        self.hsec_rates.append(rate)
        self.converged_at = None if self.quiet_open else quiet.time

    def _recheck_quiet(self, rec: Watched) -> None:
        assert self.quiet is not None
        if rec.kind == "Secret":
            owner = self.world.targets.get(rec.key)
            touched = [owner] if owner is not None else []
        elif rec.kind == "HimitsuSecret":
            touched = [rec.key]
        else:
            return
        was_open = bool(self.quiet_open)
        for key in touched:
            if self.world.converged(key) is None:
                self.quiet_open.discard(key)
            else:
                self.quiet_open.add(key)
        if was_open and not self.quiet_open:
            self.converged_at = rec.time
        elif self.quiet_open:
            self.converged_at = None

    def _quiet_ends(self, quiet: Quiet) -> None:
        self.quiet = None
        unconverged = {k: why for k in self.world.hsecs()
                       if (why := self.world.converged(k)) is not None}
        self.found.convergence.append(
            math.inf if unconverged or self.converged_at is None
            else self.converged_at - quiet.time)
        for key, why in sorted(unconverged.items()):
            self.violation("not-converged", quiet.end, [f"{key[0]}/{key[1]}"],
                           f"{quiet.end - quiet.time:.0f} s into a quiet phase: {why}")

