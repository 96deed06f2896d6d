"""structlog set-up: JSON lines for log pipelines by default, a console renderer for humans.

Every module logs through ``structlog.get_logger``; this is the one place that decides
how a line looks. Standard-library loggers (urllib3, kubernetes) are routed through the
same renderer so a deployment gets one format, and they are held at WARNING because
their debug output can include request headers.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog

LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("json", "console")


def configure(*, level: str = "info", fmt: str = "json", stream: Any = None) -> None:
    """Configure structlog and the standard library logging for the whole process."""
    numeric = getattr(logging, level.upper())
    out = stream if stream is not None else sys.stderr
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: Any
    if fmt == "console":
        renderer = structlog.dev.ConsoleRenderer(colors=out.isatty())
    else:
        renderer = structlog.processors.JSONRenderer(sort_keys=True)
    structlog.configure(
        processors=[
            *shared,
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=out),
        cache_logger_on_first_use=False,
    )
    handler = logging.StreamHandler(out)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=shared, processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer,
            ],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(max(numeric, logging.WARNING))
