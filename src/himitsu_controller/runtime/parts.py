"""The shapes of the runtime's parts, as protocols: the only methods called on each.

Why protocols: the manager is generic (it knows no resource, reconciler or Lease), and
its tests drive it with fakes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol


class Requester(Protocol):
    """The part of ``RestClient`` the Event recorder and the scrape authorizer use."""

    def request(self, method: str, path: str, *, body: Any = None,
                timeout: float = 30.0) -> dict[str, Any]: ...


class InformerLike(Protocol):
    @property
    def name(self) -> str: ...

    def run(self, stop: threading.Event) -> None: ...

    def has_synced(self) -> bool: ...

    def unhealthy_for(self) -> float: ...

    def stalled_for(self) -> float: ...


class ControllerLike(Protocol):
    @property
    def name(self) -> str: ...

    def start(self) -> None: ...

    def stop(self, drain_timeout: float = 30.0) -> bool: ...

    def workers_alive(self) -> bool: ...


class EventFlusher(Protocol):
    """The Event recorder: started before workers, flushed before the Lease release."""

    def start(self) -> None: ...

    def stop(self, timeout: float = ...) -> bool: ...


class LeaderElectorLike(Protocol):
    def run(self, stop: threading.Event) -> bool: ...


# (on_started_leading, on_stopped_leading) -> an elector wired to them.
LeaderElectionFactory = Callable[[Callable[[], None], Callable[[], None]], LeaderElectorLike]
