"""May a HimitsuSecret restart a workload: the Secrets its pods read, or its owner's consent.

A restart is only worth its disruption when the pods read the Secret whose data changed,
so before restarting a workload the operator looks for the Secret in every place a pod
template can name one for its containers to read: ``envFrom[].secretRef``,
``env[].valueFrom.secretKeyRef`` (containers and init containers alike), and a
``secret`` volume or a projected volume's ``sources[].secret`` that some container (or
init container) mounts: a volume no container mounts reaches no process.
``imagePullSecrets`` are not read by the application and do not count.

Any other workload is restarted only with its owner's consent, given on the workload
itself (``himitsu.io/allow-restart-by`` in its metadata: HimitsuSecret names, comma
separated, or ``*``): whoever may create a HimitsuSecret must not be able to restart
every workload of the namespace by naming it (a confused deputy). Pure functions over
the raw workload dict.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from himitsu_controller import api

__all__ = ["allows_restart_by", "secrets_read"]


def secrets_read(workload: Mapping[str, Any]) -> set[str]:
    """Names of the Secrets the pods of ``workload`` (apps/v1) read."""
    template = _map(_map(workload.get("spec")).get("template"))
    pod = _map(template.get("spec"))
    names: set[str] = set()
    mounted: set[str] = set()
    for container in _containers(pod):
        for source in _list(container.get("envFrom")):
            names.add(str(_map(_map(source).get("secretRef")).get("name") or ""))
        for var in _list(container.get("env")):
            ref = _map(_map(_map(var).get("valueFrom")).get("secretKeyRef"))
            names.add(str(ref.get("name") or ""))
        mounted.update(str(_map(m).get("name") or "") for m in _list(container.get("volumeMounts")))
    for volume in _list(pod.get("volumes")):
        vol = _map(volume)
        if str(vol.get("name") or "") not in mounted:
            continue
        names.add(str(_map(vol.get("secret")).get("secretName") or ""))
        for source in _list(_map(vol.get("projected")).get("sources")):
            names.add(str(_map(_map(source).get("secret")).get("name") or ""))
    names.discard("")
    return names


def allows_restart_by(workload: Mapping[str, Any], himitsu_secret: str) -> bool:
    """The workload's owner lets HimitsuSecret ``himitsu_secret`` (of its namespace)
    restart it whatever its pods read: ``himitsu.io/allow-restart-by`` names it, or is ``*``."""
    annotations = _map(_map(workload.get("metadata")).get("annotations"))
    raw = annotations.get(api.ANN_ALLOW_RESTART_BY)
    allowed = {part.strip() for part in raw.split(",")} if isinstance(raw, str) else set()
    return "*" in allowed or himitsu_secret in allowed


def _containers(pod: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    for field in ("initContainers", "containers"):
        for container in _list(pod.get(field)):
            yield _map(container)


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
