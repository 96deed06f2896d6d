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
    raw = _at(workload, "metadata", "annotations", api.ANN_ALLOW_RESTART_BY)
    consent = {part.strip() for part in raw.split(",")} if isinstance(raw, str) else set()
    return secret in secrets_read(workload) or "*" in consent or holder in consent


def secrets_read(workload: Mapping[str, Any]) -> set[str]:
    """Names of the Secrets the pods of ``workload`` (apps/v1) read."""
    pod = _at(workload, "spec", "template", "spec")
    containers = [c for f in ("initContainers", "containers") for c in _list(_at(pod, f))]
    mounted = {_at(m, "name") for c in containers for m in _list(_at(c, "volumeMounts"))}
    names = {_at(s, "secretRef", "name") for c in containers for s in _list(_at(c, "envFrom"))}
    names |= {_at(v, "valueFrom", "secretKeyRef", "name")
              for c in containers for v in _list(_at(c, "env"))}
    for volume in (v for v in _list(_at(pod, "volumes")) if _at(v, "name") in mounted):
        names.add(_at(volume, "secret", "secretName"))
        names |= {_at(s, "secret", "name") for s in _list(_at(volume, "projected", "sources"))}
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


def _at(value: Any, *path: str) -> Any:
    """``value[path[0]][path[1]]...``, or None where a step is not a mapping."""
    for key in path:
        value = value.get(key) if isinstance(value, Mapping) else None
    return value


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
