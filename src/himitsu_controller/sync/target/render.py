"""Render a Himitsu environment into the ``data`` of a Kubernetes Secret.

* Pure and deterministic; what cannot be represented faithfully fails before any write.
* ``KeyValue``, ``Dotenv`` (python-dotenv's escapes), ``Json``; errors name keys only.

Design: docs/design/targets.md
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterable, Mapping

from himitsu_controller.api import data_hash

__all__ = ["FORMATS", "MAX_SECRET_BYTES", "RenderError", "data_hash", "data_size",
           "default_key", "quote", "render", "valid_data_key"]

# Kubernetes' MaxSecretSize: the apiserver sums the decoded length of every value (keys
# are not counted) and refuses the Secret when the total is strictly greater.
MAX_SECRET_BYTES = 1024 * 1024

FORMATS = ("KeyValue", "Dotenv", "Json")
_DEFAULT_KEYS: dict[str, str | None] = {"KeyValue": None, "Dotenv": ".env", "Json": "config.json"}

# apimachinery's IsConfigMapKey, which Secret validation uses.
_DATA_KEY_RE = re.compile(r"[-._a-zA-Z0-9]+")
_DATA_KEY_MAX = 253  # DNS1123SubdomainMaxLength

# Characters that change how a dotenv line parses in a key (whitespace and control
# characters are refused by str.isprintable() below).
_DOTENV_KEY_FORBIDDEN = frozenset("=#'\"\\`")
_DOTENV_ESCAPES = str.maketrans({"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r"})

_NAMED_KEYS = 3  # how many offending keys an error message names
_KEY_PREVIEW = 64  # characters of a key shown in an error message


class RenderError(ValueError):
    """The secrets cannot be rendered faithfully: the message names keys (never values)
    and says what to do; ``keys``: the offending ones (empty for size or format errors)."""

    def __init__(self, message: str, *, keys: Iterable[str] = ()) -> None:
        super().__init__(message)
        self.keys: tuple[str, ...] = tuple(keys)


def default_key(fmt: str) -> str | None:
    """The data key a single-blob format writes to when the spec names none."""
    _check_format(fmt)
    return _DEFAULT_KEYS[fmt]


def valid_data_key(k: str) -> bool:
    """Whether Kubernetes accepts ``k`` as a Secret (or ConfigMap) data key."""
    return (
        0 < len(k) <= _DATA_KEY_MAX
        and _DATA_KEY_RE.fullmatch(k) is not None
        and k not in (".", "..")
        and not k.startswith("..")
    )


def render(fmt: str, secrets: Mapping[str, str], *, key: str | None = None) -> dict[str, str]:
    """``secrets`` as Secret ``data`` (base64 of UTF-8); ``key``: Dotenv's and Json's data
    key. RenderError when it would not read back as ``secrets`` or is over 1 MiB."""
    _check_format(fmt)
    encoded = _encode_all(secrets)
    raw: dict[str, bytes]
    if fmt == "KeyValue":
        _raise_for((k for k in secrets if not valid_data_key(k)),
                   f"cannot be a Kubernetes Secret data key ({_DATA_KEY_RULE}); "
                   "use template format Dotenv or Json for such keys")
        raw = encoded
    else:
        blob_key = key if key is not None else _DEFAULT_KEYS[fmt]
        assert blob_key is not None  # every single-blob format has a default
        if not valid_data_key(blob_key):
            raise RenderError(
                f"template key {quote(blob_key)} is not a valid Kubernetes Secret data key "
                f"({_DATA_KEY_RULE}); set target.template.key to a valid one",
                keys=[blob_key],
            )
        text = _render_dotenv(secrets) if fmt == "Dotenv" else _render_json(secrets)
        raw = {blob_key: text.encode("utf-8")}
    size = sum(len(v) for v in raw.values())
    if size > MAX_SECRET_BYTES:
        raise RenderError(
            f"rendered Secret data is {size} bytes, over the 1 MiB ({MAX_SECRET_BYTES} bytes) "
            "Kubernetes Secret limit; move some secrets out of this Himitsu environment"
        )
    return {k: base64.b64encode(v).decode("ascii") for k, v in sorted(raw.items())}


def data_size(data: Mapping[str, str]) -> int:
    """Total decoded byte size of Secret ``data``, as the apiserver counts it."""
    return sum(len(base64.b64decode(v, validate=True)) for v in data.values())


_DATA_KEY_RULE = (
    "only A-Z a-z 0-9 . _ - are allowed, at most 253 characters, not '.' or '..' "
    "and not starting with '..'"
)


def _check_format(fmt: str) -> None:
    if fmt not in _DEFAULT_KEYS:
        raise RenderError(f"unknown template format {quote(fmt)}; use KeyValue, Dotenv or Json")


def quote(key: str) -> str:
    """repr() of a key, truncated: safe to put in a status message whatever it holds."""
    return repr(key[:_KEY_PREVIEW]) + ("..." if len(key) > _KEY_PREVIEW else "")


def _raise_for(bad: Iterable[str], problem: str) -> None:
    """RenderError naming the first few offending keys, in sorted order, and how many."""
    ordered = sorted(bad)
    if ordered:
        named = ", ".join(quote(k) for k in ordered[:_NAMED_KEYS])
        if len(ordered) > _NAMED_KEYS:
            named += f" and {len(ordered) - _NAMED_KEYS} more"
        noun = "key" if len(ordered) == 1 else f"{len(ordered)} keys"
        raise RenderError(f"{noun} {named}: {problem}", keys=ordered)


def _encode_all(secrets: Mapping[str, str]) -> dict[str, bytes]:
    """UTF-8 of every value; a lone surrogate refused outside any ``except`` (a chained
    UnicodeEncodeError would quote the text)."""
    _raise_for(
        (k for k, v in secrets.items() if _utf8(k) is None or _utf8(v) is None),
        "key or value is not valid Unicode text (contains a lone surrogate) and "
        "cannot be stored; fix the secret in Himitsu",
    )
    return {k: v.encode("utf-8") for k, v in secrets.items()}


def _utf8(text: str) -> bytes | None:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return None


def _valid_dotenv_key(k: str) -> bool:
    # isprintable(): no whitespace but ' ' (which would end the key), no control characters.
    return bool(k) and k.isprintable() and " " not in k and _DOTENV_KEY_FORBIDDEN.isdisjoint(k)


def _render_dotenv(secrets: Mapping[str, str]) -> str:
    _raise_for(
        (k for k in secrets if not _valid_dotenv_key(k)),
        "cannot be written as a dotenv key (no whitespace, control characters, "
        "= # quotes ` or backslash); use template format Json for such keys",
    )
    # No environment variable can hold NUL (execve takes C strings); load_dotenv raises.
    _raise_for(
        (k for k, v in secrets.items() if "\0" in v),
        "value contains a NUL character, which no environment variable can hold; "
        "use template format Json or KeyValue",
    )
    return "".join(f'{k}="{secrets[k].translate(_DOTENV_ESCAPES)}"\n' for k in sorted(secrets))


def _render_json(secrets: Mapping[str, str]) -> str:
    # Indented: a config file people read and diff (docs/design/targets.md).
    return json.dumps(dict(secrets), sort_keys=True, ensure_ascii=False, indent=2)
