"""Logging set-up for the CLI: plain lines for people, one JSON object per line for pipelines.

Library code logs through ``logging`` with structured fields in ``extra={"event": …}``;
the JSON formatter turns each record into ``{"time", "level", "event", "message", …fields}``.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

PER_SHARD_EVENTS = frozenset({"shard_done", "shard_reused"})
_RESERVED = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per record; structured ``extra`` fields are kept as keys."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "event": getattr(record, "event", "log"),
            "message": record.getMessage(),
        }
        for key, value in extra_fields(record).items():
            if key not in out:
                out[key] = value
        return json.dumps(out, default=str, sort_keys=False)


#: Names a record's structured fields may not take (the record's own attributes).
RESERVED_FIELDS = frozenset(_RESERVED)


def extra_fields(record: logging.LogRecord) -> dict[str, Any]:
    """A record's structured fields: what the call passed in ``extra`` (``event`` and the rest)."""
    return {key: value for key, value in record.__dict__.items() if key not in _RESERVED}


def setup(*, quiet: bool = False, verbose: bool = False, json_lines: bool = False) -> None:
    """Route the ``shardkit`` logger to stderr at the chosen level and format."""
    level = logging.WARNING if quiet else logging.DEBUG if verbose else logging.INFO
    handler = logging.StreamHandler(sys.stderr)
    if json_lines:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(levelname)s %(message)s" if verbose else "%(message)s"))
        if not verbose:  # people get a progress bar; per-shard lines are for pipelines (json) or -v
            handler.addFilter(lambda r: getattr(r, "event", None) not in PER_SHARD_EVENTS)
    root = logging.getLogger("shardkit")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = True  # harmless for the CLI (the root logger has no handler); keeps caplog working
