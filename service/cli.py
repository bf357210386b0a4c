"""`xclp coordinator serve`: run the coordinator (uvicorn) on a database."""

from __future__ import annotations

import json
import logging
import os
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


def serve(host: str, port: int, database: str, admin_token: str | None, max_body_mb: int = 1024,
          deadlines: dict | None = None, blob_dir: str | None = None) -> None:
    import uvicorn

    from service.app import Settings, create_app

    token = admin_token or os.environ.get("XCLP_ADMIN_TOKEN", "")
    setup_logging(os.environ.get("XCLP_LOG_LEVEL", "INFO"))
    settings = Settings(database=database, admin_token=token, max_body_bytes=max_body_mb << 20, blob_dir=blob_dir)
    if deadlines:
        settings.default_deadlines.update(deadlines)
    app = create_app(settings)
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)
