"""The cluster and Himitsu as the checker sees them: rebuilt from records, one at a time.

Only what a user can see goes in: objects from watch events, Himitsu's data from the
user's own changes to it. ``expected`` renders a HimitsuSecret's target from that data
the way the contract describes the formats (KeyValue: one entry per key; Dotenv and Json
compared by meaning: the blob is parsed back).
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from collections.abc import Mapping, Set
from typing import Any

from .records import Acted, Watched, annotations_of, secret_data

Key = tuple[str, str]
DEFAULT_BLOB_KEYS = {"Dotenv": ".env", "Json": "config.json"}
FOREIGN_PREFIX = "FOREIGN_"
CONFIG_VERSION = "himitsu.io/config-version"
FORCE_SYNC = "himitsu.io/force-sync"


def spec(hsec: Mapping[str, Any]) -> Mapping[str, Any]:
    return hsec.get("spec") or {}


def target_name(hsec: Mapping[str, Any]) -> str:
    return str((spec(hsec).get("target") or {}).get("name", ""))


def policy(hsec: Mapping[str, Any]) -> str:
    return str((spec(hsec).get("target") or {}).get("creationPolicy", "Owner"))


def template(hsec: Mapping[str, Any]) -> tuple[str, str | None]:
    tpl = (spec(hsec).get("target") or {}).get("template") or {}
    fmt = str(tpl.get("format", "KeyValue"))
    return fmt, (None if fmt == "KeyValue" else str(tpl.get("key") or DEFAULT_BLOB_KEYS[fmt]))


def refresh_seconds(hsec: Mapping[str, Any]) -> float:
    text = str(spec(hsec).get("refreshInterval", "1m"))
    units = {"s": 1.0, "m": 60.0, "h": 3600.0}
    return float(text[:-1]) * units[text[-1]] if text != "0" else 0.0


def fingerprint(token: str) -> str:
    """As the stand-in names tokens in its request log."""
    return hashlib.sha256(token.encode()).hexdigest()[:16]


def parse_dotenv(text: str) -> dict[str, str] | None:
    found: dict[str, str] = {}
    for line in text.splitlines():
        key, eq, rest = line.partition("=")
        if not eq or len(rest) < 2 or rest[0] != '"' or rest[-1] != '"':
            return None
        found[key] = rest[1:-1].replace('\\"', '"').replace("\\\\", "\\")
    return found


def matches(hsec: Mapping[str, Any], data: Mapping[str, str],
            himitsu: Mapping[str, str]) -> str | None:
    """None when a target's ``data`` renders ``himitsu`` as ``hsec`` asks, else why not.

    Foreign keys (Merge) are left out of the comparison.
    """
    ours = {k: v for k, v in data.items() if not k.startswith(FOREIGN_PREFIX)}
    fmt, blob_key = template(hsec)
    if blob_key is None:
        if ours != dict(himitsu):
            missing = sorted(set(himitsu) - set(ours))
            extra = sorted(set(ours) - set(himitsu))
            stale = sorted(k for k in set(ours) & set(himitsu) if ours[k] != himitsu[k])
            return f"KeyValue data differs: missing {missing}, extra {extra}, stale {stale}"
        return None
    if set(ours) != {blob_key}:
        return f"{fmt} target holds keys {sorted(ours)}, expected only {blob_key!r}"
    text = ours[blob_key]
    parsed: Any
    if fmt == "Json":
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = None
    else:
        parsed = parse_dotenv(text)
    if parsed != dict(himitsu):
        return f"{fmt} blob {blob_key!r} does not read back as Himitsu's current data"
    return None


class World:
    """Objects by kind and (namespace, name); Himitsu's data by environment."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[Key, Mapping[str, Any]]] = defaultdict(dict)
        self.env_data: dict[str, dict[str, str]] = {}
        # per environment: (time, key names) after each change, for "was K ever absent"
        self.env_keys: dict[str, list[tuple[float, frozenset[str]]]] = defaultdict(list)
        self.targets: dict[Key, Key] = {}  # target Secret -> the live HimitsuSecret naming it

    # -- applying records ------------------------------------------------------------------
    def apply_watch(self, rec: Watched) -> Mapping[str, Any] | None:
        """Apply a watch event; the object as it was before (None if unknown)."""
        objects = self.objects[rec.kind]
        old = objects.get(rec.key)
        if rec.type == "DELETED":
            objects.pop(rec.key, None)
        else:
            objects[rec.key] = rec.obj
        if rec.kind == "HimitsuSecret":
            if old is not None:
                self.targets.pop((rec.namespace, target_name(old)), None)
            if rec.type != "DELETED":
                self.targets[(rec.namespace, target_name(rec.obj))] = rec.key
        return old

    def apply_act(self, act: Acted) -> None:
        if act.data is not None and act.environment:
            self.env_data[act.environment] = dict(act.data)
            self.env_keys[act.environment].append((act.time, frozenset(act.data)))

    # -- questions -------------------------------------------------------------------------
    def hsecs(self) -> dict[Key, Mapping[str, Any]]:
        return self.objects["HimitsuSecret"]

    def secret(self, key: Key) -> Mapping[str, Any] | None:
        return self.objects["Secret"].get(key)

    def environment(self, hsec: Mapping[str, Any]) -> str:
        return str(spec(hsec).get("environmentId", "")).lower()

    def token_fingerprint(self, hsec: Mapping[str, Any]) -> str | None:
        ref = spec(hsec).get("authSecretRef") or {}
        ns = str(hsec.get("metadata", {}).get("namespace", ""))
        token_secret = self.secret((ns, str(ref.get("name", ""))))
        if token_secret is None:
            return None
        token = secret_data(token_secret).get(str(ref.get("key", "token")))
        return fingerprint(token) if token else None

    def key_absent_since(self, environment: str, key: str, since: float) -> bool:
        """Whether Himitsu lacked ``key`` at some moment from ``since`` on (or just before)."""
        history = self.env_keys.get(environment, [])
        before = [keys for t, keys in history if t < since]
        if before and key not in before[-1]:
            return True
        return any(key not in keys for t, keys in history if t >= since)

    def unsafe_for_conditional(self, hsec: Mapping[str, Any], *,
                               user_rvs: Set[str] = frozenset()) -> str | None:
        """Why the contract calls a conditional request unsafe for ``hsec`` now, if it does
        (``user_rvs``: versions the user wrote; a target at one was edited by hand)."""
        meta, status = hsec.get("metadata", {}), hsec.get("status") or {}
        ns = str(meta.get("namespace", ""))
        target = self.secret((ns, target_name(hsec)))
        if target is None:
            return "its target missing"
        if str(target.get("metadata", {}).get("resourceVersion")) in user_rvs:
            return "its target edited by the user, not yet repaired"
        if str(annotations_of(target).get(CONFIG_VERSION)) != str(status.get("configVersion")):
            return "its target's config-version not the status's"
        if status.get("observedGeneration") != meta.get("generation"):
            return "a spec change not yet observed"
        force = (meta.get("annotations") or {}).get(FORCE_SYNC)
        if force is not None and force != status.get("lastForceSync"):
            return "a force-sync not yet honoured"
        return None

    def converged(self, key: Key) -> str | None:
        """None when the HimitsuSecret is Ready and its target renders Himitsu's data."""
        hsec = self.hsecs().get(key)
        if hsec is None:
            return None
        meta, status = hsec.get("metadata", {}), hsec.get("status") or {}
        ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"),
                     None)
        if ready is None or ready.get("status") != "True":
            reason = ready.get("reason") if ready else "no Ready condition"
            return f"Ready is not True ({reason})"
        if status.get("observedGeneration") != meta.get("generation"):
            return "status describes an older generation"
        target = self.secret((key[0], target_name(hsec)))
        if target is None:
            return "target Secret missing"
        wanted_type = str((spec(hsec).get("target") or {}).get("type", "Opaque"))
        if policy(hsec) == "Owner" and target.get("type", "Opaque") != wanted_type:
            return f"target type {target.get('type')} is not {wanted_type}"
        himitsu = self.env_data.get(self.environment(hsec))
        if himitsu is None:
            return "the checker knows no data for its environment"
        return matches(hsec, secret_data(target), himitsu)
