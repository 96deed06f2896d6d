"""One budget for the whole shutdown: every step bounded, the total within one timeout.

* The kubelet SIGKILLs terminationGracePeriodSeconds after SIGTERM: steps that each wait
  "a bit" would add up past it. The drain gets what a reserve for later steps leaves.
* A step not done in its share is recorded unfinished; its daemon threads die with us.

Design: docs/design/manager.md
"""

from __future__ import annotations

import math
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from threading import Thread
from types import FrameType


@dataclass(frozen=True)
class Step:
    """What one step of a shutdown was given and whether it finished within it."""

    name: str
    allowed: float
    finished: bool


class Budget:
    """``total`` seconds from now, handed out step by step."""

    def __init__(self, total: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.total = max(0.0, total)
        self._clock = clock
        self._deadline = clock() + self.total
        self.steps: list[Step] = []

    def run(self, name: str, step: Callable[[float], bool], *, cap: float | None = None,
            keep: float = 0.0) -> bool:
        """Run ``step(seconds)`` with at most ``cap`` seconds, leaving ``keep`` for later
        steps; True when it finished in time."""
        allowed = min(max(0.0, self._deadline - self._clock() - keep),
                      math.inf if cap is None else cap)
        finished = step(allowed)
        self.steps.append(Step(name, allowed, finished))
        return finished

    @property
    def allowed(self) -> float:
        """The seconds handed out so far, all steps together."""
        return sum(step.allowed for step in self.steps)


def join_all(threads: Iterable[Thread], seconds: float) -> bool:
    """Join every thread within ``seconds`` in all; True when none is left alive."""
    deadline = time.monotonic() + seconds
    pending = list(threads)
    for thread in pending:
        thread.join(max(0.0, deadline - time.monotonic()))
    return not any(thread.is_alive() for thread in pending)


class StopSignals:
    """SIGTERM/SIGINT call ``on_first`` once; a second one exits at once (a stuck stop)."""

    def __init__(self, on_first: Callable[[], None]) -> None:
        self._on_first = on_first
        self.received: str | None = None  # the first signal's name

    def install(self) -> Callable[[], None]:
        """Install the handlers (main thread only); returns what puts the old ones back."""
        if threading.current_thread() is not threading.main_thread():
            return lambda: None
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

        def handle(signum: int, frame: FrameType | None) -> None:
            if self.received is not None:
                os.write(2, b"second signal received, exiting immediately\n")
                os._exit(1)
            self.received = signal.Signals(signum).name
            # Event.set takes a lock the interrupted main thread may hold: act from a
            # fresh thread rather than risk a self-deadlock inside the handler.
            threading.Thread(target=self._on_first, name="signal-stop", daemon=True).start()

        for sig in previous:
            signal.signal(sig, handle)

        def restore() -> None:
            for sig, handler in previous.items():
                signal.signal(sig, handler if handler is not None else signal.SIG_DFL)

        return restore
