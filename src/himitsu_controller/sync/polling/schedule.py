"""When a HimitsuSecret polls next, and how old a shared answer it may take.

The promises these numbers keep: a target never lags Himitsu by more than its
refreshInterval (plus processing); a first sync or a repair holds Himitsu's data of
seconds ago (a remembered answer only while Himitsu refuses, revalidated soon);
readers of one source (see ``polls``) share one request per round and, when their
polls have drifted apart, meet on one answer again; polls
of different sources are spread, not bunched; a failure backs off without ever waiting
longer than the interval (capped at 5 minutes). Pure functions of times in epoch seconds,
so the reconciler's timing can be read (and tested) in one place.
"""

from __future__ import annotations

MAX_FAILURE_BACKOFF = 300.0
# A token Himitsu refused (401/403) is sent again at most this rarely while its Secret
# still holds it (each refusal is an auth.login_failed audit row in Himitsu)...
MAX_AUTH_BACKOFF = 1800.0
TOKEN_RECHECK = 10.0  # ...and its Secret is read this often for a replacement (seconds)
JITTER = 0.1  # a poll comes up to 10% of the interval early, never late
SHARE = 0.5  # a poll may take another reader's answer up to half an interval old
DUE_SLACK = 0.05  # a wake this close to the poll's due time is the poll
FRESH = 2.0  # a first sync or a repair takes an answer at most this old (seconds)
# The shortest wait a poll that is due (or overdue) gets: "now", as a positive delay, so
# the work queue never reads it as "forget" (see ``requeue_delay``).
MIN_REQUEUE = 2 * DUE_SLACK


def next_due(interval: float, *, answered: float, fraction: float) -> float | None:
    """When the next poll is due: up to 10% early (``fraction`` of the jitter window),
    never late, counted from the moment Himitsu gave the answer just used, not from the
    end of the reconcile. None for refreshInterval 0 (sync once).

    So HimitsuSecrets sharing one answer come back together and share the next one too,
    however long their status patches queued behind each other (under load that spread
    them over seconds, past the sharing window). ``fraction`` should be the shared
    answer's own draw (one per request), for the same reason: a draw per HimitsuSecret
    would spread a group over the whole 10% window.
    """
    if interval <= 0:
        return None
    return answered + interval - fraction * JITTER * interval


def is_due(now: float, due: float | None) -> bool:
    return due is not None and now >= due - DUE_SLACK


def share_window(
    interval: float, *, now: float, due: float | None, answered: float | None, intact: bool,
) -> float:
    """How old an answer shared with other readers of the source may be (seconds).

    A reconcile that must write data the target does not hold (a first sync, a deleted
    or edited target, a spec now pointing at another source: ``intact`` False) takes
    Himitsu's current data: an answer at most ``FRESH`` seconds old, which readers created
    or repaired together share, else the poller revalidates (a conditional request at the
    version it holds: a 304 rebuilds from memory with no secret material on the wire, a
    200 brings the change). Without that a Secret created, or deleted to pick up a change,
    right after a change in Himitsu held the old value for up to half an interval.

    A timed poll takes one from the last half interval, plus however late the poll runs,
    but never one 90% of an interval old. Its next poll is then due an interval after
    that answer, so the target never lags Himitsu by more than refreshInterval, that next
    poll is always ahead (an older answer would leave it due at once); and its own last
    answer, at least 90% of an interval old, is never taken again. The half interval lets
    readers of a source whose polls drifted apart (a restart, a backlog in the queue, a
    split group) meet on one answer again instead of each asking Himitsu, exactly when
    the operator can least afford it. A reconcile before the poll is due with the target's
    data intact (a spec edit that keeps the source, such as a Helm upgrade touching every
    HimitsuSecret, or a label a GitOps tool pruned) needs the secrets, not news: any
    answer at least as recent as the one the target holds (``answered``) is as current
    as the target was meant to be, so it asks Himitsu nothing per object (once per
    object met the 300/min per-client limit).
    """
    if not intact:
        return FRESH
    window = SHARE * interval
    if due is not None and is_due(now, due):
        # A late poll takes the round's answer too, but never one so old that its next
        # poll would be due already (at least 90% of an interval after the answer): such
        # an answer costs a second poll at once, so the first may as well ask Himitsu.
        return max(0.0, min(window + max(0.0, now - due), (1 - JITTER) * interval - MIN_REQUEUE))
    if answered is not None and (due is not None or interval <= 0):
        # Not due (refreshInterval 0 never is): any answer as recent as the target's.
        return max(window, now - answered)
    return window


def requeue_delay(now: float, due: float) -> float:
    """How long to wait for a poll due at ``due``: a due time in the past means "poll
    now", never "no poll" (a delay of 0 is what controller-runtime reads as forget)."""
    return max(MIN_REQUEUE, due - now)


def within_interval(now: float, due: float, interval: float) -> float:
    """``due``, pulled back to ``now`` + refreshInterval if it is further ahead.

    Due times are on the wall clock (they count from Himitsu's answers and lastSyncTime),
    the work queue's waits on the monotonic one. No poll is ever scheduled further ahead
    than an interval (``next_due`` counts from an answer already given), so a due time
    beyond that means the clock was stepped back (NTP): without this bound, the poll would
    wait out the step too, an hour's step parking it for an hour past refreshInterval.
    """
    return min(due, now + interval) if interval > 0 else due


def lag(now: float, answered: float | None, interval: float) -> float:
    """How far a target is behind its promise: seconds past ``answered`` +
    refreshInterval (the latest moment its data may date from), 0 while within it.
    0 too with nothing synced yet or refreshInterval 0 (sync once: nothing is due)."""
    if answered is None or interval <= 0:
        return 0.0
    return max(0.0, now - answered - interval)


def backoff(failures: int, interval: float) -> float:
    """Exponential from 1 s, capped at min(refreshInterval, 5 min) but at least 1 s."""
    cap = min(interval, MAX_FAILURE_BACKOFF) if interval > 0 else MAX_FAILURE_BACKOFF
    return float(min(2.0 ** min(failures - 1, 30), max(cap, 1.0)))


def auth_backoff(refusals: int) -> float:
    """How long a token Himitsu refused ``refusals`` times in a row is not sent again
    while its Secret holds it: 1 s doubling to 30 min, whatever refreshInterval."""
    return float(min(2.0 ** min(refusals - 1, 30), MAX_AUTH_BACKOFF))
