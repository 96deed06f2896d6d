"""The idempotent reconcile of one HimitsuSecret, in four named phases of ``_sync``:

* inputs: the token and the target (or a wake with nothing to do);
* answer: Himitsu's (a fetch, or a 304), or the target's own for a wake not yet due;
* apply: write the answer, or confirm the target holds it;
* record: status, memory (``Memory``'s methods are its only writers), the next wake.

Kubernetes only through ``sync.ports.Kube``, Himitsu only through ``Fetcher``. No failure
ever empties or shrinks a target: failures raise before any write.
"""

from __future__ import annotations

import random
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, NoReturn

import structlog

from himitsu_controller import api, himitsu, metrics
from himitsu_controller.runtime.controller import Result
from himitsu_controller.sync import allowlist, wakes
from himitsu_controller.sync.context import Context
from himitsu_controller.sync.memory import Memory, resource_version
from himitsu_controller.sync.polling import lag, polls, schedule
from himitsu_controller.sync.ports import Conflict, Fetcher, Kube, KubeError
from himitsu_controller.sync.restarts import rule as restarts
from himitsu_controller.sync.status import StatusWriter
from himitsu_controller.sync.target import render, retire, targets, writes
from himitsu_controller.sync.tokens import TokenError, TokenNotAllowed, TokenReader

log = structlog.get_logger(__name__)

CONFLICT_REQUEUE = 0.5
RACES_REPORTED = 5  # lost write races in a row before Ready says so


class _Failure(Exception):
    """``message`` goes to Ready; ``request_id`` (Himitsu's, new on every attempt) only to
    the log and the Event of a transition, so a failure that repeats rewrites nothing."""

    def __init__(self, reason: str, message: str, *, retry_after: float | None = None,
                 request_id: str | None = None) -> None:
        super().__init__(message)
        self.reason, self.message = reason, message
        self.retry_after, self.request_id = retry_after, request_id


class _Requeue(Exception):
    """Try again after ``delay``, reporting nothing: a lost write race, or our own pacing."""

    def __init__(self, delay: float = CONFLICT_REQUEUE, *, paced: bool = False) -> None:
        super().__init__()
        self.delay, self.paced = delay, paced


@dataclass(frozen=True)
class _Inputs:
    token: str = field(repr=False)
    source: str  # the poller's source (token hash included)
    target: dict[str, Any] | None = field(repr=False)
    forced: bool  # a user's force-sync (asks Himitsu itself, reads the token afresh)
    moved: bool  # the spec names another source than memory last read
    began: float
    held: bool  # the target holds our data (its metadata may still need a repair)
    intact: bool  # ... and from this very source: a conditional request is safe
    consistent: bool  # ... and every stamp: nothing to put back


@dataclass(frozen=True)
class _Answer:
    result: himitsu.FetchResult = field(repr=False)
    retry: float | None  # written from memory: ask Himitsu again after this long
    limited: bool  # ... because Himitsu rate-limited the source (a 429, our pacing)
    restamp: tuple[dict[str, Any], dict[str, str]] | None = field(repr=False)
    quiet: bool  # a wake before the poll was due: nothing was asked
    polled: float
    answered: float  # when Himitsu gave it
    late: float  # a timed poll's lag behind its promise


