"""Logs as one JSON object per line on stderr, for the coordinator and the agents alike."""

from __future__ import annotations

import json
import logging
import sys
import time


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        msg = record.getMessage()
        out = {"ts": round(time.time(), 3), "level": record.levelname, "logger": record.name}
        try:
            parsed = json.loads(msg)
            out.update(parsed if isinstance(parsed, dict) else {"msg": msg})
        except ValueError:
            out["msg"] = msg
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out)


def setup_logging(level: str = "INFO") -> None:
    h = logging.StreamHandler(sys.stderr)
    h.setFormatter(JsonFormatter())
    root = logging.getLogger("xclp")
    root.handlers[:] = [h]
    root.setLevel(level)
    root.propagate = False
