"""The Himitsu API client: one read (the runtime secrets endpoint), done safely.

The bottom layer beside ``runtime/``: it knows nothing of Kubernetes, of the reconcile
or of the controller runtime, so it can be tested (and reused) with ``responses`` alone.
``client`` holds the request and its typed errors, ``http`` the deadline-bounded
transport, ``wire`` the reading of answers (envelope, ETag, rate-limit headers).
"""

from himitsu_controller.himitsu.client import (
    OUTCOMES,
    TOKEN_PATTERN,
    USER_AGENT,
    BadRequest,
    Fetched,
    FetchResult,
    Forbidden,
    HimitsuClient,
    HimitsuError,
    InvalidInput,
    InvalidToken,
    NotFound,
    NotModified,
    Pacing,
    RateLimited,
    ServerError,
    TransportError,
    Unauthorized,
    Undecodable,
    UnexpectedStatus,
    pacing_key,
    source_fingerprint,
    validate_api_url,
    validate_token,
)

__all__ = [
    "OUTCOMES",
    "TOKEN_PATTERN",
    "USER_AGENT",
    "BadRequest",
    "FetchResult",
    "Fetched",
    "Forbidden",
    "HimitsuClient",
    "HimitsuError",
    "InvalidInput",
    "InvalidToken",
    "NotFound",
    "NotModified",
    "Pacing",
    "RateLimited",
    "ServerError",
    "TransportError",
    "Unauthorized",
    "Undecodable",
    "UnexpectedStatus",
    "pacing_key",
    "source_fingerprint",
    "validate_api_url",
    "validate_token",
]
