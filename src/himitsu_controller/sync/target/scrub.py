"""Redaction by content: no value we sent comes back in a refusal's message.

Every form of a value the write sent (base64, raw, Go-quoted, JSON-escaped, each line) is
replaced in a ``KubeError``, beside ``runtime.apierrors``' redaction by shape; forms
shorter than ``MIN_LENGTH`` are left alone (a value ``1`` would erase every digit).

Design: docs/design/targets.md
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from himitsu_controller.sync.ports import KubeError

__all__ = ["MIN_LENGTH", "REDACTED", "forms_of", "redacting", "scrub"]

MIN_LENGTH = 4
REDACTED = "[redacted]"
_LINE_MIN = 8  # a line of a multi-line value (a PEM block's), quoted on its own


def forms_of(encoded_values: Iterable[str]) -> list[str]:
    """Every way a value of ``data`` (base64) may be written in a message, longest first."""
    forms: set[str] = set()
    for encoded in encoded_values:
        forms.add(encoded)
        try:
            raw = base64.b64decode(encoded, validate=True).decode("utf-8", errors="replace")
        except (binascii.Error, ValueError):
            continue
        forms.update((raw, _go_quoted(raw), json.dumps(raw)[1:-1],
                      json.dumps(raw, ensure_ascii=False)[1:-1]))
        forms.update(line.strip() for line in raw.splitlines()
                     if len(line.strip()) >= _LINE_MIN)
    return sorted((f for f in forms if len(f) >= MIN_LENGTH), key=len, reverse=True)


def scrub(text: str, forms: list[str]) -> str:
    """``text`` with each of ``forms`` (from ``forms_of``) replaced by ``[redacted]``."""
    if not forms:
        return text
    return re.sub("|".join(map(re.escape, forms)), REDACTED, text)


@contextmanager
def redacting(encoded_values: Iterable[str]) -> Iterator[None]:
    """Re-raise a KubeError (a Conflict stays a Conflict) with the values scrubbed."""
    try:
        yield
    except KubeError as exc:
        text = scrub(str(exc), forms_of(encoded_values))
        raise type(exc)(text, status=exc.status, reason=exc.reason) from None


_GO_ESCAPES = {"\a": r"\a", "\b": r"\b", "\f": r"\f", "\n": r"\n", "\r": r"\r",
               "\t": r"\t", "\v": r"\v", '"': r"\"", "\\": r"\\"}


def _go_quoted(text: str) -> str:
    """What Go's ``%q`` prints between the quotes (``strconv.Quote``)."""
    out = []
    for ch in text:
        if ch in _GO_ESCAPES:
            out.append(_GO_ESCAPES[ch])
        elif ch.isprintable():
            out.append(ch)
        elif ord(ch) < 0x80:
            out.append(f"\\x{ord(ch):02x}")
        elif ord(ch) < 0x10000:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(f"\\U{ord(ch):08x}")
    return "".join(out)
