"""Canary secret values and tokens, and the scan that proves none of them leaked.

Why: "never a token or secret value in a log line, an Event or a status message" is a
promise no unit test can keep for the whole program. Every value and token the suite
hands to the stand-in or puts in a Secret comes from here: each carries the marker
``CANARY`` and is remembered, so at session end the operator logs, every Event and every
HimitsuSecret status from the test namespaces are searched for the marker and for each
remembered value, raw and base64-encoded (the form Secret data travels in).

Key names are not secret (messages may name them), so they must never contain the marker.
"""

from __future__ import annotations

import base64
import json
import secrets
import string
import threading
from dataclasses import dataclass, field
from pathlib import Path

from .kubehelp import KubeApi, hsec_path

MARKER = "CANARY"
_B64URL = string.ascii_letters + string.digits + "-_"


def _b64url(n: int) -> str:
    return "".join(secrets.choice(_B64URL) for _ in range(n))


@dataclass
class Canary:
    """Hands out recognisable values and tokens; remembers every one of them."""

    _issued: set[str] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _remember(self, value: str) -> str:
        with self._lock:
            self._issued.add(value)
        return value

    def value(self, label: str = "v") -> str:
        """A secret value: ``CANARY-<label>-<random>``."""
        return self._remember(f"{MARKER}-{label}-{secrets.token_hex(6)}")

    def values(self, *keys: str) -> dict[str, str]:
        """``{key: value}`` with a fresh canary value for each key."""
        for key in keys:
            if MARKER in key:
                raise ValueError("key names are not secret; keep the marker out of them")
        return {key: self.value(key.lower()[:12]) for key in keys}

    def padded_value(self, label: str, size: int) -> str:
        """A secret value of ``size`` characters (a big payload), remembered whole, so
        the scan also knows its base64 form."""
        head = f"{MARKER}-{label}-{secrets.token_hex(6)}-"
        return self._remember(head + secrets.token_urlsafe(size)[:max(0, size - len(head))])

    def token(self) -> str:
        """A well-formed Himitsu token (``himi_<16 hex>_<43 base64url>``) with the marker."""
        body = MARKER + _b64url(43 - len(MARKER))
        return self._remember(f"himi_{secrets.token_hex(8)}_{body}")

    def malformed_token(self) -> str:
        """A token the operator must refuse locally (wrong shape), still a canary."""
        return self._remember(f"himi_{MARKER}_{_b64url(12)}")

    @property
    def issued(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._issued)

    def find_leaks(self, text: str) -> list[str]:
        """What in ``text`` betrays a canary: the marker, or a value raw or base64-encoded.

        Returns descriptions (a leaked value is shown only by a short prefix).
        """
        leaks = []
        if MARKER in text:
            at = text.index(MARKER)
            leaks.append(f"marker {MARKER!r} after: {text[max(0, at - 80):at]!r}")
        for value in self.issued:
            encoded = base64.b64encode(value.encode()).decode()
            if value in text or encoded in text:
                leaks.append(f"value {value[:14]}...")
        return leaks


@dataclass
class LeakEvidence:
    """Texts the operator produced (Events, statuses) and its log files, for the scan."""

    texts: list[tuple[str, str]] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)

    def collect_namespace(self, kube: KubeApi, namespace: str) -> None:
        events = kube.get(f"/api/v1/namespaces/{namespace}/events")["items"]
        self.texts.append((f"events in {namespace}", json.dumps(events)))
        hsecs = kube.get(hsec_path(namespace))["items"]
        statuses = {o["metadata"]["name"]: o.get("status") for o in hsecs}
        self.texts.append((f"HimitsuSecret statuses in {namespace}", json.dumps(statuses)))

    def scan(self, canary: Canary) -> list[str]:
        found: list[str] = []
        sources = [*self.texts,
                   *((f"log {p.name}", p.read_text(errors="replace")) for p in self.logs
                     if p.exists())]
        for source, text in sources:
            found.extend(f"{source}: {leak}" for leak in canary.find_leaks(text))
        return found
