"""Which Secrets a workload's pods read: the pod template's references, by name.

A restart is only worth its disruption when the pods read the Secret whose data changed,
so before restarting a workload the operator looks for the Secret in every place a pod
template can name one for its containers to read: ``envFrom[].secretRef``,
``env[].valueFrom.secretKeyRef`` (containers and init containers alike), ``volumes[].secret``
and a projected volume's ``sources[].secret``. ``imagePullSecrets`` are not read by the
application and do not count. Pure functions over the raw workload dict.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["secrets_read"]


def secrets_read(workload: Mapping[str, Any]) -> set[str]:
    """Names of the Secrets the pods of ``workload`` (apps/v1) read."""
    template = _map(_map(workload.get("spec")).get("template"))
    pod = _map(template.get("spec"))
    names: set[str] = set()
    for container in _containers(pod):
        for source in _list(container.get("envFrom")):
            names.add(str(_map(_map(source).get("secretRef")).get("name") or ""))
        for var in _list(container.get("env")):
            ref = _map(_map(_map(var).get("valueFrom")).get("secretKeyRef"))
            names.add(str(ref.get("name") or ""))
    for volume in _list(pod.get("volumes")):
        vol = _map(volume)
        names.add(str(_map(vol.get("secret")).get("secretName") or ""))
        for source in _list(_map(vol.get("projected")).get("sources")):
            names.add(str(_map(_map(source).get("secret")).get("name") or ""))
    names.discard("")
    return names


def _containers(pod: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    for field in ("initContainers", "containers"):
        for container in _list(pod.get(field)):
            yield _map(container)


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
