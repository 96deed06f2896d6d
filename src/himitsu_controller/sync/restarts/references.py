"""May a HimitsuSecret restart a workload: its pods read the target (``envFrom``, ``env``,
a mounted ``secret`` or projected volume), or its owner consents with the annotation
``himitsu.io/allow-restart-by`` (names, or ``*``). Why: docs/design/restarts.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from himitsu_controller import api

__all__ = ["allowed", "refused", "secrets_read", "unreferenced"]


def allowed(workload: Mapping[str, Any], holder: str, secret: str) -> bool:
    """HimitsuSecret ``holder``, whose target is ``secret``, may restart ``workload``."""
    raw = _map(_map(workload.get("metadata")).get("annotations")).get(api.ANN_ALLOW_RESTART_BY)
    consent = {part.strip() for part in raw.split(",")} if isinstance(raw, str) else set()
    return secret in secrets_read(workload) or "*" in consent or holder in consent


def secrets_read(workload: Mapping[str, Any]) -> set[str]:
    """Names of the Secrets the pods of ``workload`` (apps/v1) read."""
    pod = _map(_map(_map(workload.get("spec")).get("template")).get("spec"))
    containers = [_map(c) for f in ("initContainers", "containers") for c in _list(pod.get(f))]
    mounted = {_map(m).get("name") for c in containers for m in _list(c.get("volumeMounts"))}
    names = {_map(_map(s).get("secretRef")).get("name")
             for c in containers for s in _list(c.get("envFrom"))}
    names |= {_map(_map(_map(v).get("valueFrom")).get("secretKeyRef")).get("name")
              for c in containers for v in _list(c.get("env"))}
    for volume in (v for v in map(_map, _list(pod.get("volumes"))) if v.get("name") in mounted):
        names.add(_map(volume.get("secret")).get("secretName"))
        names |= {_map(_map(s).get("secret")).get("name")
                  for s in _list(_map(volume.get("projected")).get("sources"))}
    return {str(n) for n in names if n}


def unreferenced(kind: str, name: str, secret: str, holder: str) -> str:
    return (f"{kind} {name!r} does not read Secret {secret!r} (no envFrom, env valueFrom, "
            "or mounted secret or projected volume names it): not restarted; its owner may "
            f"allow it with the annotation {api.ANN_ALLOW_RESTART_BY}={holder} (or *) on "
            "the workload")


def refused(kind: str, name: str, exc: Exception, recorded: bool) -> str:
    """A failed read or patch, said as ``restarting`` once the workload's record landed,
    as ``recording`` before; a 403 is almost always an install without the RBAC."""
    text, doing = str(exc), "restarting" if recorded else "recording"
    if text.startswith("restarting"):
        text = doing + text.removeprefix("restarting")
    elif recorded or not text.startswith("reading"):
        text = f"{doing} {kind} {name!r} failed: {text}"
    if getattr(exc, "status", 0) == 403:
        text += (f"; rollout restarts need get and patch on {kind}s, which this install "
                 "may not grant: enable them (Helm: --set rolloutRestarts.enabled=true; "
                 "kubectl/kustomize: deploy/components/rollout-restarts), or remove "
                 f"{kind} {name!r} from rolloutRestartTargets")
    return text


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
