"""The reconcile's view of one HimitsuSecret for one pass: its key, object, owner, status."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from himitsu_controller import api
from himitsu_controller.sync.target import targets

__all__ = ["Context"]


@dataclass(frozen=True)
class Context:
    key: str
    obj: dict[str, Any]
    owner: targets.Owner
    generation: int
    status: api.Status
