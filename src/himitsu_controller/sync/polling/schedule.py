"""When a HimitsuSecret polls next, and how old a shared answer it may take.

* A target never lags Himitsu by more than its refreshInterval (plus processing); a
  first sync or a repair holds Himitsu's data of seconds ago.
* Readers of one source share one request per round and meet again when they drift;
  polls of different sources are spread; failures back off, capped.
* Pure functions of times in epoch seconds.

Design: docs/design/polls.md
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
MIN_REQUEUE = 2 * DUE_SLACK  # a due poll's wait: "now", but never 0 (which means "forget")


def next_due(interval: float, *, answered: float, fraction: float) -> float | None:
    """An interval after the answer just used, less ``fraction`` of the 10% jitter (the
    shared answer's own draw, so its readers come back together); None for 0."""
    if interval <= 0:
        return None
    return answered + interval - fraction * JITTER * interval


def is_due(now: float, due: float | None) -> bool:
    return due is not None and now >= due - DUE_SLACK


def share_window(
    interval: float, *, now: float, due: float | None, answered: float | None, intact: bool,
    revalidate: float | None = None,
) -> float:
    """How old an answer shared with other readers of the source may be (seconds).

    Data the target does not hold (``intact`` False): ``FRESH``. A timed poll: half an
    interval, plus its lateness, never 90% of one. Not due: any answer as recent as the
    target's. ``revalidate``: only one asked for since then (docs/design/polls.md).
    """
    if revalidate is not None:
        since = max(0.0, now - revalidate)
        return since if intact else min(since, FRESH)
    if not intact:
        return FRESH
    window = SHARE * interval
    if due is not None and is_due(now, due):
        return max(0.0, min(window + max(0.0, now - due), (1 - JITTER) * interval - MIN_REQUEUE))
    if answered is not None and (due is not None or interval <= 0):
        return max(window, now - answered)
    return window


def requeue_delay(now: float, due: float) -> float:
    """How long to wait for a poll due at ``due``: one past is "now", never "no poll"
    (a delay of 0 is what controller-runtime reads as forget)."""
    return max(MIN_REQUEUE, due - now)


def within_interval(now: float, due: float, interval: float) -> float:
    """``due``, pulled back to ``now`` + refreshInterval if it is further ahead: the wall
    clock stepped back (NTP), which a poll must not wait out."""
    return min(due, now + interval) if interval > 0 else due


def lag(now: float, answered: float | None, interval: float) -> float:
    """Seconds past ``answered`` + refreshInterval (0 within it, with nothing synced yet,
    or at refreshInterval 0: nothing is due)."""
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


def recheck(interval: float, wait: float) -> float:
    """When to read a refused token's Secret again: within ``TOKEN_RECHECK`` (and the
    interval), or when Himitsu may be asked again if that comes first."""
    return max(0.1, min(wait, TOKEN_RECHECK, interval if interval > 0 else float("inf")))
