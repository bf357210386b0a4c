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


class StderrHandler(logging.StreamHandler):
    """A handler that writes to sys.stderr as it is when a record comes, not as it was when the handler was
    made (as logging's own last-resort handler does): a command whose stderr is replaced later — a
    test's captured stream, closed when the test ends — is never left writing to a closed file, which
    printed "--- Logging error ---" tracebacks into the next command's output."""

    def __init__(self):
        super().__init__()

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value):  # (StreamHandler.__init__ assigns one; the current sys.stderr is always used)
        pass


def setup_logging(level: str = "INFO") -> None:
    h = StderrHandler()
    h.setFormatter(JsonFormatter())
    root = logging.getLogger("xclp")
    root.handlers[:] = [h]
    root.setLevel(level)
    root.propagate = False
