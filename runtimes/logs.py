"""Logging setup from MBUILD_LOG_LEVEL and MBUILD_LOG_FORMAT (text or json)."""

from __future__ import annotations

import json
import logging
import time

from runtimes.settings import Settings


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + "Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.name == "mbuild.access" and isinstance(record.args, tuple) and len(record.args) == 5:
            method, path, status, ms, rid = record.args
            entry.update(method=method, path=path, status=status, ms=round(float(str(ms)), 1), request_id=rid)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def configure_logging(settings: Settings) -> None:
    level = settings.log_level.upper()
    handler = logging.StreamHandler()
    if settings.log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger = logging.getLogger("mbuild")
    logger.handlers[:] = [handler]
    logger.setLevel(level if level in logging.getLevelNamesMapping() else "INFO")
    logger.propagate = False
