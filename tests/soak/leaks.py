"""Rule: no token or secret value in any log, Event, status or metric.

Every value the user driver puts in Himitsu carries the marker CANARY (key names never
do) and every token has Himitsu's format; both are also known one by one (``issued``).
Texts are the operators' logs and metrics scrapes; Events and HimitsuSecret statuses come
from the watches. A hit names the source and which issued secret it was, never quoting it.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterable

from .records import Text, Violation, Watched

MARKER = "CANARY"
TOKEN_RE = re.compile(r"himi_[0-9a-f]{16}_[A-Za-z0-9_-]{43}")
_MARKERS = (MARKER, base64.b64encode(MARKER.encode()).decode()[:8])


def find(text: str, issued: frozenset[str]) -> list[str]:
    """What in ``text`` looks like a leak (descriptions, not the secrets themselves)."""
    hits = [f"the marker {m!r}" for m in _MARKERS if m in text]
    if TOKEN_RE.search(text):
        hits.append("a token in Himitsu's format")
    if hits or not issued:
        return hits
    for secret in issued:
        if secret in text or base64.b64encode(secret.encode()).decode() in text:
            hits.append(f"an issued secret of {len(secret)} characters")
            break
    return hits


def check(texts: Iterable[Text], watched: Iterable[Watched],
          issued: frozenset[str]) -> list[Violation]:
    found: list[Violation] = []
    for text in texts:
        for hit in find(text.text, issued):
            found.append(Violation("leak", text.time, (text.source,), f"{hit} in {text.source}"))
    for rec in watched:
        if rec.kind == "Event":
            body = json.dumps({k: rec.obj.get(k) for k in ("message", "note", "reason")})
        elif rec.kind == "HimitsuSecret":
            body = json.dumps(rec.obj.get("status") or {})
        else:
            continue
        for hit in find(body, issued):
            found.append(Violation("leak", rec.time, (f"{rec.kind} {rec.namespace}/{rec.name}",),
                                   f"{hit} in its {'status' if rec.kind != 'Event' else 'text'}"))
    return found