class HimitsuSecretReconciler:
    def __init__(
        self, kube: Kube, fetcher: Fetcher, *, allowed_api_urls: Sequence[str] = (),
        allow_insecure_http: bool = False,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
        rng: Callable[[], float] = random.random,
    ) -> None:
        self._kube = kube
        self._tokens = TokenReader(kube)
        self._fetcher = fetcher
        self._allowed = allowlist.AllowList(
            allowed_api_urls, allow_insecure_http=allow_insecure_http)
        self._now = now
        self._rng = rng
        self._status = StatusWriter(kube, now=now)
        self._memory: dict[str, Memory] = {}
        self._lock = threading.Lock()
        self._restarts = restarts.Restarts(kube, self._status, now=self._clock)
        metrics.report_lag(self.lag)

    def reconcile(self, key: str) -> Result:
        namespace, _, name = key.partition("/")
        obj = self._kube.get_himitsu_secret(namespace, name)
        if obj is None or (obj.get("metadata") or {}).get("deletionTimestamp"):
            self._forget(key)
            return Result()
        meta = obj["metadata"]
        ctx = Context(
            key=key, obj=obj, generation=int(meta.get("generation") or 0),
            owner=targets.Owner(namespace=namespace, name=name, uid=str(meta.get("uid", ""))),
            status=self._status.effective(key, obj),
        )
        spec: api.Spec | None = None
        try:
            spec = api.parse_spec(obj)
            # First: a URL outside the allow-list costs no token read.
            api_url = self._allowed.check(spec.api_url)
            result = self._sync(ctx, spec, api_url)
        except api.InvalidSpec as exc:
            return self._failed(ctx, spec, _Failure("InvalidSpec", str(exc)))
        except allowlist.NotAllowed as exc:
            result = self._failed(ctx, spec, _Failure("InvalidSpec", str(exc)))
        except _Failure as failure:
            result = self._failed(ctx, spec, failure)
        except _Requeue as requeue:
            if requeue.paced and spec is not None:
                self._note_overdue(ctx, spec)
            result = Result(requeue_after=requeue.delay)
        except KubeError as exc:  # a read of the target or a status patch was refused
            result = self._failed(ctx, spec, _Failure("WriteFailure", str(exc)))
        # Whatever the sync did, the workloads owed a restart get it when due.
        return self._restarts.after(ctx, spec, self._remember(ctx), result) \
            if spec is not None else result

    # -- the happy path: inputs, answer, apply, record ---------------------------------

    def _sync(self, ctx: Context, spec: api.Spec, api_url: str) -> Result:
        mem = self._remember(ctx)
        inputs = self._inputs(ctx, spec, mem, api_url)
        if isinstance(inputs, Result):  # a wake with nothing to do
            return inputs
        answer = self._answer(ctx, spec, mem, inputs, api_url)
        data_changed, count = self._apply(ctx, spec, mem, inputs, answer)
        return self._record(ctx, spec, mem, answer, data_changed=data_changed, count=count)

    def _inputs(self, ctx: Context, spec: api.Spec, mem: Memory,
                api_url: str) -> _Inputs | Result:
        """The token and the target, and what the target holds; or the Result of a wake
        that needs neither (after a restart, or woken with nothing to do)."""
        lag.first_sight(mem, last_sync_time=ctx.status.last_sync_time,
                        interval=spec.refresh_interval, in_step=wakes.in_step(ctx))
        moved = self._follow_spec(ctx, spec, mem, api_url)
        deferred = wakes.defer_after_restart(self._kube, ctx, spec, mem, now=self._clock())
        if deferred is not None:
            return deferred
        idle = wakes.woken_idle(self._kube, ctx, spec, mem, now=self._clock())
        if idle is not None:
            return idle
        forced = api.force_sync_value(ctx.obj) != ctx.status.last_force_sync
        if forced:  # a narrowed binding or a replaced token counts at once
            self._tokens.forget(ctx.owner.namespace, spec.auth_secret_name,
                                spec.auth_secret_key)
        began = self._clock()
        token, source = self._source(ctx, spec, mem, api_url, forced=forced, now=began)
        target = wakes.read_target(self._kube, ctx, spec, mem)
        self._check_ownership(ctx, spec, target)
        held = targets.holds_data(  # its metadata may still need a repair
            target, owner=ctx.owner, spec=spec, version=ctx.status.config_version)
        consistent = held and targets.holds_stamps(target, owner=ctx.owner, spec=spec)
        # Another token is another poller source (the target's stamp has no token hash).
        return _Inputs(token=token, source=source, target=target, forced=forced,
                       moved=moved, began=began, held=held,
                       intact=held and mem.source in (None, source), consistent=consistent)

    def _check_ownership(self, ctx: Context, spec: api.Spec,
                         target: Mapping[str, Any] | None) -> None:
        def claims(holder: str) -> bool:  # one whose target.name moved on holds it no more
            obj = self._kube.get_himitsu_secret(ctx.owner.namespace, holder)
            return obj is not None and (
                (obj.get("spec") or {}).get("target") or {}).get("name") == spec.target.name
        try:
            targets.check_ownership(target, owner=ctx.owner, policy=spec.target.creation_policy,
                                    himitsu_secret_exists=claims)
        except targets.TargetConflict as exc:
            raise _Failure("TargetConflict", str(exc)) from None

    def _answer(self, ctx: Context, spec: api.Spec, mem: Memory, inputs: _Inputs,
                api_url: str) -> _Answer:
        """Himitsu's answer (or a 304), or the one the target holds for a wake before the
        poll is due (a foreign annotation or Merge key, a spec edit keeping the source)."""
        held = wakes.held_answer(self._kube, ctx, spec, mem, inputs.target, now=inputs.began,
                                 consistent=inputs.consistent) \
            if inputs.held and not (inputs.forced or inputs.moved) else None  # a replaced
        # token (same spec) is sent by the next poll due (docs/syncing.md), not by this wake
        # If-None-Match only for a target holding what the status says, for this spec (a
        # 304 puts back stamps lost around that data: a restart knows no more than that).
        known = ctx.status.config_version if inputs.intact and not inputs.forced \
            and ctx.status.observed_generation == ctx.generation else None
        result, retry, limited = (held[0], None, False) if held is not None else self._fetch(
            ctx, spec, inputs.token, known, api_url=api_url, fingerprint=inputs.source,
            max_age=0.0 if inputs.forced else schedule.share_window(
                spec.refresh_interval, now=self._clock(), due=mem.due, answered=mem.answered,
                intact=inputs.intact, revalidate=mem.revalidate),
            floor=ctx.status.config_version if inputs.held else None, fallback=not inputs.intact)
        restamp = held[1] if held is not None else None
        if held is None and isinstance(result, himitsu.NotModified) and not inputs.consistent:
            try:
                restamp = wakes.restamp(self._kube, ctx, spec, inputs.target)
            except writes.Raced as exc:  # changed since it was read: decided afresh
                self._lost_race(spec, mem, exc)
            if restamp is None:
                raise _Requeue()
        polled = self._clock()
        answered = polled - result.age
        # Written from an answer older than this reconcile: one revalidation soon.
        mem.asked(inputs.source, began=inputs.began, answered=answered,
                  stale=retry is not None or (held is None and not inputs.intact
                                              and answered < inputs.began))
        # Lateness is a timed poll's only, against the interval it was due under.
        timed = schedule.is_due(polled, mem.due)
        if timed:
            metrics.observe_lateness(polled - (mem.due or polled))
        return _Answer(result=result, retry=retry, limited=limited,
                       restamp=restamp,
                       quiet=held is not None, polled=polled, answered=answered,
                       late=schedule.lag(polled, mem.answered, mem.interval) if timed else 0.0)

    def _apply(self, ctx: Context, spec: api.Spec, mem: Memory, inputs: _Inputs,
               answer: _Answer) -> tuple[bool, int | None]:
        """Write the answer, or confirm that the target holds it: whether the data changed,
        and how many keys it holds."""
        result = answer.result
        if answer.restamp is not None:  # the stamps back, the data as the target holds it
            target, rendered = answer.restamp
            if not answer.quiet:  # a poll answered 304
                metrics.count_sync("not_modified")
            return self._write(ctx, spec, mem, target=target, rendered=rendered,
                               version=result.version), ctx.status.secret_count
        if isinstance(result, himitsu.NotModified):
            # What the workloads' records are compared with.
            mem.target_holds(targets.annotations_of(
                inputs.target if spec.rollout.targets else None), since=None)
            if not answer.quiet:  # a poll; a quiet wake asked nothing
                metrics.count_sync("not_modified")
            return False, ctx.status.secret_count
        tpl = spec.target.template
        try:
            rendered = render.render(tpl.format, result.secrets, key=tpl.data_key)
            data_changed = self._write(ctx, spec, mem, target=inputs.target, rendered=rendered,
                                       version=result.version)
        except (_Failure, render.RenderError) as exc:
            failure = exc if isinstance(exc, _Failure) else _Failure("InvalidSpec", str(exc))
            # Judged on memory's answer while Himitsu rate-limited the source: tried again
            # when Himitsu may be asked (a 5xx keeps the backoff: one layer owns retries).
            if answer.limited and answer.retry is not None:
                failure.retry_after = min(failure.retry_after or answer.retry, answer.retry)
            raise failure from None
        metrics.count_sync("written" if data_changed else "unchanged")
        return data_changed, len(result.secrets)

    def _record(self, ctx: Context, spec: api.Spec, mem: Memory, answer: _Answer, *,
                data_changed: bool, count: int | None) -> Result:
        """Status (an earlier target released first), memory, and the next wake."""
        try:  # the target holds our data now: an earlier one (target.name changed) goes
            retire.old_targets(self._kube, ctx.obj, owner=ctx.owner, spec=spec)
        except Conflict:
            raise _Requeue() from None
        except KubeError as exc:
            raise _Failure("WriteFailure", f"releasing an earlier target: {exc}") from None
        self._status.synced(  # a KubeError is reconcile's WriteFailure
            ctx.key, ctx.obj, version=answer.result.version, secret_count=count or 0,
            generation=ctx.generation, force_sync=api.force_sync_value(ctx.obj),
            data_changed=data_changed, target=spec.target.name, late=answer.late,
            answered_at=datetime.fromtimestamp(answer.answered, UTC), interval=mem.interval)
        mem.synced(answered=answer.answered, interval=spec.refresh_interval,
                   due=self._next_due(spec, mem, answer))
        return wakes.until_due(mem, now=self._clock())

    def _next_due(self, spec: api.Spec, mem: Memory, answer: _Answer) -> float | None:
        """The next poll: an interval after the answer held (a quiet wake keeps the one
        scheduled, if one is), sooner when that answer must be revalidated."""
        due = mem.due
        if not answer.quiet or due is None or mem.interval != spec.refresh_interval:
            due = schedule.next_due(
                spec.refresh_interval, answered=answer.answered,
                fraction=self._rng() if answer.result.jitter is None else answer.result.jitter)
        if mem.revalidate is not None:
            soon = answer.polled + answer.retry if answer.retry is not None \
                else answer.answered + schedule.FRESH
            due = soon if due is None else min(due, soon)
        return due

    def _source(self, ctx: Context, spec: api.Spec, mem: Memory, api_url: str, *,
                forced: bool, now: float) -> tuple[str, str]:
        """The token and the poller's source it reads. While Himitsu refuses that token,
        its Secret is read often (a replacement counts within seconds), Himitsu rarely:
        the same token again is a quiet wait until its backoff ends (Ready says why)."""
        try:
            token = self._tokens.read(
                ctx.owner.namespace, spec.auth_secret_name, spec.auth_secret_key,
                api_url=api_url, max_age=schedule.TOKEN_RECHECK if mem.refused else None)
        except TokenNotAllowed as exc:
            raise _Failure("InvalidSpec", str(exc)) from None
        except TokenError as exc:
            raise _Failure("AuthenticationFailure", str(exc)) from None
        # One string for every reader of a source, not one per HimitsuSecret's memory.
        source = sys.intern(himitsu.source_fingerprint(
            api_url, spec.project_id, spec.environment_id, token))
        if mem.refused == source and not forced and mem.refused_until > now:
            raise _Requeue(schedule.recheck(spec.refresh_interval, mem.refused_until - now))
        return token, source

    def _follow_spec(self, ctx: Context, spec: api.Spec, mem: Memory, api_url: str) -> bool:
        """Memory follows the spec, even if this reconcile fails before it reads anything:
        True when it names another source (Himitsu is asked whether that token reads it)."""
        reads = (api_url, spec.project_id, spec.environment_id, spec.auth_secret_name,
                 spec.auth_secret_key)
        if mem.reads != reads:
            self._fetcher.release(ctx.key)
            # First seen here: moved if the spec changed since the status was written.
            moved = mem.reads is not None or ctx.status.observed_generation != ctx.generation
            # Interned: parsing makes new strings, which memory would keep per object.
            mem.follow(tuple(sys.intern(part) for part in reads))
            return moved
        return False

    def _fetch(
        self, ctx: Context, spec: api.Spec, token: str, known: int | None, *,
        max_age: float, api_url: str, floor: int | None, fallback: bool, fingerprint: str,
    ) -> tuple[himitsu.FetchResult, float | None, bool]:
        """Himitsu's answer, None and False; or, for a write that cannot wait (``fallback``:
        a first sync, a repair) while Himitsu cannot be asked, the secrets the poller holds
        for this very source, when to ask again, and whether Himitsu rate-limited it.
        ``floor``: the version the target holds; an older answer is never written."""
        source = {"api_url": api_url, "project_id": spec.project_id,
                  "environment_id": spec.environment_id, "token": token}
        try:
            result = self._fetcher.fetch(
                **source, known_version=known, max_age=max_age, reader=ctx.key)
            if floor is not None and result.version < floor and result.age > 0:
                result = self._fetcher.fetch(
                    **source, known_version=known, max_age=0.0, reader=ctx.key)
        except (himitsu.RateLimited, himitsu.ServerError, himitsu.TransportError) as exc:
            remembered = self._fetcher.remembered(**source) if fallback else None
            if remembered is not None and (floor is None or remembered.version >= floor):
                delay = float(exc.retry_after) if isinstance(exc, himitsu.RateLimited) else 0.0
                log.info("written from memory, Himitsu to be asked again", key=ctx.key,
                         error=type(exc).__name__)
                return remembered, max(1.0, delay), isinstance(exc, himitsu.RateLimited)
            self._fetch_failed(ctx, spec, exc, fingerprint)
        except himitsu.HimitsuError as exc:
            self._fetch_failed(ctx, spec, exc, fingerprint)
        if isinstance(result, himitsu.NotModified) and known is None:
            raise _Failure("FetchFailure",
                           "the Himitsu API answered 304 to an unconditional request")
        return result, None, False

    def _fetch_failed(self, ctx: Context, spec: api.Spec, exc: Exception,
                      fingerprint: str) -> NoReturn:
        if isinstance(exc, polls.LocallyRateLimited):  # not sent: a quiet wait
            raise _Requeue(max(0.5, exc.retry_after), paced=True) from None
        request_id = exc.request_id if isinstance(exc, himitsu.HimitsuError) else None
        message = exc.gist if isinstance(exc, himitsu.HimitsuError) else str(exc)
        if isinstance(exc, (himitsu.Unauthorized, himitsu.Forbidden)):
            self._tokens.forget(ctx.owner.namespace, spec.auth_secret_name, spec.auth_secret_key)
            wait = self._remember(ctx).refused_by(fingerprint, now=self._clock(),
                                                  backoff=schedule.auth_backoff)
            raise _Failure("AuthenticationFailure", message, request_id=request_id,
                           retry_after=schedule.recheck(spec.refresh_interval, wait)) from None
        if isinstance(exc, (himitsu.BadRequest, himitsu.InvalidInput)):
            raise _Failure("InvalidSpec", message, request_id=request_id) from None
        if isinstance(exc, himitsu.RateLimited):  # this reconcile's own request got the 429
            delay = max(1.0, float(exc.retry_after))
            raise _Failure("FetchFailure", (
                f"rate limited by the Himitsu API, retrying in {round(delay)} s"
            ), retry_after=delay, request_id=request_id) from None
        raise _Failure("FetchFailure", message, request_id=request_id) from None

    def _write(
        self, ctx: Context, spec: api.Spec, mem: Memory, *, target: dict[str, Any] | None,
        rendered: dict[str, str], version: int,
    ) -> bool:
        digest, before = render.data_hash(rendered), targets.annotations_of(target)
        # A target gone that this process never saw (it started since): when its data
        # arrived is not known, so a restart owed for it is due at once.
        unknown = target is None and mem.data_id is None and ctx.status.config_version is not None
        data_id = mem.id_for(before, digest)
        try:
            if spec.rollout.targets and digest != before.get(api.ANN_DATA_HASH):
                self._restarts.before_change(ctx, spec, target, mem)  # what pods have, first
            done = writes.write(self._kube, owner=ctx.owner, spec=spec, target=target,
                                rendered=rendered, version=version, data_id=data_id)
        except writes.Refused as exc:
            raise _Failure(exc.reason, exc.message) from None
        except writes.Raced as exc:
            self._lost_race(spec, mem, exc)
        except KubeError as exc:
            mem.target_unknown(data_id, at=self._clock())  # the write may have landed
            raise _Failure("WriteFailure", str(exc)) from None
        if spec.rollout.targets:
            mem.target_holds(targets.annotations_of(done.secret), since=None if unknown or
                             data_id == before.get(api.ANN_DATA_ID) else self._clock())
        mem.wrote(resource_version(done.secret), sent=done.wrote)
        return done.data_changed

    def _lost_race(self, spec: api.Spec, mem: Memory, exc: writes.Raced) -> NoReturn:
        # What a direct read showed, if one did: the next reconcile reads it afresh.
        races = mem.lost_race(exc.seen, creating=exc.creating)
        if races >= RACES_REPORTED:  # now _failed's backoff paces the retries
            raise _Failure("WriteFailure", (
                f"Secret {spec.target.name!r} changed under each of the last "
                f"{races} writes (someone else writes, deletes or recreates it); "
                "retrying with backoff")) from None
        raise _Requeue(CONFLICT_REQUEUE * 2 ** (races - 1)) from None

    def _failed(self, ctx: Context, spec: api.Spec | None, failure: _Failure) -> Result:
        mem = self._remember(ctx)
        mem.failed()
        metrics.count_sync("failed", failure.reason)
        log.info("sync failed", key=ctx.key, reason=failure.reason, message=failure.message,
                 request_id=failure.request_id)
        try:
            self._status.failed(ctx.key, ctx.obj, reason=failure.reason, message=failure.message,
                                generation=ctx.generation, request_id=failure.request_id)
        except KubeError as exc:
            log.warning("status update failed", key=ctx.key, error=str(exc))
        interval = spec.refresh_interval if spec is not None else 0.0
        delay = failure.retry_after or schedule.backoff(mem.failures, interval)
        return Result(requeue_after=delay, error=failure.reason)

    def _note_overdue(self, ctx: Context, spec: api.Spec) -> None:
        """A poll held back by pacing over an interval past its promise (``mem.interval``'s,
        not a refreshInterval edited since): Ready's message says so, in one patch."""
        mem = self._remember(ctx)
        now, interval = self._clock(), mem.interval
        if schedule.lag(now, mem.answered, interval) <= interval:
            return
        try:
            self._status.overdue(ctx.key, ctx.obj, target=spec.target.name,
                                 interval=interval, generation=ctx.generation)
        except KubeError as exc:
            log.warning("status update failed", key=ctx.key, error=str(exc))

    def _clock(self) -> float:
        return self._now().timestamp()

    def lag(self) -> tuple[float, int, float]:
        """``sync.polling.lag.worst`` over every HimitsuSecret in the cache."""
        with self._lock:
            memory = dict(self._memory)
        return lag.worst(self._clock(), self._kube.list_himitsu_secrets(), memory)

    def _remember(self, ctx: Context) -> Memory:
        with self._lock:
            mem = self._memory.get(ctx.key)
            if mem is None or mem.uid != ctx.owner.uid:
                mem = self._memory[ctx.key] = Memory(uid=ctx.owner.uid)
            return mem

    def _forget(self, key: str) -> None:
        with self._lock:
            self._memory.pop(key, None)
        self._status.forget(key)
        self._restarts.forget(*key.partition("/")[::2])
        self._fetcher.release(key)  # the shared poller drops a source nobody reads any more
