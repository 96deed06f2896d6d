"""What the soak's invariant checker reads: watch events, audit-log writes, the stand-in's
request log, the user's own acts, the faults injected, and texts to scan for leaks.

Each is a plain record with a wall-clock ``time`` (epoch seconds, this machine's clock,
which the apiserver's audit log also uses), so a recorded run can be replayed by the
checker offline (tests/unit/soak feeds it hand-made streams that break each rule).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Watched:
    """One watch event (ADDED, MODIFIED, DELETED) as a watcher of ours received it."""

    time: float
    kind: str  # Secret, HimitsuSecret, Deployment, Lease, Event
    type: str
    obj: Mapping[str, Any]

    @property
    def namespace(self) -> str:
        return str(self.obj.get("metadata", {}).get("namespace", ""))

    @property
    def name(self) -> str:
        return str(self.obj.get("metadata", {}).get("name", ""))

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    @property
    def rv(self) -> str:
        return str(self.obj.get("metadata", {}).get("resourceVersion", ""))


@dataclass(frozen=True)
class Written:
    """A successful write, from the apiserver's audit log."""

    time: float  # requestReceivedTimestamp
    user: str
    verb: str
    resource: str
    subresource: str
    namespace: str
    name: str


@dataclass(frozen=True)
class Polled:
    """A Himitsu API request, from the stand-in's request log."""

    time: float
    environment: str
    token: str  # the token's fingerprint
    status: int | None  # None: the connection was reset
    conditional: bool  # sent If-None-Match


@dataclass(frozen=True)
class Acted:
    """One act of the user driver. ``rv``: the resourceVersion its write produced;
    ``data``: an environment's whole data after a Himitsu change, ``version`` its
    configVersion."""

    time: float
    kind: str
    namespace: str = ""
    name: str = ""
    rv: str = ""
    environment: str = ""
    data: Mapping[str, str] | None = None
    version: int = 0


@dataclass(frozen=True)
class Injected:
    """A fault as it was carried out (wall-clock start and end)."""

    time: float
    end: float
    kind: str
    target: str


@dataclass(frozen=True)
class Quiet:
    """A quiet phase: no fault and no user change from ``time`` to ``end``."""

    time: float
    end: float


@dataclass(frozen=True)
class Text:
    """Something the operator said (a log file, a metrics scrape) to scan for leaks."""

    time: float
    source: str
    text: str


@dataclass(frozen=True)
class Violation:
    rule: str
    time: float
    objects: tuple[str, ...]
    detail: str
    faults: tuple[str, ...] = field(default=())


def secret_data(obj: Mapping[str, Any]) -> dict[str, str]:
    """A Secret's data, decoded (undecodable bytes replaced: only equality matters)."""
    return {k: base64.b64decode(v).decode("utf-8", "replace")
            for k, v in (obj.get("data") or {}).items()}


def annotations_of(obj: Mapping[str, Any]) -> dict[str, str]:
    return dict(obj.get("metadata", {}).get("annotations") or {})
