"""Logging: structlog, JSON lines (orjson) in production, readable lines on a terminal.

Every line about a session carries its name (``session=``); lines about a run
carry ``run=`` too.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import orjson
import structlog
import structlog.tracebacks

LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


def configure(fmt: str = "auto", level: str = "info") -> None:
    as_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if as_json:
        # Tracebacks without the frames' locals: a local may be a secret (a web
        # login's token, a run's token, a request's query) and this log is read by
        # more people than the state dir (the journal).
        tracebacks = structlog.tracebacks.ExceptionDictTransformer(show_locals=False)
        processors += [
            structlog.processors.ExceptionRenderer(tracebacks),
            structlog.processors.JSONRenderer(serializer=orjson.dumps),
        ]
        factory: Any = structlog.BytesLoggerFactory(file=sys.stderr.buffer)
    else:
        processors.append(
            structlog.dev.ConsoleRenderer(
                colors=sys.stderr.isatty(), exception_formatter=structlog.dev.plain_traceback
            )
        )
        factory = structlog.PrintLoggerFactory(file=sys.stderr)
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(LEVELS[level]),
        logger_factory=factory,
        cache_logger_on_first_use=True,
    )
