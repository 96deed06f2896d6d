"""What the reconcile needs from the outside world, and the errors it may get back.

``Kube`` is implemented by ``himitsu_controller.kube`` (the adapter) and by the unit tests'
fakes; ``Fetcher`` by ``sync.polling.polls.SharedPoller``. So every rule in ``sync/`` is
proven without a cluster.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from himitsu_controller import himitsu

__all__ = [
    "Conflict", "Fetcher", "Kube", "KubeError", "SecretNotFound", "SecretValue", "Workloads",
]


class KubeError(Exception):
    """A Kubernetes write or read failed; ``str()`` is safe to show (no object data)."""

    def __init__(self, message: str, *, status: int = 0, reason: str = "") -> None:
        super().__init__(message)
        self.status, self.reason = status, reason


class Conflict(KubeError):
    """409: someone else wrote first; the reconcile is simply retried."""


class SecretNotFound(Exception):
    """The Secret named by authSecretRef does not exist."""


@dataclass(frozen=True, slots=True)
class SecretValue:
    """One key of a Secret (None: no such key), with its ``allowed-api-urls`` (None: absent)."""

    value: bytes | None = field(repr=False)  # a token: never in a repr
    allowed_api_urls: str | None = None


class Workloads(Protocol):
    """The apps/v1 workloads a HimitsuSecret restarts (``sync.restarts``): kind is
    Deployment, StatefulSet or DaemonSet, in the HimitsuSecret's namespace."""

    def get_workload(self, namespace: str, kind: str, name: str) -> dict[str, Any] | None:
        """The workload read directly (None: not found); KubeError when refused."""
    def patch_workload(
        self, namespace: str, kind: str, name: str, *, resource_version: str,
        annotations: Mapping[str, str], template: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """The workload once one strategic merge patch set these ``metadata.annotations``
        and ``template``'s in ``spec.template.metadata.annotations`` (a restart, as
        ``kubectl rollout restart``), applied only to ``resource_version``: Conflict when
        the workload changed since, KubeError when refused or not found."""


class Kube(Workloads, Protocol):
    def get_himitsu_secret(self, namespace: str, name: str) -> dict[str, Any] | None: ...
    def list_himitsu_secrets(self) -> list[dict[str, Any]]:
        """Every HimitsuSecret in the informer's cache (its own objects: read only)."""
    def get_secret(
        self, namespace: str, name: str, *, fresh: bool = False, cached: bool = False,
    ) -> dict[str, Any] | None: ...
    def secrets_owned_by(self, namespace: str, uid: str) -> list[dict[str, Any]]:
        """The labelled Secrets of ``namespace`` the informer holds that carry the
        HimitsuSecret ``uid``'s stamps or controller reference (cached copies)."""
    def read_secret_value(
        self, namespace: str, name: str, key: str, *, for_url: str | None = None,
        max_age: float | None = None,
    ) -> SecretValue:
        """May be cached (no longer than ``max_age`` seconds when given); read afresh
        before the value first goes to ``for_url``."""
    def forget_secret_value(self, namespace: str, name: str, key: str) -> None: ...
    def create_secret(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]: ...
    def dry_run_create_secret(self, namespace: str, body: dict[str, Any]) -> None:
        """Raise KubeError when the apiserver would refuse to create ``body`` were its
        name free; nothing is stored."""
    def update_secret(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]: ...
    def delete_secret(self, namespace: str, name: str, *, uid: str,
                      resource_version: str | None = None) -> None:
        """Delete with a uid precondition (and ``resource_version``: unchanged since
        read); Conflict when a precondition fails."""
    def patch_status(self, namespace: str, name: str, status: dict[str, Any], *,
                     uid: str = "") -> None: ...
    def record_event(
        self, obj: Mapping[str, Any], *, type: str, reason: str, message: str,
    ) -> None: ...


class Fetcher(Protocol):
    """``polls.SharedPoller``: an answer no older than ``max_age`` seconds, held for
    ``reader`` until ``release(reader)``; ``remembered``: those secrets, however old."""

    def fetch(
        self, *, api_url: str, project_id: str, environment_id: str, token: str,
        known_version: int | None, max_age: float = 0.0, reader: str | None = None,
    ) -> himitsu.FetchResult: ...
    def remembered(
        self, *, api_url: str, project_id: str, environment_id: str, token: str,
    ) -> himitsu.Fetched | None: ...
    def release(self, reader: str) -> None: ...
